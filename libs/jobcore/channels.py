"""The PostgreSQL NOTIFY channels that more than one module names.

A leaf module (it imports nothing of jobcore's), so the statements and the code that
sends or listens can share a name without importing each other.
"""

from __future__ import annotations

# An outbox row is due: the relays wake (sent by enqueue, requeue and the sweeper).
OUTBOX_CHANNEL = "jobcore_outbox"
