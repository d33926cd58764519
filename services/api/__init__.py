"""The jobcore api service."""
