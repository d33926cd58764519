"""The jobcore worker service."""
