"""A worker in the test's own process that runs every due job to its end and returns
(Oban's ``drain_queue``, procrastinate's ``run_worker(wait=False)``), with no broker.

It takes the path a job takes in production, minus RabbitMQ in the middle: the outbox rows
the relay would publish are claimed and deleted with the relay's own statements (as if the
broker had confirmed them), each message body is decoded by the worker's envelope decoder,
and from there the worker's own execution core runs it
(:class:`~jobcore.execution.executor.JobExecutor`): the claim statement (inbox row and
lease, so a duplicate has no effect), the payload (read from the result store when stored
by reference), the handler in a real :class:`~jobcore.execution.registry.JobContext` under its
timeout, with heartbeats, progress and ``ctx.transaction()``, and the outcome, decided and
written as the worker decides and writes it: success with result and effects (a large
result in the result store), a retry through the outbox with the configured backoff,
failure, cancellation, a job given back when the object store is unavailable. Jobs are
enqueued as the API enqueues them (a large payload stored by reference); a batch
(:meth:`InlineWorker.enqueue_batch`) as ``POST /batches`` creates it, its callbacks firing
in the transaction of its last member's outcome and running in the same drain. What it leaves
out: the broker (queues, delivery limits, dead-lettering), concurrency (jobs run one at a
time, in order), batched commits, and completion webhooks (their outbox rows stay unsent).

    worker = InlineWorker(db)
    job_id = await worker.enqueue("send_email", {"to": "ada@example.com", "subject": "Hi"})
    # or a workflow: await worker.workflow([{"name": ..., "type": ..., "depends_on": [...]}])
    drained = await worker.drain()
    assert drained.succeeded == 1
    assert (await worker.job(job_id))["status"] == "succeeded"

Jobs of a type that debounces or throttles by key (:mod:`jobcore.kernel.keyed`) are
enqueued as the API enqueues them: :meth:`InlineWorker.enqueue` answers the job a
request joined. A debounced job falls due a period after its key's last enqueue; the
test need not wait for it: :meth:`InlineWorker.end_debounce_periods` makes the keys' open
jobs due now, as if their keys had been quiet for the period (the kit's clock is the
database's, and this is the one hand on it).

:meth:`InlineWorker.drain` keeps going while messages are due, and waits for those that
come due within ``scheduled_within`` seconds (default: the retry backoff's cap, so every
retry runs; the pytest plugin's settings make that a few milliseconds). A job scheduled
further ahead is left pending (:attr:`Drained.next_due_in` says when it falls due).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg.rows import DictRow

from jobcore.amqp.topology import WEBHOOKS_QUEUE, Topology
from jobcore.database.gateway import Database
from jobcore.database.store import job_key_store, job_store, outbox_store
from jobcore.execution.claims import ClaimedJob, ClaimRequest
from jobcore.execution.executor import JobExecutor
from jobcore.execution.payloads import validate_payload
from jobcore.execution.registry import Registry, default_registry
from jobcore.kernel.envelope import decode
from jobcore.kernel.errors import JobNotFound, PoisonMessage
from jobcore.maintenance.held_jobs import release_held
from jobcore.testing.inline import as_sent
from jobcore.usecases.batches import BatchWritten, Callback, create_batch, get_batch
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue
from jobcore.usecases.whereabouts import with_where
from jobcore.usecases.workflows import WorkflowCreated, create_workflow, steps_from_documents

# The relay these deliveries are published by, as the timeline names it.
INLINE_RELAY = "inline"
# Outbox rows taken per round, like one relay batch.
BATCH = 100
# How far back the drain's claim looks (seconds): at every due row. It keeps no low-water
# mark as the relay does (services/relay/low_water.py): a test's outbox is small, and no
# transaction pins its horizon for long.
EVERY_DUE_ROW = 1e9


@dataclass(slots=True)
class Drained:
    """What one :meth:`InlineWorker.drain` did, by outcome (counted per attempt)."""

    succeeded: int = 0
    retried: int = 0
    failed: int = 0
    cancelled: int = 0
    # Messages the inbox had seen already, and messages whose job was not theirs to run.
    duplicates: int = 0
    skipped: int = 0
    # Claims a gate held (jobcore.kernel.gates): the job waited, and ran once its turn came.
    held: int = 0
    # Attempts given back because the object store was unavailable (as the worker does:
    # they consume no attempt, and are not counted in attempts).
    given_back: int = 0
    # Attempts whose handler snoozed the job (pending again later, its attempt unspent).
    snoozed: int = 0
    # Seconds until the next message left in the outbox falls due (a job scheduled later
    # than the drain waits for); None when none waits.
    next_due_in: float | None = None
    ran: list[uuid.UUID] = field(default_factory=list)

    @property
    def attempts(self) -> int:
        return self.succeeded + self.retried + self.failed + self.cancelled


class _DrainCounts:
    """The execution core's reports, counted into the current drain (a retry or a
    give-back that found the job's cancellation asked for is reported cancelled)."""

    def __init__(self) -> None:
        self.drained = Drained()

    def started(self, job: ClaimedJob) -> None:
        return None

    def handler_ran(self, job_type: str, seconds: float) -> None:
        return None

    def processed(self, outcome: str, job: ClaimedJob | None = None) -> None:
        if outcome == "succeeded":
            self.drained.succeeded += 1
        elif outcome == "failed":
            self.drained.failed += 1
        elif outcome == "cancelled":
            self.drained.cancelled += 1
        elif outcome == "retried":
            self.drained.retried += 1
        elif outcome == "store_unavailable":
            self.drained.given_back += 1
        elif outcome == "snoozed":
            self.drained.snoozed += 1

    def retry_scheduled(self) -> None:
        return None


