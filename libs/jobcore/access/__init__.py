"""Who may call: API keys; and what they did: the audit log."""
