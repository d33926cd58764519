"""A worker in the test's own process that runs every due job to its end and returns
(Oban's ``drain_queue``, procrastinate's ``run_worker(wait=False)``), with no broker.

It takes the path a job takes in production, minus RabbitMQ in the middle: the outbox rows
the relay would publish are claimed and deleted with the relay's own statements (as if the
broker had confirmed them), each message body is decoded by the worker's envelope decoder
and claimed with the worker's claim statement (inbox row and lease, so a duplicate has no
effect), a payload stored by reference is read from the result store as the worker reads
it (:func:`jobcore.payloads.read_payload`), the handler runs in a real
:class:`~jobcore.registry.JobContext` under its timeout (:mod:`jobcore.attempts`, shared
with the worker), its outcome is decided by the worker's policy (:mod:`jobcore.outcomes`)
and written by the worker's fenced statements: success with result and effects (a large
result in the result store), a retry through the outbox with the configured backoff,
failure, cancellation, a job given back when the object store is unavailable. Jobs are
enqueued as the API enqueues them (a large payload stored by reference). What it leaves
out: the broker
(queues, delivery limits, dead-lettering), concurrency (jobs run one at a time, in
order), automatic heartbeats, and completion webhooks (their outbox rows stay unsent).

    worker = InlineWorker(db)
    job_id = await worker.enqueue("send_email", {"to": "ada@example.com", "subject": "Hi"})
    drained = await worker.drain()
    assert drained.succeeded == 1
    assert (await worker.job(job_id))["status"] == "succeeded"

:meth:`InlineWorker.drain` keeps going while messages are due, and waits for those that
come due within ``scheduled_within`` seconds (default: the retry backoff's cap, so every
retry runs; the pytest plugin's settings make that a few milliseconds). A job scheduled
further ahead is left pending (:attr:`Drained.next_due_in` says when it falls due).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import orjson
from psycopg.rows import DictRow

from jobcore.amqp.topology import WEBHOOKS_QUEUE, Topology
from jobcore.attempts import call_handler
from jobcore.channels import OUTBOX_CHANNEL
from jobcore.db import Database, fetch_one, translate_errors
from jobcore.enqueue import job_message_row
from jobcore.envelope import decode
from jobcore.errors import JobNotFound, PoisonMessage
from jobcore.maintenance.releases import release_held
from jobcore.objectstore import open_result_store
from jobcore.outcomes import (
    CANCEL,
    Cancel,
    Fail,
    GiveBack,
    Outcome,
    OutcomeLimits,
    Retry,
    Succeed,
    give_back_delay,
    handler_failed,
    invalid_payload,
    store_failed,
    success,
)
from jobcore.payloads import read_payload, validate_payload
from jobcore.registry import InvalidPayloadError, JobContext, JobType, Registry, default_registry
from jobcore.results import ResultNotFound
from jobcore.store import (
    JOBS_CONSUMER,
    JobFencedParams,
    OutboxMessageParams,
    Statement,
    job_store,
    outbox_store,
)
from jobcore.submit import EnqueueRequest, enqueue
from jobcore.testing.inline import as_sent
from jobcore.timeline import with_where
from jobcore.webhooks import completion_params

# Outbox rows taken per round, like one relay batch.
BATCH = 100


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
    # Claims a gate held (jobcore.gates): the job waited, and ran once its turn came.
    held: int = 0
    # Attempts given back because the object store was unavailable (as the worker does:
    # they consume no attempt, and are not counted in attempts).
    given_back: int = 0
    # Seconds until the next message left in the outbox falls due (a job scheduled later
    # than the drain waits for); None when none waits.
    next_due_in: float | None = None
    ran: list[uuid.UUID] = field(default_factory=list)

    @property
    def attempts(self) -> int:
        return self.succeeded + self.retried + self.failed + self.cancelled


@dataclass(frozen=True, slots=True)
class _Claimed:
    job_type: JobType[Any]
    row: DictRow
    lease_token: uuid.UUID


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
        self.worker_id = worker_id
        self.topology = Topology.from_settings(self.settings)
        self.completion = completion_params(self.topology, self.settings)
        self.limits = OutcomeLimits.from_settings(self.settings)
        self.result_store = open_result_store(self.settings)
        # Store outages met in a row: the delay before a job given back grows with them.
        self._store_outages = 0
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
        outbox row in one statement, :func:`jobcore.submit.enqueue`); its id."""
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
        drained = Drained()
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
            rows = await outbox_store.claim_due(uow, {"limit": BATCH})
            # Completion webhooks are the worker's webhook sender's: not sent here.
            jobs = [row for row in rows if row["routing_key"] != self._webhooks_key]
            if jobs:
                ids = [r["id"] for r in jobs]
                await outbox_store.delete_published(uow, {"ids": ids, "relay": "inline"})
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
        lease_token = uuid.uuid4()
        async with self.db.session() as session:
            # As a worker claims: the gate rows its job's row names locked first.
            with translate_errors(self.db.settings):
                rows = await job_store.claim(
                    session.connection,
                    {
                        "consumer": JOBS_CONSUMER,
                        "exchange": self.topology.jobs_exchange,
                        "worker_id": self.worker_id,
                        "message_ids": [uuid.UUID(message["message_id"])],
                        "job_ids": [envelope.job_id],
                        "types": [envelope.type],
                        "attempts": [envelope.attempt],
                        "lease_tokens": [lease_token],
                        "leases": [job_type.lease],
                    },
                )
        row = rows[0]
        if not row["fresh"]:
            drained.duplicates += 1
            return
        if row["held_reason"] is not None:
            drained.held += 1
            return
        if row["id"] is None:
            drained.skipped += 1
            return
        drained.ran.append(row["id"])
        await self._run(_Claimed(job_type, row, lease_token), drained)

    async def _run(self, claimed: _Claimed, drained: Drained) -> None:
        """Run a claimed job's attempt as the worker does; its outcome is decided by
        :mod:`jobcore.outcomes`, as the worker's is, and written by the same statements."""
        job_type, row = claimed.job_type, claimed.row
        try:
            raw_payload = await read_payload(self.result_store, row["payload"], row["payload_ref"])
        except (OSError, ResultNotFound) as exc:
            await self._write(
                claimed, self._store_failed(claimed, exc, "reading the payload"), drained
            )
            return
        if row["payload_ref"] is not None:
            self._store_outages = 0
        try:
            payload = job_type.validate_payload(raw_payload)
        except InvalidPayloadError as exc:
            await self._write(claimed, invalid_payload(exc), drained)
            return
        if row["cancel_requested_at"] is not None:
            await self._write(claimed, CANCEL, drained)
            return
        context: JobContext[Any] = JobContext(
            job_id=row["id"],
            job_type=job_type.name,
            payload=payload,
            attempt=row["attempts"],
            max_attempts=row["max_attempts"],
            idempotency_key=str(row["id"]),
            heartbeat=lambda: self._heartbeat(claimed, context),
            result_store=self.result_store,
            settings=self.settings,
            lease_token=claimed.lease_token,
        )
        outcome: Outcome
        try:
            result = await call_handler(job_type, context)
        except (Exception, asyncio.CancelledError) as exc:
            current = asyncio.current_task()
            if isinstance(exc, asyncio.CancelledError) and current and current.cancelling():
                raise  # the drain itself is cancelled, not the handler by itself
            if context.cancel_requested.is_set():
                # As the worker's heartbeat stops a handler whose cancellation was asked for.
                outcome = CANCEL
            else:
                outcome = handler_failed(
                    exc,
                    attempt=row["attempts"],
                    max_attempts=row["max_attempts"],
                    limits=self.limits,
                    give_backs=row["store_give_backs"],
                )
        else:
            outcome = success(result, context, claimed.lease_token, self.limits)
            if isinstance(outcome, Succeed) and outcome.to_store is not None:
                try:
                    key = await asyncio.to_thread(
                        self.result_store.put,
                        row["id"],
                        outcome.to_store,
                        suffix="json",
                        lease_token=claimed.lease_token,
                    )
                except OSError as exc:
                    outcome = self._store_failed(claimed, exc, "storing the result")
                else:
                    self._store_outages = 0
                    outcome = outcome.stored(key)
        await self._write(claimed, outcome, drained)

    def _store_failed(
        self, claimed: _Claimed, exc: BaseException, during: str
    ) -> Retry | Fail | GiveBack:
        return store_failed(
            exc,
            during=during,
            attempt=claimed.row["attempts"],
            max_attempts=claimed.row["max_attempts"],
            limits=self.limits,
            give_backs=claimed.row["store_give_backs"],
        )

    async def _heartbeat(self, claimed: _Claimed, context: JobContext[Any]) -> None:
        """Extend the lease; a cancel request sets ``ctx.cancel_requested``. (A lost lease
        needs nothing here: the outcome's fence drops what the handler returns.)"""
        async with self.db.session() as session:
            row = await job_store.heartbeat(
                session,
                {
                    "id": claimed.row["id"],
                    "lease_token": claimed.lease_token,
                    "lease": claimed.job_type.lease,
                },
            )
        if row is not None and row["cancel_requested_at"] is not None:
            context.cancel_requested.set()

    async def _write(self, claimed: _Claimed, outcome: Outcome, drained: Drained) -> None:
        """Write the attempt's outcome with the worker's fenced statement, and count it
        (nothing when the fence refused it)."""
        row = claimed.row
        fence: JobFencedParams = {
            **self.completion,
            "id": row["id"],
            "lease_token": claimed.lease_token,
        }
        statement: Statement
        if isinstance(outcome, Succeed):
            statement = job_store.succeed_many_statement(
                {
                    **self.completion,
                    "ids": [row["id"]],
                    "lease_tokens": [claimed.lease_token],
                    "results": [outcome.result],
                    "result_refs": [outcome.result_ref],
                    "effects": orjson.dumps(outcome.effects).decode(),
                }
            )
        elif isinstance(outcome, Retry):
            statement = job_store.retry_statement(
                {
                    **fence,
                    **self._message(claimed, attempt=row["attempts"] + 1),
                    "error": outcome.error,
                    "delay": outcome.delay,
                    "channel": OUTBOX_CHANNEL,
                }
            )
        elif isinstance(outcome, GiveBack):
            self._store_outages += 1
            statement = job_store.release_statement(
                {
                    **fence,
                    **self._message(claimed, attempt=row["attempts"]),
                    "error": outcome.error,
                    "delay": give_back_delay(self._store_outages, self.limits),
                    "channel": OUTBOX_CHANNEL,
                }
            )
        else:
            status: Literal["failed", "cancelled"] = (
                "failed" if isinstance(outcome, Fail) else "cancelled"
            )
            statement = job_store.end_running_statement(
                {**fence, "status": status, "error": outcome.error}
            )
        written = await self._fetch_written(statement)
        if written is None:
            return
        if isinstance(outcome, Succeed):
            drained.succeeded += 1
        elif isinstance(outcome, Fail):
            drained.failed += 1
        elif isinstance(outcome, Cancel) or written["status"] == "cancelled":
            # A retry or give-back of a job whose cancellation was asked for cancels it.
            drained.cancelled += 1
        elif isinstance(outcome, Retry):
            drained.retried += 1
        else:
            drained.given_back += 1

    def _message(self, claimed: _Claimed, *, attempt: int) -> OutboxMessageParams:
        row = claimed.row
        trace = {k: row[k] for k in ("traceparent", "tracestate") if row[k] is not None}
        return job_message_row(
            self.topology,
            job_id=row["id"],
            job_type=claimed.job_type,
            attempt=attempt,
            trace_headers=trace,
        )

    async def _fetch_written(self, statement: Statement) -> DictRow | None:
        """Run a fenced outcome statement: its row, or None when the fence refused it."""
        async with self.db.session() as session:
            return await fetch_one(session, statement)
