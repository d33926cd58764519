"""The jobcore relay service."""
