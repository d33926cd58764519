"""The reaper: jobs whose lease expired go back to pending (or fail).

A worker that died mid-handler stops heartbeating; once its lease expires, the job is
returned to ``pending`` with ``last_error = 'lease expired'`` and a new outbox message
for the next attempt, or ``failed`` if its attempts are used up (``cancelled`` if its
cancellation was requested). The maintenance leader's reaper does it
(:mod:`jobcore.maintenance.maintainer`), every ``JOBCORE_WORKER_REAPER_INTERVAL``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from psycopg.rows import DictRow
from pydantic import BaseModel

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import UnitOfWork
from jobcore.database.store import CompletionParams, JobReapExpiredParams, job_store
from jobcore.execution.completion_webhooks import completion_params
from jobcore.execution.job_messages import job_message_row, message_columns, trace_headers_of
from jobcore.execution.registry import JobType, Registry
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.settings import Settings
from jobcore.maintenance.base import BatchService, ServiceConfig
from jobcore.maintenance.lease import Term
from jobcore.maintenance.metrics import ReaperMetrics

log = logging.getLogger(__name__)

LEASE_EXPIRED = "lease expired"
_OUTCOME_WORDS = {
    "pending": "returned to pending",
    "failed": "failed: attempts used up",
    "cancelled": "cancelled: its cancellation was requested",
}


# A round looks for leases that expired since its low-water mark (JOB_LOCK_EXPIRED), plus
# this slack: the last round's start, or the oldest lease that round left expired (one it
# could not lock: a finishing worker or another reaper held the job; JOB_OLDEST_EXPIRED),
# so its cost follows the leases of its window, not the dead entries a pinned xmin
# horizon keeps. A lease enters the index when its claim or heartbeat commits, at its
# transaction's start plus the lease (a second or more), so a lease a round could not
# see expires after that round began. Every UNBOUNDED_EVERY seconds a round looks at every
# running row, the safety net for a lease written otherwise (already expired when it
# committed): such a lease is reaped within UNBOUNDED_EVERY plus the reaper's interval.
WINDOW_SLACK = 1.0
UNBOUNDED_EVERY = 300.0
UNBOUNDED_WINDOW = 1e9  # seconds: every running row


async def _no_handler(_: Any) -> None:  # pragma: no cover - never called
    raise RuntimeError("placeholder job type used only to address a message")


@dataclass(frozen=True)
class ReaperConfig(ServiceConfig):
    variables: ClassVar = {"interval": "JOBCORE_WORKER_REAPER_INTERVAL"}

    @classmethod
    def from_settings(cls, settings: Settings) -> ReaperConfig:
        return cls(interval=settings.worker_reaper_interval)


class Reaper(BatchService[ReaperConfig]):
    name = "reaper"

    def __init__(
        self,
        config: ReaperConfig,
        *,
        topology: Topology,
        completion: CompletionParams,
        registry: Registry,
        metrics: ReaperMetrics,
    ) -> None:
        super().__init__(config)
        self.topology = topology
        self.completion = completion
        self.registry = registry
        self.metrics = metrics
        self.window = UNBOUNDED_WINDOW
        # Monotonic time of the low-water mark (None: no round yet) and start of the last
        # unbounded round.
        self._mark_at: float | None = None
        self._unbounded_at: float | None = None

    @classmethod
    def from_settings(
        cls, settings: Settings, *, registry: Registry, metrics: ReaperMetrics
    ) -> Reaper:
        topology = Topology.from_settings(settings)
        return cls(
            ReaperConfig.from_settings(settings),
            topology=topology,
            completion=completion_params(topology, settings),
            registry=registry,
            metrics=metrics,
        )

    async def lead(self, term: Term) -> int:
        started = time.monotonic()
        unbounded = self._unbounded_at is None or started - self._unbounded_at >= UNBOUNDED_EVERY
        if unbounded or self._mark_at is None:
            self.window = UNBOUNDED_WINDOW
        else:
            self.window = started - self._mark_at + WINDOW_SLACK
        reaped = await super().lead(term)
        if self.window == UNBOUNDED_WINDOW:
            self._unbounded_at = started
        self._mark_at = await self._next_mark(term, started)
        return reaped

    async def _next_mark(self, term: Term, started: float) -> float:
        """This round's start, or the oldest lease of its window still expired."""
        # Taken before the read: the statement's now() is later, so the mark errs early.
        before = time.monotonic()
        window = min(UNBOUNDED_WINDOW, self.window + before - started)
        async with term.db.session() as session:
            row = await job_store.oldest_expired(session, {"window": window})
        if row is None or row["seconds"] is None:
            return started
        return min(started, before - float(row["seconds"]))

    async def work(self, uow: UnitOfWork) -> tuple[int, Sequence[DictRow]]:
        expired = await job_store.lock_expired(
            uow, {"limit": self.config.batch_size, "window": self.window}
        )
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
                trace_headers=trace_headers_of(row),
            )
            for row in expired
            if row["attempts"] < row["max_attempts"]
        ]
        return {
            **self.completion,
            **message_columns(messages),
            "ids": [row["id"] for row in expired],
            "error": LEASE_EXPIRED,
            "channel": OUTBOX_CHANNEL,
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
