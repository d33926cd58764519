"""``GET /jobs/{id}`` with an optional long-poll: ``?wait=30`` answers as soon as the job is
terminal, or when the wait ends, whichever comes first; ``&on=progress`` also answers as
soon as the job's progress differs from what the first read saw.

Unlike the other job routes this one does not take ``SessionDep``: that would hold a
pooled connection for the whole wait. It checks out a connection for each read instead:
before waiting (the caller is authenticated already, :mod:`services.api.auth`); after
waking, in one statement shared with the other waiters woken meanwhile. While it waits
it holds only an asyncio event (:mod:`services.api.waiters`).
"""

from __future__ import annotations

import asyncio
import uuid
from enum import StrEnum
from typing import Annotated, Any

from fastapi import Query, Request
from psycopg.rows import DictRow
from starlette.responses import Response

from jobcore.database.gateway import Database
from jobcore.kernel.errors import JobNotFound, ServiceStateError
from jobcore.kernel.states import is_terminal
from jobcore.usecases import reads
from jobcore.usecases.waiting import job_to_wait_for
from services.api import views
from services.api.auth import TenantDep
from services.api.deps import DbDep, StateDep
from services.api.longpolls import LongPollSlots
from services.api.waiters import JobWaiters

WaitQuery = Annotated[
    float | None,
    Query(
        ge=0,
        allow_inf_nan=False,
        description="Seconds to wait for the job to finish (succeeded, failed or cancelled) "
        "before answering; a wait longer than the server's cap (JOBCORE_API_MAX_WAIT, 60 "
        "by default) is shortened to it. The answer comes as soon as the job is terminal.",
        examples=[30],
    ),
]


class WaitFor(StrEnum):
    """What ends a long-poll before its wait is over."""

    END = "end"
    PROGRESS = "progress"


OnQuery = Annotated[
    WaitFor,
    Query(
        description="With `wait`: `end` (the default) answers when the job is terminal; "
        "`progress` also answers as soon as the job's `progress` changes.",
    ),
]


def answered(row: DictRow, first: DictRow, on: WaitFor) -> bool:
    """Whether a long-poll that first read ``first`` answers with ``row`` now."""
    if is_terminal(row["status"]):
        return True
    return on is WaitFor.PROGRESS and _progress_of(row) != _progress_of(first)


def _progress_of(row: DictRow) -> tuple[Any, ...]:
    return (row["progress_updated_at"], row["progress_fraction"], row["progress_message"])


def wait_seconds(wait: float | None, cap: float) -> float:
    """Seconds to wait: 0 without the parameter, else at most ``cap``."""
    return 0.0 if wait is None else min(wait, cap)


def job_waiters(request: Request) -> JobWaiters:
    waiters: JobWaiters | None = getattr(request.app.state, "job_waiters", None)
    if waiters is None:
        raise ServiceStateError("the long-poll listener is not running")
    return waiters


def long_poll_slots(request: Request) -> LongPollSlots:
    slots: LongPollSlots | None = getattr(request.app.state, "long_poll_slots", None)
    if slots is None:
        raise ServiceStateError("the long-poll caps are not set up")
    return slots


async def read_job(db: Database, tenant: str, job_id: uuid.UUID) -> DictRow:
    """The tenant's job, on a briefly held connection."""
    async with db.session() as db_session:
        return await reads.get_job(db_session, tenant, job_id)


async def read_job_to_wait(
    db: Database, tenant: str, job_id: uuid.UUID, default_max_long_polls: int
) -> tuple[DictRow, int]:
    """The same and how many long-polls the tenant may park here (read only for a wait)."""
    async with db.session() as db_session:
        return await job_to_wait_for(db_session, tenant, job_id, default_max_long_polls)


async def get_job(
    job_id: uuid.UUID,
    tenant: TenantDep,
    db: DbDep,
    state: StateDep,
    request: Request,
    wait: WaitQuery = None,
    on: OnQuery = WaitFor.END,
) -> Response:
    """Status, attempts, errors, timestamps, progress and result, always read from the
    database. With ``wait``, answers once the job is terminal (with ``on=progress``: or its
    progress changed) or the wait is over; ``429`` at once when this process already parks
    as many long-polls as it or the tenant may."""
    seconds = wait_seconds(wait, state.settings.api_max_wait)
    if seconds <= 0:
        row = await read_job(db, tenant, job_id)
        return views.job_answer(row)
    waiters = job_waiters(request)
    slots = long_poll_slots(request)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    # Subscribed before the first read: a NOTIFY sent after that read sets the event.
    with waiters.subscribe(job_id, progress=on is WaitFor.PROGRESS) as woken:
        row, cap = await read_job_to_wait(db, tenant, job_id, state.settings.quota_max_long_polls)
        first = row
        if is_terminal(row["status"]):
            return views.job_answer(row)
        # Only a wait that would park takes a slot (after authentication: docs/design.md, 13).
        with slots.hold(tenant, cap):
            while not answered(row, first, on):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                await waiters.park(woken, remaining)
                # Batched with the other waiters woken meanwhile (one short checkout).
                reread = await waiters.reads.read(db, tenant, job_id)
                if reread is None:  # pragma: no cover - jobs are not deleted while waited on
                    raise JobNotFound("no job with that id")
                row = reread
    return views.job_answer(row)
