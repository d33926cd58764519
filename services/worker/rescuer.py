"""The rescuer: a pending job that can never run fails, with a reason, one rescuer at a time.

A job waits in ``pending`` for its message. When the relay quarantined that message (it
can never be published as it is: malformed, or too large for the broker), no worker will
ever receive it: the rescuer fails the job with ``outbox row quarantined: <the relay's
last error>``, and its completion webhook and long-poll waiters fire like for any terminal
status. A message the broker only refused for now (a nack, a missing queue or exchange)
is never quarantined: the relay retries it until the broker takes it, and its job waits.
Every worker runs a rescuer; only the holder of the ``rescuer`` maintenance lease works
(:mod:`services.worker.maintenance`).

Recovery is ``jobcore jobs retry <job>`` (a new job, same payload); ``jobcore outbox
requeue`` refuses a quarantined row whose job has ended, since publishing it would do
nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from psycopg.rows import DictRow

from jobcore.amqp.topology import Topology
from jobcore.db import Database, UnitOfWork
from jobcore.settings import Settings
from jobcore.store import job_store
from jobcore.webhooks import completion_params
from services.worker.maintenance import BATCH_SIZE, MaintenanceService
from services.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

LEASE_NAME = "rescuer"


class Rescuer(MaintenanceService):
    name = "worker-rescuer"
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
            interval=interval if interval is not None else settings.worker_rescuer_interval,
        )
        self.metrics = metrics
        topology = Topology.from_settings(settings)
        self.completion = completion_params(topology, settings)

    async def work(self, uow: UnitOfWork) -> tuple[int, Sequence[DictRow]]:
        rows = await job_store.fail_quarantined(uow, {**self.completion, "limit": BATCH_SIZE})
        return len(rows), rows

    def report(self, rows: Sequence[DictRow]) -> None:
        for row in rows:
            log.warning(
                "pending job failed: its message can never be delivered",
                extra={"job_id": str(row["id"]), "error": row["last_error"]},
            )
        if rows:
            self.metrics.rescued("quarantined", len(rows))
