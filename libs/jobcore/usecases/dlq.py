"""Dead-letter use cases: look at the poison messages, and replay them to their job queue
(the first so many, or one job's).

On the broker (the dead-letter queue); a replay is then recorded in the audit log, once
the broker confirmed what it took back (it is no database transaction to share).
"""

from __future__ import annotations

import uuid
from typing import Any

from jobcore.access.audit import (
    AuditAction,
    Entry,
    Target,
    check_actor,
    record_done,
    record_refused,
)
from jobcore.amqp.deadletters import DeadLetter, DeadLetterQueue
from jobcore.amqp.deadletters import ReplayReport as ReplayReport  # the callers name it
from jobcore.database.gateway import Database
from jobcore.database.store import job_store
from jobcore.kernel.errors import NoDeadLetter
from jobcore.kernel.settings import Settings

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
    entry.details = {"limit": limit, **_replayed(report)}
    await record_done(db, entry)
    return report


async def replay_job_dead_letters(
    db: Database, settings: Settings, job_id: uuid.UUID, *, actor: str
) -> ReplayReport:
    """Publish one job's dead letters back to its job queue, and only those: the others
    stay, in their order. Reads every message in the queue once (its depth in publishes,
    confirmed one by one). None of that job's there is a refusal, audited as one."""
    entry = Entry(check_actor(actor), AuditAction.DLQ_REPLAY_JOB, Target("job", str(job_id)))
    async with db.unit_of_work() as uow:
        # The job may have been pruned since: its dead letter can still be replayed.
        job = await job_store.get_any_tenant(uow, {"id": job_id})
    entry.tenant = job["tenant"] if job is not None else None
    report = await DeadLetterQueue(settings).replay_job(str(job_id))
    if not report.replayed and not report.skipped:
        refusal = NoDeadLetter(f"no message of job {job_id} is in the dead-letter queue")
        await record_refused(db, entry, refusal)
        raise refusal
    entry.details = _replayed(report)
    await record_done(db, entry)
    return report


def _replayed(report: ReplayReport) -> dict[str, Any]:
    """What an audit entry says of a replay: ids and counts, never a body."""
    return {
        "replayed": len(report.replayed),
        "skipped": len(report.skipped),
        "messages": [
            {"message_id": letter.message_id, "job_id": letter.job_id, "queue": letter.queue}
            for letter in report.replayed[:AUDITED_MESSAGES]
        ],
    }
