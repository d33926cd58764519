"""The gate releaser: held jobs are published again once their gate may let them start.

A claim that a gate stopped (jobcore.gates) left its job pending with a ``held_reason``
and no message. Every round, the holder of the ``gate_releaser`` lease finds the held
jobs whose concurrency slot, rate token or turn in their ordering key has come, and
writes a new outbox message for each one's unused attempt (due when its rate token is).
Nothing is kept in the process: slots are counted from running job rows, which the
reaper returns to pending when their worker died, so a dead worker's slot is freed by
the reaper's fence and the next round here releases the job waiting for it. A release is
a hint, not a grant: the claim checks the gates again, and holds the job again if
another claim took the slot first (no attempt is used either way).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from psycopg.rows import DictRow

from jobcore.amqp.topology import Topology
from jobcore.db import Database, UnitOfWork
from jobcore.maintenance.releases import release_held
from jobcore.settings import Settings
from services.worker.maintenance import BATCH_SIZE, MaintenanceService
from services.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

LEASE_NAME = "gate_releaser"


class GateReleaser(MaintenanceService):
    name = "worker-gate-releaser"
    lease_name = LEASE_NAME

    def __init__(
        self,
        settings: Settings,
        db: Database,
        *,
        owner: str,
        metrics: WorkerMetrics,
        interval: float | None = None,
    ) -> None:
        super().__init__(
            db,
            owner=owner,
            interval=interval if interval is not None else settings.gate_release_interval,
        )
        # A short interval must not make the lease flap between workers on a slow round.
        self.lease_ttl = max(self.lease_ttl, 5.0)
        self.metrics = metrics
        self.topology = Topology.from_settings(settings)

    async def work(self, uow: UnitOfWork) -> tuple[int, Sequence[DictRow]]:
        return await release_held(uow, self.topology, limit=BATCH_SIZE)

    def report(self, rows: Sequence[Any]) -> None:
        if rows:
            self.metrics.released(len(rows))
            log.debug("released held jobs", extra={"count": len(rows)})
