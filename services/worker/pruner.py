"""The pruner: finished jobs, inbox rows and result files past their retention go, one
pruner at a time.

Every worker runs a pruner; only the holder of the ``pruner`` maintenance lease prunes
(:mod:`services.worker.maintenance`), renewing it in every batch's transaction so a holder
that lost it stops at once. The work is the library's (:mod:`jobcore.maintenance.retention`, which
``jobcore prune`` runs too): this wraps it in the worker's loop, rests between batches
as long as each batch took, and feeds the metrics. Every pruner, leader or not, refreshes
the finished-jobs gauges after its round, so they are current on every worker.
"""

from __future__ import annotations

import logging
import time

from jobcore.db import Database, UnitOfWork, fetch_one
from jobcore.maintenance.retention import LEASE_NAME, Retention
from jobcore.registry import Registry
from jobcore.settings import Settings
from jobcore.sql.maintenance_leases import MAINTENANCE_LEASE_RENEW
from services.worker.maintenance import MaintenanceService
from services.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

# The file sweep lists the whole result directory: once an hour is plenty for files that
# are only left behind by a crash between a batch's commit and its unlinks, or by an
# attempt that stored a result and then failed.
FILE_SWEEP_INTERVAL = 3600.0


class Pruner(MaintenanceService):
    name = "worker-pruner"
    lease_name = LEASE_NAME

    def __init__(
        self,
        settings: Settings,
        db: Database,
        *,
        owner: str,
        metrics: WorkerMetrics,
        registry: Registry | None = None,
        interval: float | None = None,
    ) -> None:
        super().__init__(
            db,
            owner=owner,
            interval=interval if interval is not None else settings.pruner_interval,
        )
        self.metrics = metrics
        self.retention = Retention(settings, db)
        self._files_swept_at: float | None = None
        if registry is not None:
            unknown = sorted(t for t in settings.retention_types if t not in registry)
            if unknown:
                log.warning(
                    "JOBCORE_RETENTION_TYPES names job types this worker does not know; "
                    "their jobs (if any) are kept as long as it says",
                    extra={"types": unknown},
                )

    async def tick(self) -> int:
        """One round: prune everything due if this pruner holds the lease, then survey."""
        pruned = 0
        if await self._hold_lease():
            sweep = (
                self._files_swept_at is None
                or time.monotonic() - self._files_swept_at >= FILE_SWEEP_INTERVAL
            )
            report = await self.retention.prune(
                fence=self._renew, pause=self.sleep, on_batch=self.metrics.pruned, sweep_files=sweep
            )
            if sweep and report.complete:
                self._files_swept_at = time.monotonic()
            pruned = sum(report.tables.values())
            if pruned:
                log.info(
                    "pruned what outlived its retention",
                    extra={"tables": dict(report.tables), "batches": report.batches},
                )
        self.metrics.surveyed(await self.retention.survey())
        return pruned

    async def _renew(self, uow: UnitOfWork) -> bool:
        """The fence of every batch: renew the lease in its transaction, or stop."""
        if self.token is None:
            return False
        renewed = await fetch_one(uow, MAINTENANCE_LEASE_RENEW(self._lease_params(self.token)))
        if renewed is None:
            log.info("%s lease lost to another worker", self.lease_name)
            self.token = None
        return renewed is not None