class InlineWorker:
    """Runs the jobs of ``db``'s database to their end, in this process; see the module."""

    def __init__(
        self,
        db: Database,
        *,
        registry: Registry = default_registry,
        worker_id: str = "inline-worker",
    ) -> None:
        self.db = db
        self.settings = db.settings
        self.registry = registry
        self.topology = Topology.from_settings(self.settings)
        self._counts = _DrainCounts()
        # The worker's execution core, on the pool: claims and successes commit one by one,
        # and handlers' transactions (ctx.transaction) take a pool connection too.
        self.executor = JobExecutor(
            self.settings,
            db,
            self.topology,
            self._counts,
            worker_id=worker_id,
            transactions=db,
        )
        self.result_store = self.executor.result_store
        self.completion = self.executor.completion
        self._webhooks_key = self.topology.routing_key(WEBHOOKS_QUEUE)

    # --- what the test does --------------------------------------------------------------

    async def enqueue(
        self,
        job_type: str,
        payload: Any,
        *,
        tenant: str = "test",
        idempotency_key: str | None = None,
        entity_id: str | None = None,
        max_attempts: int | None = None,
        run_at: datetime | None = None,
        ordering_key: str | None = None,
    ) -> uuid.UUID:
        """Enqueue a job as the API does (payload and request checked the same way, job and
        outbox row in one statement, :func:`jobcore.usecases.enqueue.submit.enqueue`); its id
        (for a debounced or throttled type, the id of the job the request joined)."""
        kind = self.registry.get(job_type)
        request = EnqueueRequest(
            tenant=tenant,
            job_type=kind,
            payload=validate_payload(kind, as_sent(payload)),
            idempotency_key=idempotency_key,
            entity_id=entity_id,
            max_attempts=max_attempts,
            run_at=run_at,
            ordering_key=ordering_key,
        )
        async with self.db.session() as session:
            result = await enqueue(
                session,
                self.topology,
                request,
                payload_store=self.result_store,
                inline_payload_max_bytes=self.settings.inline_payload_max_bytes,
            )
        return result.job_id

    async def end_debounce_periods(self, *, tenant: str | None = None) -> list[uuid.UUID]:
        """Make every debounced job still open to its key (of ``tenant``, or of every
        tenant) due now, as if its key had been quiet for the period; their ids. A later
        enqueue of such a key joins the job still, until :meth:`drain` takes its message."""
        async with self.db.session() as session:
            rows = await job_key_store.due_now(session, {"tenant": tenant})
        return [row["id"] for row in rows]

    async def enqueue_batch(
        self,
        jobs: Sequence[tuple[str, Any]],
        *,
        on_success: tuple[str, Mapping[str, Any]] | None = None,
        on_complete: tuple[str, Mapping[str, Any]] | None = None,
        on_death: tuple[str, Mapping[str, Any]] | None = None,
        tenant: str = "test",
        close: bool = True,
        parent_id: uuid.UUID | None = None,
    ) -> BatchWritten:
        """Create a batch as ``POST /batches`` does (:func:`jobcore.usecases.batches.create_batch`):
        ``jobs`` as (type, payload) pairs, each callback as (type, payload). Its callbacks
        are jobs like any other: :meth:`drain` runs them once they fire; :meth:`batch`
        reads it."""
        requests = []
        for job_type, payload in jobs:
            kind = self.registry.get(job_type)
            requests.append(
                EnqueueRequest(
                    tenant=tenant,
                    job_type=kind,
                    payload=validate_payload(kind, as_sent(payload)),
                )
            )
        given = {"on_success": on_success, "on_complete": on_complete, "on_death": on_death}
        callbacks = {
            name: Callback(self.registry.get(spec[0]), spec[1])
            for name, spec in given.items()
            if spec is not None
        }
        return await create_batch(
            self.db,
            self.topology,
            tenant=tenant,
            members=requests,
            callbacks=callbacks,
            close=close,
            parent_id=parent_id,
        )

    async def batch(self, batch_id: uuid.UUID) -> dict[str, Any]:
        """The batch as ``GET /batches/{id}`` reads it (counts, failed jobs, callbacks)."""
        return await get_batch(self.db, tenant=None, batch_id=batch_id)

    async def workflow(
        self,
        jobs: Sequence[Mapping[str, Any]],
        *,
        name: str | None = None,
        tenant: str = "test",
        idempotency_key: str | None = None,
    ) -> WorkflowCreated:
        """Create a workflow as ``POST /workflows`` does (each job's payload checked by its
        type, the graph checked, everything in one statement): ``jobs`` are documents with
        ``name``, ``type``, ``payload``, ``depends_on`` (names, or ``{"name", "policy"}``)
        and ``finally``; ``idempotency_key`` as the request's header. :meth:`drain` then
        runs its jobs as their dependencies allow."""

        def resolve(type_name: str, payload: Any, _: int) -> tuple[Any, Any]:
            kind = self.registry.get(type_name)
            return kind, validate_payload(kind, as_sent(payload))

        steps = steps_from_documents(jobs, resolve, tenant)
        async with self.db.unit_of_work() as uow:
            created = await create_workflow(
                uow,
                self.topology,
                tenant=tenant,
                steps=steps,
                name=name,
                idempotency_key=idempotency_key,
            )
            await uow.commit()
        return created

    async def job(self, job_id: uuid.UUID) -> dict[str, Any]:
        """The job's row as the API reads it (status, attempts, result, last_error, ...,
        and ``where`` it is now)."""
        async with self.db.session() as session:
            row = await job_store.get_any_tenant(session, {"id": job_id})
        if row is None:
            raise JobNotFound(f"no job {job_id}")
        return with_where(row)

    async def drain(
        self, *, scheduled_within: float | None = None, timeout: float = 60.0
    ) -> Drained:
        """Run jobs until none is due (nor due within ``scheduled_within`` seconds).

        Raises :class:`TimeoutError` after ``timeout`` seconds of work (a job that keeps
        re-enqueueing itself never idles)."""
        wait_limit = scheduled_within
        if wait_limit is None:
            wait_limit = self.settings.retry_backoff_cap
        deadline = time.monotonic() + timeout
        drained = self._counts.drained = Drained()
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the jobs did not drain within {timeout:g}s")
            if await self._run_due(drained) or await self._release_held():
                continue
            wait = await self._seconds_until_next_due()
            if wait is None or wait > wait_limit:
                # A row that came due between the two reads is in neither (the first saw it
                # scheduled, the second due): one more look, later than both, finds it.
                if await self._run_due(drained) or await self._release_held():
                    continue
                drained.next_due_in = wait
                return drained
            # Until the next message's scheduled time, bounded by the deadline.
            await asyncio.sleep(min(wait, max(0.0, deadline - time.monotonic())))

    async def _run_due(self, drained: Drained) -> bool:
        """Deliver the rows due now; whether there were any."""
        messages = await self._take_due()
        for message in messages:
            await self._deliver(message, drained)
        return bool(messages)

    # --- the gate releaser's part: held jobs whose turn came get a message again ---------

    async def _release_held(self) -> int:
        async with self.db.unit_of_work() as uow:
            _, released = await release_held(uow, self.topology, limit=BATCH)
            await uow.commit()
        return len(released)

    # --- the relay's part: due rows, taken as if the broker had confirmed them ----------

    async def _take_due(self) -> list[DictRow]:
        async with self.db.unit_of_work() as uow:
            rows = await outbox_store.claim_due(uow, {"limit": BATCH, "window": EVERY_DUE_ROW})
            # Completion webhooks are the worker's webhook sender's: not sent here.
            jobs = [row for row in rows if row["routing_key"] != self._webhooks_key]
            if jobs:
                ids = [r["id"] for r in jobs]
                await outbox_store.delete_published(uow, {"ids": ids, "relay": INLINE_RELAY})
            await uow.commit()
        return jobs

    async def _seconds_until_next_due(self) -> float | None:
        async with self.db.session() as session:
            row = await outbox_store.seconds_until_next_due(session)
        return None if row is None or row["seconds"] is None else max(0.0, row["seconds"])

    # --- the worker's part ------------------------------------------------------------------

    async def _deliver(self, message: DictRow, drained: Drained) -> None:
        envelope = decode(bytes(message["body"]))
        if message["message_type"] != envelope.type:
            raise PoisonMessage(
                f"message type {message['message_type']!r} disagrees with its body "
                f"({envelope.type!r})"
            )
        job_type = self.registry.get(envelope.type)  # unknown: the test forgot to register it
        message_id = uuid.UUID(str(message["message_id"]))
        # What the relay says in the message's headers (jobcore.kernel.envelope.PUBLISHED_HEADER).
        request = ClaimRequest(
            message_id,
            envelope.job_id,
            job_type,
            envelope.attempt,
            published_at=message["taken_at"],
            published_by=INLINE_RELAY,
        )
        [answer] = await self.executor.claim([request])
        if isinstance(answer, ClaimedJob):
            drained.ran.append(answer.job_id)
            await self.executor.execute(answer)
        elif answer.reason == "duplicate":
            drained.duplicates += 1
        elif answer.reason == "held":
            drained.held += 1
        else:  # not claimable, or parked while its queue or type is paused
            drained.skipped += 1
