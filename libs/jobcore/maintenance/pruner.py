"""The pruner: finished jobs, inbox rows and result files past their retention go.

The maintenance leader's pruner prunes every ``JOBCORE_PRUNER_INTERVAL``, fencing every
batch's transaction (a leader that lost its lease stops at once). The work is the
library's (:mod:`jobcore.maintenance.retention`, which ``jobcore prune`` runs too): this
wraps it in the leader's rounds, rests between batches as long as each batch took, and
feeds the metrics. A batch waits for a lock at most ``lock_timeout``, not for as long as
another transaction holds it: the leader's other services take their turns on the same
connection (:class:`~jobcore.maintenance.connection.SharedConnection`). Every worker,
leader or not, refreshes the finished-jobs gauges each round, so they are current on every
worker.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import ClassVar

from jobcore.execution.registry import Registry
from jobcore.kernel.settings import Settings
from jobcore.maintenance.base import MaintenanceService, ServiceConfig
from jobcore.maintenance.connection import Transactions
from jobcore.maintenance.lease import Term
from jobcore.maintenance.metrics import PrunerMetrics
from jobcore.maintenance.retention import LEASE_NAME, Retention
from jobcore.storage.objectstore import open_result_store
from jobcore.storage.results import ResultStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrunerConfig(ServiceConfig):
    # The file sweep lists the whole result directory: once an hour is plenty for files
    # that are only left behind by a crash between a batch's commit and its unlinks, or by
    # an attempt that stored a result and then failed.
    file_sweep_interval: float = 3600.0
    # How long a batch waits for each lock before it leaves its step to the next round.
    # Every maintenance service shares the leader's one connection: meanwhile the others
    # wait for their turn, the gate releaser (every JOBCORE_GATE_RELEASE_INTERVAL, 0.2 s by
    # default) and the lease's renewal among them. jobcore's own holders of the rows a batch
    # deletes (a webhook delivery being updated) hold them for milliseconds; a lock held
    # longer is someone else's, and pruning can wait a round for it.
    lock_timeout: float = 0.2

    variables: ClassVar = {
        "interval": "JOBCORE_PRUNER_INTERVAL",
        "batch_size": "JOBCORE_PRUNER_BATCH_SIZE",
    }

    @classmethod
    def from_settings(cls, settings: Settings) -> PrunerConfig:
        return cls(interval=settings.pruner_interval, batch_size=settings.pruner_batch_size)

    def check(self) -> None:
        super().check()
        self.positive("file_sweep_interval")
        self.positive("lock_timeout")


class Pruner(MaintenanceService[PrunerConfig]):
    name = LEASE_NAME
    follows = True

    def __init__(
        self,
        config: PrunerConfig,
        *,
        settings: Settings,
        store: ResultStore,
        metrics: PrunerMetrics,
    ) -> None:
        super().__init__(config)
        # Retention reads the retention settings (by status and type) as it goes.
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self._files_swept_at: float | None = None

    @classmethod
    def from_settings(
        cls, settings: Settings, *, metrics: PrunerMetrics, registry: Registry | None = None
    ) -> Pruner:
        if registry is not None:
            unknown = sorted(t for t in settings.retention_types if t not in registry)
            if unknown:
                log.warning(
                    "JOBCORE_RETENTION_TYPES names job types this worker does not know; "
                    "their jobs (if any) are kept as long as it says",
                    extra={"types": unknown},
                )
        return cls(
            PrunerConfig.from_settings(settings),
            settings=settings,
            store=open_result_store(settings),
            metrics=metrics,
        )

    def retention(self, db: Transactions) -> Retention:
        return Retention(
            self.settings,
            db,
            store=self.store,
            batch_size=self.config.batch_size,
            lock_timeout=self.config.lock_timeout,
        )

    async def lead(self, term: Term) -> int:
        """Prune everything due, then survey."""
        retention = self.retention(term.db)
        sweep = (
            self._files_swept_at is None
            or time.monotonic() - self._files_swept_at >= self.config.file_sweep_interval
        )

        report = await retention.prune(
            fence=lambda uow: term.fence(uow, self),
            pause=term.sleep,
            on_batch=self.metrics.pruned,
            sweep_files=sweep,
        )
        if sweep and report.complete:
            self._files_swept_at = time.monotonic()
        pruned = sum(report.tables.values())
        if pruned:
            log.info(
                "pruned what outlived its retention",
                extra={"tables": dict(report.tables), "batches": report.batches},
            )
        self.metrics.surveyed(await retention.survey())
        return pruned

    async def follow(self, db: Transactions) -> None:
        self.metrics.surveyed(await self.retention(db).survey())
