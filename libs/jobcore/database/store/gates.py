"""What holds jobs back besides their own row: the gates' rows (``job_gates``: concurrency
slots, rate limits, ordering keys), the debounce and throttle keys (``job_keys``) and the
operators' pauses (``flow_pauses``). :class:`GateStore` runs the retention of
:mod:`jobcore.database.sql.job_gates` (the gates themselves are taken and given back by the
job statements, through :class:`jobcore.database.store.JobStore`); :class:`JobKeyStore`
the retention of :mod:`jobcore.database.sql.job_keys` (the keys are taken by the enqueue
statement); :class:`FlowPauseStore` runs :mod:`jobcore.database.sql.flow_pauses`.
"""

from __future__ import annotations

from psycopg.rows import DictRow

from jobcore.database.gateway import Reader, Session, execute, fetch_all, fetch_one
from jobcore.database.sql import NoParams
from jobcore.database.sql.flow_pauses import (
    FLOW_PAUSE_CLEAR,
    FLOW_PAUSE_LIST,
    FLOW_PAUSE_SET,
    FLOW_QUEUE_OVERVIEW,
    FlowPauseClearParams,
    FlowPauseSetParams,
    PauseKind,
)
from jobcore.database.sql.job_gates import (
    JOB_GATES_PRUNE_BATCH,
    JOB_GATES_PRUNE_COUNT,
    JobGatesPruneBatchParams,
    JobGatesPruneCountParams,
)
from jobcore.database.sql.job_keys import (
    JOB_KEYS_DUE_NOW,
    JOB_KEYS_PRUNE_BATCH,
    JOB_KEYS_PRUNE_COUNT,
    JobKeysDueNowParams,
    JobKeysPruneBatchParams,
    JobKeysPruneCountParams,
)

__all__ = [
    "FlowPauseClearParams",
    "FlowPauseSetParams",
    "FlowPauseStore",
    "GateStore",
    "JobGatesPruneBatchParams",
    "JobGatesPruneCountParams",
    "JobKeyStore",
    "JobKeysDueNowParams",
    "JobKeysPruneBatchParams",
    "JobKeysPruneCountParams",
    "PauseKind",
    "flow_pause_store",
    "gate_store",
    "job_key_store",
]

_NO_PARAMS: NoParams = {}


class GateStore:
    __slots__ = ()

    async def prune_count(self, on: Reader, params: JobGatesPruneCountParams) -> DictRow | None:
        """How many gate rows have been idle past their retention (``job_gates``)."""
        return await fetch_one(on, JOB_GATES_PRUNE_COUNT(params))

    async def prune_batch(self, on: Session, params: JobGatesPruneBatchParams) -> int:
        """Delete up to ``limit`` idle gate rows; how many."""
        return await execute(on, JOB_GATES_PRUNE_BATCH(params))


class JobKeyStore:
    __slots__ = ()

    async def prune_count(self, on: Reader, params: JobKeysPruneCountParams) -> DictRow | None:
        """How many debounce and throttle keys are spent (``job_keys``)."""
        return await fetch_one(on, JOB_KEYS_PRUNE_COUNT(params))

    async def prune_batch(self, on: Session, params: JobKeysPruneBatchParams) -> int:
        """Delete up to ``limit`` spent keys; how many."""
        return await execute(on, JOB_KEYS_PRUNE_BATCH(params))

    async def due_now(self, on: Reader, params: JobKeysDueNowParams) -> list[DictRow]:
        """Make the debounced jobs still open to their keys due now (the testing kit's
        stand-in for their periods passing); their ids."""
        return await fetch_all(on, JOB_KEYS_DUE_NOW(params))


class FlowPauseStore:
    __slots__ = ()

    async def pause(self, on: Reader, params: FlowPauseSetParams) -> DictRow | None:
        """Pause a queue or job type: whether it was paused, and since when."""
        return await fetch_one(on, FLOW_PAUSE_SET(params))

    async def resume(self, on: Reader, params: FlowPauseClearParams) -> DictRow | None:
        """Lift a pause and wake the relays: whether it was paused."""
        return await fetch_one(on, FLOW_PAUSE_CLEAR(params))

    async def list_pauses(self, on: Reader) -> list[DictRow]:
        """Every pause, queues first, by name."""
        return await fetch_all(on, FLOW_PAUSE_LIST(_NO_PARAMS))

    async def queue_overview(self, on: Reader) -> list[DictRow]:
        """Per queue with open jobs or a pause: pending and running jobs, and the pause."""
        return await fetch_all(on, FLOW_QUEUE_OVERVIEW(_NO_PARAMS))


gate_store = GateStore()
job_key_store = JobKeyStore()
flow_pause_store = FlowPauseStore()
