"""The kernel: pure types and rules every layer shares, and the settings."""
