"""The ``schedules`` table (the state of each periodic job): :class:`ScheduleStore`, a
method per statement of :mod:`jobcore.sql.schedules`."""

from __future__ import annotations

from psycopg.rows import DictRow

from jobcore.db import Reader, Session, execute, fetch_all, fetch_one
from jobcore.sql import NoParams
from jobcore.sql.schedules import (
    SCHEDULE_ADVANCE,
    SCHEDULE_ENSURE_MANY,
    SCHEDULE_LIST,
    SCHEDULE_LOCK,
    SCHEDULE_SET_PAUSED,
    ScheduleAdvanceParams,
    ScheduleEnsureManyParams,
    ScheduleLockParams,
    ScheduleSetPausedParams,
)

__all__ = [
    "ScheduleAdvanceParams",
    "ScheduleEnsureManyParams",
    "ScheduleLockParams",
    "ScheduleSetPausedParams",
    "ScheduleStore",
    "schedule_store",
]

_NO_PARAMS: NoParams = {}


class ScheduleStore:
    __slots__ = ()

    async def ensure_many(self, on: Session, params: ScheduleEnsureManyParams) -> int:
        """Create the state of the schedules seen for the first time; how many."""
        return await execute(on, SCHEDULE_ENSURE_MANY(params))

    async def list_states(self, on: Reader) -> list[DictRow]:
        """Every schedule's state, declared or not."""
        return await fetch_all(on, SCHEDULE_LIST(_NO_PARAMS))

    async def lock(self, on: Reader, params: ScheduleLockParams) -> DictRow | None:
        """Lock a schedule's state and read it; None if it has none yet."""
        return await fetch_one(on, SCHEDULE_LOCK(params))

    async def advance(self, on: Session, params: ScheduleAdvanceParams) -> int:
        """Move a schedule past ``tick``, with its latest job or refusal."""
        return await execute(on, SCHEDULE_ADVANCE(params))

    async def set_paused(self, on: Reader, params: ScheduleSetPausedParams) -> DictRow | None:
        return await fetch_one(on, SCHEDULE_SET_PAUSED(params))


schedule_store = ScheduleStore()
