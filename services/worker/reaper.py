"""The reaper: jobs whose lease expired go back to pending (or fail), one reaper at a time.

A worker that died mid-handler stops heartbeating; once its lease expires, the job is
returned to ``pending`` with ``last_error = 'lease expired'`` and a new outbox message
for the next attempt, or ``failed`` if its attempts are used up. Every worker runs a
reaper; only the holder of the ``reaper`` maintenance lease works
(:mod:`services.worker.maintenance`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from psycopg.rows import DictRow
from pydantic import BaseModel

from jobcore.amqp.topology import Topology
from jobcore.channels import OUTBOX_CHANNEL
from jobcore.db import Database, UnitOfWork
from jobcore.enqueue import job_message_row
from jobcore.registry import JobType, Registry
from jobcore.settings import Settings
from jobcore.store import JobReapExpiredParams, job_store
from jobcore.webhooks import completion_params
from services.worker.maintenance import BATCH_SIZE, MaintenanceService
from services.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

LEASE_NAME = "reaper"
LEASE_EXPIRED = "lease expired"
_OUTCOME_WORDS = {
    "pending": "returned to pending",
    "failed": "failed: attempts used up",
    "cancelled": "cancelled: its cancellation was requested",
}


async def _no_handler(_: Any) -> None:  # pragma: no cover - never called
    raise RuntimeError("placeholder job type used only to address a message")


class Reaper(MaintenanceService):
    name = "worker-reaper"
    lease_name = LEASE_NAME

    def __init__(
        self,
        settings: Settings,
        db: Database,
        *,
        registry: Registry,
        owner: str,
        metrics: WorkerMetrics,
        interval: float | None = None,
    ) -> None:
        super().__init__(
            db,
            owner=owner,
            interval=interval if interval is not None else settings.worker_reaper_interval,
        )
        self.settings = settings
        self.registry = registry
        self.metrics = metrics
        self.topology = Topology.from_settings(settings)

    async def work(self, uow: UnitOfWork) -> tuple[int, Sequence[DictRow]]:
        expired = await job_store.lock_expired(uow, {"limit": BATCH_SIZE})
        if not expired:
            return 0, []
        return len(expired), await job_store.reap_expired(uow, self._reap_params(expired))

    def report(self, rows: Sequence[DictRow]) -> None:
        outcomes = {"pending": 0, "failed": 0, "cancelled": 0}
        for row in rows:
            outcomes[row["status"]] += 1
            log.info(
                "lease expired; job %s",
                _OUTCOME_WORDS[row["status"]],
                extra={"job_id": str(row["id"]), "status": row["status"]},
            )
        for outcome, count in outcomes.items():
            if count:
                self.metrics.reaped(outcome, count)

    def _reap_params(self, expired: list[DictRow]) -> JobReapExpiredParams:
        messages = [
            job_message_row(
                self.topology,
                job_id=row["id"],
                job_type=self._job_type(row),
                attempt=row["attempts"] + 1,
                trace_headers={
                    k: row[k] for k in ("traceparent", "tracestate") if row[k] is not None
                },
            )
            for row in expired
            if row["attempts"] < row["max_attempts"]
        ]
        return {
            **completion_params(self.topology, self.settings),
            "ids": [row["id"] for row in expired],
            "error": LEASE_EXPIRED,
            "channel": OUTBOX_CHANNEL,
            "message_ids": [m["message_id"] for m in messages],
            "exchanges": [m["exchange"] for m in messages],
            "routing_keys": [m["routing_key"] for m in messages],
            "message_types": [m["message_type"] for m in messages],
            "headers": [m["headers"] for m in messages],
            "bodies": [m["body"] for m in messages],
            "job_ids": [row["id"] for row in expired if row["attempts"] < row["max_attempts"]],
        }

    def _job_type(self, row: DictRow) -> JobType[Any]:
        """The job's type, or a stand-in naming its queue when this worker lacks the type.

        The message only needs the type's name and queue; a worker that knows the type
        will run it (or dead-letter it if none does).
        """
        if row["type"] in self.registry:
            return self.registry.get(row["type"])
        return JobType(
            name=row["type"], queue=row["queue"], payload_model=BaseModel, handler=_no_handler
        )
