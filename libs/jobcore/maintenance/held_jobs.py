"""Held jobs published again: one round of what the gate releaser does (jobcore.kernel.gates).

Shared by the gate releaser (jobcore.maintenance.gate_releaser, under the maintenance lease)
and the testing kit's InlineWorker (which has no releaser running beside it).
"""

from __future__ import annotations

from collections.abc import Sequence

from psycopg.rows import DictRow

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import UnitOfWork
from jobcore.database.store import JobReleaseHeldParams, job_store
from jobcore.execution.job_messages import message_columns, next_attempt_message
from jobcore.kernel.channels import OUTBOX_CHANNEL

# How far ahead a rate-limited key's held jobs are released (each due at its token's
# time): a second's worth, so a fast key is not bounded by the round interval.
RATE_HORIZON = 1.0


async def release_held(
    uow: UnitOfWork, topology: Topology, *, limit: int
) -> tuple[int, Sequence[DictRow]]:
    """Lock up to ``limit`` held jobs whose gate may let them start and write a message for
    each one's unused attempt, in ``uow`` (the caller commits): how many it locked, and
    the released jobs."""
    releasable = await job_store.lock_releasable(uow, {"limit": limit, "horizon": RATE_HORIZON})
    if not releasable:
        return 0, []
    released = await job_store.release_held(uow, _release_params(topology, releasable))
    return len(releasable), released


def _release_params(topology: Topology, rows: list[DictRow]) -> JobReleaseHeldParams:
    messages = [next_attempt_message(topology, row) for row in rows]
    return {
        **message_columns(messages),
        "ids": [row["id"] for row in rows],
        "attempts": [row["attempts"] + 1 for row in rows],
        "available_at": [row["due_at"] for row in rows],
        "channel": OUTBOX_CHANNEL,
    }
