"""Direct pickup (``JOBCORE_DIRECT_PICKUP``): a worker whose handlers are idle takes a new
job's outbox row itself.

At a steady rate well under capacity, a job's way to its handler through the relay and
the broker is four process wake-ups and three durable hand-offs: the API's commit, the
relay's claim and publish, the quorum queue's commit, the worker's claim. A worker with
free handler slots hears the NOTIFY the relays hear (the enqueue's, at its commit, on the
cancel listener's connection) and claims the jobs from their outbox rows in one statement
(jobcore.database.sql.jobs.run.JOB_CLAIM_FROM_OUTBOX), as a PostgreSQL-only queue's worker
fetches a job: it locks the fresh rows of its queues and types, deletes them, records
their messages in the inbox and claims the jobs under the fences and gates of a
delivery's claim, in one commit. docs/design.md, "Direct pickup", says why nothing is lost
and nothing runs twice:

- Each outbox row is published or taken, never both: the relay's claim and this one lock
  the row with SKIP LOCKED, and whoever deletes it does so in the transaction that holds
  the lock. A message the relay published before this claim ran meets the inbox.
- Only while idle: it takes at most as many rows as it has free slots, none while a
  delivery waits for one, and only rows that became due in the last ``WINDOW`` seconds.
  Under load the slots are full and everything goes through the relays and the broker,
  batched as before.
- Left to the relays: jobs with a concurrency or rate key (their claim locks the key's
  gate row first), ordered rows, paused queues and types, types this worker does not run.
- The relay that answers NOTIFYs waits a few milliseconds before it claims, when it was
  idle (services/relay/relay.py, ``DIRECT_PICKUP_GRACE``): otherwise it would take most
  rows first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from jobcore.execution.claims import ClaimedJob, OutboxScope
from jobcore.execution.executor import JobExecutor
from jobcore.execution.registry import Registry
from jobcore.maintenance.table_vacuum import OUTBOX_SMALL_BYTES, OUTBOX_SMALL_EVERY, TableVacuum
from services.worker.intake import Intake
from services.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

# Seconds back from now that a row may have become due and still be taken here: a fresh
# enqueue's. Older rows are the relays' (a backlog, a broker outage's), and the bound keeps
# the look at the outbox a short range of outbox_due_idx whatever its head holds.
WINDOW = 1.0
# Seconds a stop waits for a pickup under way (a claim) before cancelling it.
STOP_WAIT = 5.0
# The queue label of rows taken with no job claimed (held, parked, seen before, not
# claimable): the statement answers those without their queue.
UNCLAIMED = "unclaimed"
# Past OUTBOX_SMALL_BYTES, a VACUUM of the outbox after this many rows taken (the relay's
# JOBCORE_RELAY_VACUUM_EVERY default).
VACUUM_EVERY = 100_000


class DirectPickup:
    """Takes fresh outbox rows while handler ``slots`` are free; each job claimed runs in a
    task handed to ``track`` (the consumer's work in flight: waited for, and its lease
    given back, when the worker stops)."""

    def __init__(
        self,
        executor: JobExecutor,
        registry: Registry,
        queues: Iterable[str],
        *,
        slots: asyncio.Semaphore,
        limit: int,
        intake: Intake,
        metrics: WorkerMetrics,
        track: Callable[[asyncio.Task[None]], None],
    ) -> None:
        self.executor = executor
        self.scope = OutboxScope.of(registry, list(queues))
        self.slots = slots
        self.limit = limit
        self.intake = intake
        self.metrics = metrics
        self.track = track
        self._wake = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        # The rows this worker deletes are not the relays' to count: without a VACUUM
        # every so many of them, the outbox grew by 50-66 B/job at 137 jobs/s, its deleted
        # rows' space never recorded as free (jobcore.maintenance.table_vacuum).
        self.vacuum = TableVacuum(
            executor.settings,
            "outbox",
            VACUUM_EVERY,
            owner="worker",
            small_every=OUTBOX_SMALL_EVERY,
            small_bytes=OUTBOX_SMALL_BYTES,
        )

    def notified(self) -> None:
        """An enqueue committed (its NOTIFY): look at the outbox once the last look is done."""
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self._follow(), name="worker-direct-pickup")

    async def stop(self) -> None:
        """No more pickups; one under way finishes its claim (its jobs then run as any
        claimed job does, until the grace period ends)."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        self._wake.set()
        done, _ = await asyncio.wait({task}, timeout=STOP_WAIT)
        if not done:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        # After the last pickup, which may have started one.
        await self.vacuum.close()

    async def _follow(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            try:
                await self.take()
            except Exception:
                # The rows stay in the outbox, where the relays publish them (a body the
                # statement cannot read goes that way to the consumer that dead-letters it).
                log.exception("direct pickup failed; the relays publish what it left")

    async def take(self) -> int:
        """Take up to the free slots' worth of fresh outbox rows; the jobs claimed start in
        tasks of their own. How many started."""
        held = 0
        while held < self.limit and not self.slots.locked():
            await self.slots.acquire()  # free: returns at once
            held += 1
        started = 0
        try:
            if held == 0 or self._stopping:
                return 0
            answers = await self.executor.claim_from_outbox(self.scope, held, window=WINDOW)
            self.vacuum.deleted(len(answers))
            for answer in answers:
                if isinstance(answer, ClaimedJob):
                    self.metrics.taken_from_outbox(answer.job_type.queue)
                    self.track(asyncio.create_task(self._run(answer), name="worker-direct-job"))
                    started += 1
                else:
                    self.metrics.taken_from_outbox(UNCLAIMED)
                    log.debug("outbox row taken with no claim", extra={"reason": answer.reason})
            return started
        finally:
            for _ in range(held - started):
                self.slots.release()

    async def _run(self, job: ClaimedJob) -> None:
        """A claimed job to its outcome, in the slot taken for it."""
        self.intake.handler_started()
        try:
            await self.executor.execute(job)
        finally:
            self.intake.handler_ended()
            self.slots.release()
