"""The gate releaser: held jobs are published again once their gate may let them start.

A claim that a gate stopped (jobcore.kernel.gates) left its job pending with a ``held_reason``
and no message. Every round (``JOBCORE_GATE_RELEASE_INTERVAL``), the maintenance leader's
gate releaser finds the held jobs whose concurrency slot, rate token or turn in their
ordering key has come, and writes a new outbox message for each one's unused attempt (due
when its rate token is; :mod:`jobcore.maintenance.held_jobs`). Nothing is kept in the
process: slots are counted from running job rows, which the reaper returns to pending when
their worker died, so a dead worker's slot is freed by the reaper's fence and the next
round here releases the job waiting for it. A release is a hint, not a grant: the claim
checks the gates again, and holds the job again if another claim took the slot first (no
attempt is used either way).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from psycopg.rows import DictRow

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import UnitOfWork
from jobcore.kernel.settings import Settings
from jobcore.maintenance.base import BatchService, ServiceConfig
from jobcore.maintenance.held_jobs import release_held
from jobcore.maintenance.metrics import GateReleaserMetrics

log = logging.getLogger(__name__)

# A short interval must not make the releaser's own row flap between processes on a slow
# round.
MIN_ROW_TTL = 5.0


@dataclass(frozen=True)
class GateReleaserConfig(ServiceConfig):
    variables: ClassVar = {"interval": "JOBCORE_GATE_RELEASE_INTERVAL"}

    @classmethod
    def from_settings(cls, settings: Settings) -> GateReleaserConfig:
        return cls(interval=settings.gate_release_interval)

    @property
    def row_ttl(self) -> float:
        return max(super().row_ttl, MIN_ROW_TTL)


class GateReleaser(BatchService[GateReleaserConfig]):
    name = "gate_releaser"

    def __init__(
        self, config: GateReleaserConfig, *, topology: Topology, metrics: GateReleaserMetrics
    ) -> None:
        super().__init__(config)
        self.topology = topology
        self.metrics = metrics

    @classmethod
    def from_settings(cls, settings: Settings, *, metrics: GateReleaserMetrics) -> GateReleaser:
        return cls(
            GateReleaserConfig.from_settings(settings),
            topology=Topology.from_settings(settings),
            metrics=metrics,
        )

    async def work(self, uow: UnitOfWork) -> tuple[int, Sequence[DictRow]]:
        return await release_held(uow, self.topology, limit=self.config.batch_size)

    def report(self, rows: Sequence[Any]) -> None:
        if rows:
            self.metrics.released(len(rows))
            log.debug("released held jobs", extra={"count": len(rows)})
