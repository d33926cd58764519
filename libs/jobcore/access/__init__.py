"""Access: who may call, and what they did.

- :mod:`.apikeys`: API keys (random, shown once, stored as a hash) and the lookup every
  request makes;
- :mod:`.audit`: the audit log, written in the same transaction as each admin action.
"""
