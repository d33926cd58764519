"""The rescuer: a pending job that can never run fails, with a reason.

A job waits in ``pending`` for its message. When the relay quarantined that message (it
can never be published as it is: malformed, or too large for the broker), no worker will
ever receive it: the rescuer fails the job with ``outbox row quarantined: <the relay's
last error>``, and its completion webhook and long-poll waiters fire like for any terminal
status. A message the broker only refused for now (a nack, a missing queue or exchange)
is never quarantined: the relay retries it until the broker takes it, and its job waits.
The maintenance leader's rescuer does it, every ``JOBCORE_WORKER_RESCUER_INTERVAL``.

Recovery is ``jobcore jobs retry <job>`` (a new job, same payload); ``jobcore outbox
requeue`` refuses a quarantined row whose job has ended, since publishing it would do
nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from psycopg.rows import DictRow

from jobcore.amqp.topology import Topology
from jobcore.db import UnitOfWork
from jobcore.maintenance.base import BatchService, ServiceConfig
from jobcore.maintenance.metrics import RescuerMetrics
from jobcore.settings import Settings
from jobcore.store import CompletionParams, job_store
from jobcore.webhooks import completion_params

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RescuerConfig(ServiceConfig):
    variables: ClassVar = {"interval": "JOBCORE_WORKER_RESCUER_INTERVAL"}

    @classmethod
    def from_settings(cls, settings: Settings) -> RescuerConfig:
        return cls(interval=settings.worker_rescuer_interval)


class Rescuer(BatchService[RescuerConfig]):
    name = "rescuer"

    def __init__(
        self, config: RescuerConfig, *, completion: CompletionParams, metrics: RescuerMetrics
    ) -> None:
        super().__init__(config)
        self.completion = completion
        self.metrics = metrics

    @classmethod
    def from_settings(cls, settings: Settings, *, metrics: RescuerMetrics) -> Rescuer:
        completion = completion_params(Topology.from_settings(settings), settings)
        return cls(RescuerConfig.from_settings(settings), completion=completion, metrics=metrics)

    async def work(self, uow: UnitOfWork) -> tuple[int, Sequence[DictRow]]:
        rows = await job_store.fail_quarantined(
            uow, {**self.completion, "limit": self.config.batch_size}
        )
        return len(rows), rows

    def report(self, rows: Sequence[DictRow]) -> None:
        for row in rows:
            log.warning(
                "pending job failed: its message can never be delivered",
                extra={"job_id": str(row["id"]), "error": row["last_error"]},
            )
        if rows:
            self.metrics.rescued("quarantined", len(rows))
