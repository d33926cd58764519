"""Dead-letter use cases: look at the poison messages, and replay them to their job queue.

On the broker alone (the dead-letter queue), so they take the settings, not the database.
"""

from __future__ import annotations

from jobcore.amqp.deadletters import DeadLetter, DeadLetterQueue, ReplayReport
from jobcore.settings import Settings


async def list_dead_letters(settings: Settings, *, limit: int) -> list[DeadLetter]:
    """Dead-lettered messages, without removing them (each goes back to the tail)."""
    return await DeadLetterQueue(settings).peek(limit)


async def replay_dead_letters(settings: Settings, *, limit: int) -> ReplayReport:
    """Publish dead letters back to their job queue; each leaves the DLQ once confirmed."""
    return await DeadLetterQueue(settings).replay(limit)
