"""Anti-entropy: no accepted job is stranded by a vanished message (docs/design.md, 11).

A pending job waits for its message. The message can vanish without the database
hearing of it: RabbitMQ dead-letters it at the queue's delivery limit after repeated
requeues, an operator purges or deletes the queue, the broker loses its data. Two use
cases cover that, called by the worker's sweeper and dead-letter notes services and by
`jobcore jobs republish-stale` (:func:`jobcore.usecases.jobs.republish_stale_jobs`):

- :func:`republish_stale` publishes the current attempt of every *stale* pending job
  again, through the outbox (so it survives a broker outage like any message). Stale:
  due, no outbox row of its own waiting, and no change for the staleness
  (``JOBCORE_SWEEPER_STALE_AFTER``). The database cannot tell a vanished message from a
  slow one, so a job in a backlog older than the staleness gets a spare copy: harmless,
  since the copy carries the same attempt number and the claim's fence
  (``attempts + 1 = attempt``, ``status = 'pending'``) and the inbox let one message run
  the attempt, but it costs a delivery. So each further republish of a job waits twice as
  long as the one before (up to :data:`MAX_DOUBLINGS` doublings): a job costs at most a
  handful of copies however long a backlog lasts, and one that can never be delivered
  (a job type no worker knows) adds to the dead-letter queue at most once per
  2^MAX_DOUBLINGS stalenesses.
- :func:`note_dead_letter` notes on a job that the broker dead-lettered its current
  attempt's message (``message_note``), so operators see why it waits.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from jobcore.amqp.deadletters import DeadLetter
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Session, UnitOfWork
from jobcore.database.store import JobRepublishStaleParams, job_store
from jobcore.execution.job_messages import message_columns, next_attempt_message
from jobcore.kernel.channels import OUTBOX_CHANNEL

# 2^5: with the default staleness of an hour, a job's sixth and later republishes are 32
# hours apart.
MAX_DOUBLINGS = 5

# Dead-letter reasons (RabbitMQ's x-death "reason"). `rejected` is our own workers'
# doing (a poison message, rejected without requeue): they note and count it themselves.
REJECTED_BY_A_WORKER = "rejected"


@dataclass(frozen=True, slots=True)
class Republished:
    job_id: uuid.UUID
    attempt: int
    # `stale`, or `dead_lettered` when the job's note said the broker dead-lettered the
    # message of this attempt.
    reason: str
    # How many times the job has been republished, this time included.
    count: int


async def republish_stale(
    uow: UnitOfWork, topology: Topology, *, stale_after: float, limit: int
) -> tuple[int, list[Republished]]:
    """Republish up to ``limit`` stale pending jobs in ``uow`` (the caller commits).

    Returns how many candidates were locked (``limit`` of them: look again) and the jobs
    republished.
    """
    locked = await job_store.lock_stale(
        uow, {"stale_after": stale_after, "max_doublings": MAX_DOUBLINGS, "limit": limit}
    )
    if not locked:
        return 0, []
    messages = [next_attempt_message(topology, row) for row in locked]
    params: JobRepublishStaleParams = {
        **message_columns(messages),
        "ids": [row["id"] for row in locked],
        "attempts": [row["attempts"] + 1 for row in locked],
        "reasons": [row["reason"] for row in locked],
        "silent": [row["silent_seconds"] for row in locked],
        "channel": OUTBOX_CHANNEL,
    }
    rows = await job_store.republish_stale(uow, params)
    return len(locked), [
        Republished(row["id"], row["attempt"], row["reason"], row["republish_count"])
        for row in rows
    ]


async def note_dead_letter(session: Session, letter: DeadLetter) -> bool:
    """Note on its job that the broker dead-lettered ``letter``; True if a job took the note
    (it is pending and the letter is its current attempt's message)."""
    if letter.job_id is None or letter.attempt is None or letter.message_type is None:
        return False
    # A type with a NUL names no job (every job's type is a registered name), and the
    # driver refuses to send it: the statement would fail, and the copy be dropped uncounted.
    if "\x00" in letter.message_type:
        return False
    row = await job_store.note_dead_letter(
        session,
        {
            "job_id": uuid.UUID(letter.job_id),
            "type": letter.message_type,
            "attempt": letter.attempt,
            "reason": _storable(letter.reason),
            "queue": _storable(letter.queue),
            "message_id": _storable(letter.message_id),
            "dead_lettered_at": _storable(letter.dead_lettered_at),
        },
    )
    return row is not None


def _storable(text: str | None) -> str | None:
    """``text`` as PostgreSQL text can hold it (no NUL): a dead letter's message id is
    whatever its publisher set, and so may be the headers its reason, queue and time are
    read from."""
    return None if text is None else text.replace("\x00", "\\x00")
