"""Job types jobcore ships as examples."""
