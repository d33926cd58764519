"""The sweeper: pending jobs whose message vanished are published again, one sweeper at a time.

Every ``JOBCORE_SWEEPER_INTERVAL`` the holder of the ``sweeper`` maintenance lease
(:mod:`services.worker.maintenance`) republishes, through the outbox, the current attempt
of each pending job that has been due with no outbox row and no change for
``JOBCORE_SWEEPER_STALE_AFTER`` (:func:`jobcore.maintenance.stranded.republish_stale` says why a
spare copy is harmless and how often a job can get one). After each round the holder
also measures how long each queue's longest-waiting due job has been due
(``jobcore_jobs_overdue_seconds``, for the alert in deploy/prometheus/alerts.yaml).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Sequence

from jobcore.amqp.topology import Topology
from jobcore.db import Database, UnitOfWork
from jobcore.maintenance.stranded import Republished, republish_stale
from jobcore.settings import Settings
from jobcore.store import job_store
from services.worker.maintenance import BATCH_SIZE, MaintenanceService
from services.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

LEASE_NAME = "sweeper"


class Sweeper(MaintenanceService):
    name = "worker-sweeper"
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
            interval=interval if interval is not None else settings.sweeper_interval,
        )
        self.metrics = metrics
        self.stale_after = settings.sweeper_stale_after
        self.topology = Topology.from_settings(settings)

    async def tick(self) -> int:
        """A round, then (lease holder only) how long due jobs have waited, per queue."""
        taken = await super().tick()
        if self.is_leader:
            async with self.db.connection() as conn:
                rows = await job_store.overdue_by_queue(conn)
            self.metrics.overdue({row["queue"]: float(row["overdue_seconds"]) for row in rows})
        else:
            self.metrics.overdue({})  # the holder reports; max() over workers reads it
        return taken

    async def work(self, uow: UnitOfWork) -> tuple[int, Sequence[Republished]]:
        return await republish_stale(
            uow, self.topology, stale_after=self.stale_after, limit=BATCH_SIZE
        )

    def report(self, rows: Sequence[Republished]) -> None:
        if not rows:
            return
        # One warning per batch, each job at info: a purged queue can strand many at once.
        reasons = collections.Counter(job.reason for job in rows)
        log.warning(
            "pending jobs published again: no sign of their messages",
            extra={"jobs": len(rows), "reasons": dict(reasons)},
        )
        for job in rows:
            log.info(
                "pending job published again",
                extra={
                    "job_id": str(job.job_id),
                    "attempt": job.attempt,
                    "reason": job.reason,
                    "republish_count": job.count,
                },
            )
        for reason, count in reasons.items():
            self.metrics.republished(reason, count)
