"""The reaper: jobs whose lease expired go back to pending (or fail), one reaper at a time.

A worker that died mid-handler stops heartbeating; once its lease expires, the job is
returned to ``pending`` with ``last_error = 'lease expired'`` and a new outbox message
for the next attempt, or ``failed`` if its attempts are used up. Every worker runs a
reaper, but only the holder of the ``reaper`` row in ``maintenance_leases`` works: the
lease is a row with a token and an expiry (not an advisory lock, so it works behind
PgBouncer in transaction mode), renewed inside each reaping transaction, so a reaper
that lost it rolls back instead of reaping alongside the new holder.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from psycopg.rows import DictRow
from pydantic import BaseModel

from jobcore.amqp.topology import Topology
from jobcore.db import Database
from jobcore.enqueue import OUTBOX_CHANNEL, job_message_row
from jobcore.errors import DatabaseUnavailable
from jobcore.registry import JobType, Registry
from jobcore.service import Service
from jobcore.settings import Settings
from jobcore.sql import worker as q
from jobcore.webhooks import completion_params
from services.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

LEASE_NAME = "reaper"
LEASE_EXPIRED = "lease expired"
BATCH_SIZE = 500
_OUTCOME_WORDS = {
    "pending": "returned to pending",
    "failed": "failed: attempts used up",
    "cancelled": "cancelled: its cancellation was requested",
}


async def _no_handler(_: Any) -> None:  # pragma: no cover - never called
    raise RuntimeError("placeholder job type used only to address a message")


class Reaper(Service):
    name = "worker-reaper"

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
        super().__init__()
        self.settings = settings
        self.db = db
        self.registry = registry
        self.owner = owner
        self.metrics = metrics
        self.topology = Topology(settings.amqp_prefix, settings.amqp_delivery_limit)
        self.interval = interval if interval is not None else settings.worker_reaper_interval
        # Long enough to survive a slow round or two; short enough that a dead holder's
        # successor takes over within a few intervals.
        self.lease_ttl = self.interval * 3
        self.token: uuid.UUID | None = None

    @property
    def is_leader(self) -> bool:
        return self.token is not None

    async def run(self) -> None:
        trouble_logged = False
        try:
            while not self.stopping.is_set():
                try:
                    await self.tick()
                    trouble_logged = False
                except DatabaseUnavailable as exc:
                    # Keep the token: the next renewal says whether the lease survived.
                    if not trouble_logged:
                        log.warning("reaper: database unavailable", extra={"error": str(exc)})
                        trouble_logged = True
                if await self.sleep(self.interval):
                    break
        finally:
            await self._release()

    async def tick(self) -> int:
        """One round: hold (or take) the lease, then reap until no expired lease is left."""
        if not await self._hold_lease():
            return 0
        total = 0
        while True:
            reaped = await self._reap_batch()
            total += reaped
            if reaped < BATCH_SIZE:
                return total

    async def _hold_lease(self) -> bool:
        params: dict[str, Any] = {"name": LEASE_NAME, "owner": self.owner, "ttl": self.lease_ttl}
        async with self.db.unit_of_work() as uow:
            if self.token is not None:
                row = await uow.fetch_one(
                    q.RENEW_MAINTENANCE_LEASE, {**params, "token": self.token}
                )
                if row is None:
                    log.info("reaper lease lost to another worker", extra={"owner": self.owner})
                    self.token = None
            if self.token is None:
                token = uuid.uuid4()
                row = await uow.fetch_one(q.ACQUIRE_MAINTENANCE_LEASE, {**params, "token": token})
                if row is not None:
                    self.token = token
                    log.info("reaper lease acquired", extra={"owner": self.owner})
            await uow.commit()
        return self.token is not None

    async def _reap_batch(self) -> int:
        async with self.db.unit_of_work() as uow:
            # The fence: renewing in this transaction fails if another reaper took over.
            renewed = await uow.fetch_one(
                q.RENEW_MAINTENANCE_LEASE,
                {"name": LEASE_NAME, "token": self.token, "ttl": self.lease_ttl},
            )
            if renewed is None:
                self.token = None
                return 0
            expired = await uow.fetch_all(q.LOCK_EXPIRED_LEASES, {"limit": BATCH_SIZE})
            if not expired:
                await uow.commit()
                return 0
            rows = await uow.fetch_all(q.REAP, self._reap_params(expired))
            await uow.commit()
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
        return len(expired)

    def _reap_params(self, expired: list[DictRow]) -> dict[str, Any]:
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

    async def _release(self) -> None:
        if self.token is None:
            return
        token, self.token = self.token, None
        try:
            async with self.db.unit_of_work() as uow:
                await uow.execute(q.RELEASE_MAINTENANCE_LEASE, {"name": LEASE_NAME, "token": token})
                await uow.commit()
        except DatabaseUnavailable:
            log.debug("could not release the reaper lease; it expires on its own")
