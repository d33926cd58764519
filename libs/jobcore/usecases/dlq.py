"""Dead-letter use cases: look at the poison messages, and replay them to their job queue.

On the broker (the dead-letter queue); a replay is then recorded in the audit log, once
the broker confirmed what it took back (it is no database transaction to share).
"""

from __future__ import annotations

from jobcore.amqp.deadletters import DeadLetter, DeadLetterQueue, ReplayReport
from jobcore.audit import AuditAction, Entry, Target, check_actor, record_done
from jobcore.db import Database
from jobcore.settings import Settings

# Messages an audit entry of a replay lists one by one; the counts cover the rest.
AUDITED_MESSAGES = 100


async def count_dead_letters(settings: Settings) -> int:
    """How many messages wait in the dead-letter queue."""
    return await DeadLetterQueue(settings).depth()


async def list_dead_letters(settings: Settings, *, limit: int) -> list[DeadLetter]:
    """Dead-lettered messages, without removing them (each goes back to the tail)."""
    return await DeadLetterQueue(settings).peek(limit)


async def replay_dead_letters(
    db: Database, settings: Settings, *, limit: int, actor: str
) -> ReplayReport:
    """Publish dead letters back to their job queue; each leaves the DLQ once confirmed.
    What was replayed and skipped is audited after (ids and reasons, never a body)."""
    check_actor(actor)
    report = await DeadLetterQueue(settings).replay(limit)
    entry = Entry(actor, AuditAction.DLQ_REPLAY, Target("dead_letter_queue"))
    entry.details = {
        "limit": limit,
        "replayed": len(report.replayed),
        "skipped": len(report.skipped),
        "messages": [
            {"message_id": letter.message_id, "job_id": letter.job_id, "queue": letter.queue}
            for letter in report.replayed[:AUDITED_MESSAGES]
        ],
    }
    await record_done(db, entry)
    return report
