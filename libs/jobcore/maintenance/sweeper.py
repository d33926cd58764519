"""The sweeper: pending jobs whose message vanished are published again.

Every ``JOBCORE_SWEEPER_INTERVAL`` the maintenance leader's sweeper republishes, through
the outbox, the current attempt of each pending job that has been due with no outbox row
and no change for ``JOBCORE_SWEEPER_STALE_AFTER`` (:func:`jobcore.maintenance.stranded.
republish_stale` says why a spare copy is harmless and how often a job can get one). After
each round it also measures how long each queue's longest-waiting due job has been due
(``jobcore_jobs_overdue_seconds``, for the alert in deploy/prometheus/alerts.yaml); the
other workers report none (aggregate with ``max``).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import UnitOfWork
from jobcore.database.store import job_store
from jobcore.kernel.settings import Settings
from jobcore.maintenance.base import BatchService, ServiceConfig
from jobcore.maintenance.connection import Transactions
from jobcore.maintenance.lease import Term
from jobcore.maintenance.metrics import SweeperMetrics
from jobcore.maintenance.stranded import Republished, republish_stale

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweeperConfig(ServiceConfig):
    # Seconds a pending job waits with no sign of its message before it is published again.
    stale_after: float = 3600.0

    variables: ClassVar = {
        "interval": "JOBCORE_SWEEPER_INTERVAL",
        "stale_after": "JOBCORE_SWEEPER_STALE_AFTER",
    }

    @classmethod
    def from_settings(cls, settings: Settings) -> SweeperConfig:
        return cls(interval=settings.sweeper_interval, stale_after=settings.sweeper_stale_after)

    def check(self) -> None:
        super().check()
        if self.stale_after <= self.interval:
            raise self.refuse(
                "stale_after",
                f"{self.stale_after:g}s must be longer than JOBCORE_SWEEPER_INTERVAL "
                f"({self.interval:g}s): the sweeper looks once per interval, so a shorter "
                "staleness would not mean what it says",
            )


class Sweeper(BatchService[SweeperConfig]):
    name = "sweeper"
    follows = True

    def __init__(
        self, config: SweeperConfig, *, topology: Topology, metrics: SweeperMetrics
    ) -> None:
        super().__init__(config)
        self.topology = topology
        self.metrics = metrics

    @classmethod
    def from_settings(cls, settings: Settings, *, metrics: SweeperMetrics) -> Sweeper:
        return cls(
            SweeperConfig.from_settings(settings),
            topology=Topology.from_settings(settings),
            metrics=metrics,
        )

    async def lead(self, term: Term) -> int:
        """A round, then how long due jobs have waited, per queue."""
        taken = await super().lead(term)
        if not term.over:
            async with term.db.session() as session:
                rows = await job_store.overdue_by_queue(session)
            self.metrics.overdue({row["queue"]: float(row["overdue_seconds"]) for row in rows})
        return taken

    async def follow(self, db: Transactions) -> None:
        self.metrics.overdue({})  # the leader reports; max() over workers reads it

    async def work(self, uow: UnitOfWork) -> tuple[int, Sequence[Republished]]:
        return await republish_stale(
            uow, self.topology, stale_after=self.config.stale_after, limit=self.config.batch_size
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
