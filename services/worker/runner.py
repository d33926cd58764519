"""Running one claimed job: the handler under a lease, and its outcome, fenced.

The claim handed this worker a lease token. While the handler runs, heartbeats extend
the lease (every third of its length) and notice a cancel request or a lost lease; the
outcome — success with its result and effects, a retry through the outbox, failure,
cancellation, or a lease given back at shutdown — is one statement that only applies if
the job is still ``running`` under that token. A worker that lost its lease (the reaper
gave the job to someone else) therefore writes nothing, whatever its handler did.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

from jobcore.amqp.topology import Topology
from jobcore.attempts import (
    ERROR_MAX_CHARS,
    UnstorableOutcome,
    call_handler,
    effect_rows,
    encode_result,
    error_text,
    storable,
)
from jobcore.channels import OUTBOX_CHANNEL
from jobcore.db import fetch_all, fetch_one
from jobcore.enqueue import job_message_row
from jobcore.errors import DatabaseUnavailable, PermanentError
from jobcore.registry import InvalidPayloadError, JobContext
from jobcore.results import LocalResultStore
from jobcore.retry import backoff_delay
from jobcore.settings import Settings
from jobcore.sql import OutboxMessageParams, Statement
from jobcore.sql.jobs import (
    JOB_END_RUNNING,
    JOB_HEARTBEAT,
    JOB_RELEASE,
    JOB_RETRY,
    JOB_SUCCEED_MANY,
    JobFencedParams,
    JobHeartbeatParams,
    JobRetryParams,
    JobSucceedManyParams,
)
from jobcore.webhooks import completion_params
from services.worker.batching import Batcher
from services.worker.claims import Claim
from services.worker.connections import HeldConnections, TransientConflict
from services.worker.metrics import WorkerMetrics
from services.worker.tracing import handler_span

log = logging.getLogger(__name__)


class StopReason(StrEnum):
    CANCELLED = "cancelled"
    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"


@dataclass(frozen=True, slots=True)
class Success:
    job_id: uuid.UUID
    lease_token: uuid.UUID
    result: str | None  # JSON text
    result_ref: str | None
    effects: list[dict[str, Any]]


@dataclass(slots=True)
class RunningJob:
    claim: Claim
    context: JobContext[Any]
    task: asyncio.Task[Any] | None = None
    stop_reason: StopReason | None = None
    db_trouble_logged: bool = field(default=False)
    # time.monotonic() by which the lease this worker last confirmed may have expired.
    lease_deadline: float = 0.0

    def stop(self, reason: StopReason) -> None:
        """Interrupt the handler; the first reason wins (it decides what gets written)."""
        if self.stop_reason is not None:
            return
        self.stop_reason = reason
        if reason is StopReason.CANCELLED:
            self.context.cancel_requested.set()
        if self.task is not None:
            self.task.cancel()


# The lease is counted from just after the claim returned (or just before a heartbeat was
# sent), so a tenth of it is kept back for the claim statement's own time and clock rates.
LEASE_MARGIN = 0.1


def lease_deadline(claim: Claim, since: float) -> float:
    """When, on this process's monotonic clock, ``claim``'s lease counted from ``since``
    may have run out."""
    return since + claim.job_type.lease * (1 - LEASE_MARGIN)


class JobRunner:
    """Runs claimed jobs and writes their outcomes. One per worker process."""

    def __init__(
        self,
        settings: Settings,
        connections: HeldConnections,
        topology: Topology,
        metrics: WorkerMetrics,
    ) -> None:
        self.settings = settings
        self.connections = connections
        self.topology = topology
        self.metrics = metrics
        # Every outcome statement that ends a job also records its completion webhook.
        self.completion = completion_params(topology, settings)
        self.result_store = LocalResultStore(settings.result_dir)
        self.running: dict[uuid.UUID, RunningJob] = {}
        self.successes: Batcher[Success, bool] = Batcher(self._record_successes)
        self._shutting_down = False

    async def close(self) -> None:
        await self.successes.close()

    # --- requests from outside (cancel listener, shutdown) -------------------------------

    def request_cancel(self, job_id: uuid.UUID) -> bool:
        running = self.running.get(job_id)
        if running is None:
            return False
        log.info("cancelling running job on request", extra=running.claim.log_fields)
        running.stop(StopReason.CANCELLED)
        return True

    def release_all(self) -> None:
        """Shutdown: interrupt every handler still running; their leases are given back."""
        self._shutting_down = True
        for running in list(self.running.values()):
            running.stop(StopReason.SHUTDOWN)

    # --- one job ---------------------------------------------------------------------------

    async def fail_invalid_payload(self, claim: Claim, error: InvalidPayloadError) -> None:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'payload'}: {e['msg']}" for e in error.errors
        )
        text = storable(f"payload no longer validates: {detail}")[:ERROR_MAX_CHARS]
        await self._write_fenced(
            claim,
            "fail",
            JOB_END_RUNNING({**self._fence(claim), "status": "failed", "error": text}),
        )
        self.metrics.processed("failed", claim)

    async def fail_attempt(self, claim: Claim, exc: BaseException, *, during: str) -> None:
        """End an attempt that failed outside its handler as a retryable failure whose
        last_error is ``exc``. Never raises: if even that cannot be written, the lease
        expires and the reaper takes the job back."""
        try:
            await self._attempt_failed(claim, exc, during=during)
        except Exception:
            log.exception(
                "could not record the attempt's failure; its lease will expire",
                extra={**claim.log_fields, "during": during},
            )

    async def run(self, claim: Claim, payload: Any) -> None:
        """Run a claimed job to its outcome. Raises nothing but cancellation: an error
        after the handler (storing its result, writing its outcome) fails the attempt."""
        try:
            await self._run(claim, payload)
        except Exception as exc:
            log.exception("unexpected error after the handler", extra=claim.log_fields)
            await self.fail_attempt(claim, exc, during="recording the outcome")

    async def _run(self, claim: Claim, payload: Any) -> None:
        context: JobContext[Any] = JobContext(
            job_id=claim.job_id,
            job_type=claim.job_type.name,
            payload=payload,
            attempt=claim.attempt,
            max_attempts=claim.max_attempts,
            idempotency_key=str(claim.job_id),
            heartbeat=lambda: self._heartbeat(running),
            result_store=self.result_store,
            settings=self.settings,
        )
        running = RunningJob(claim, context, lease_deadline=lease_deadline(claim, time.monotonic()))
        self.running[claim.job_id] = running
        self.metrics.running_handlers.inc()
        self.metrics.started(claim)
        heartbeats = asyncio.create_task(self._heartbeat_loop(running), name="heartbeat")
        watchdog = asyncio.create_task(self._lease_watchdog(running), name="lease-watchdog")
        running.task = asyncio.create_task(self._call_handler(claim, context), name="handler")
        if claim.cancel_requested:
            running.stop(StopReason.CANCELLED)
        elif self._shutting_down:
            running.stop(StopReason.SHUTDOWN)
        try:
            await self._finish(running)
        finally:
            heartbeats.cancel()
            watchdog.cancel()
            await asyncio.gather(heartbeats, watchdog, return_exceptions=True)
            del self.running[claim.job_id]
            self.metrics.running_handlers.dec()

    async def _call_handler(self, claim: Claim, context: JobContext[Any]) -> Any:
        # A child of the delivery's consume span (this task copied its context).
        with handler_span(claim):
            started = time.monotonic()
            try:
                return await call_handler(claim.job_type, context)
            finally:
                self.metrics.handler_ran(claim.job_type.name, time.monotonic() - started)

    async def _finish(self, running: RunningJob) -> None:
        claim = running.claim
        assert running.task is not None
        try:
            result = await running.task
        except asyncio.CancelledError as exc:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                running.task.cancel()
                raise
            if running.stop_reason is None:  # the handler cancelled itself
                await self._attempt_failed(claim, exc)
            else:
                await self._stopped(running)
        except Exception as exc:
            # A handler that turned our interruption into an error was still interrupted.
            if running.stop_reason is not None:
                await self._stopped(running)
            elif isinstance(exc, PermanentError):
                await self._fail(claim, error_text(exc))
            else:
                await self._attempt_failed(claim, exc)
        else:
            await self._succeed(running, result)

    async def _stopped(self, running: RunningJob) -> None:
        claim = running.claim
        if running.stop_reason is StopReason.CANCELLED:
            if (
                await self._write_fenced(
                    claim,
                    "cancel_running",
                    JOB_END_RUNNING(
                        {**self._fence(claim), "status": "cancelled", "error": "cancelled"}
                    ),
                )
                is not None
            ):
                self._cancelled(claim)
        elif running.stop_reason is StopReason.SHUTDOWN:
            message = self._message(claim, attempt=claim.attempt)
            row = await self._write_fenced(
                claim,
                "release",
                JOB_RELEASE({**self._fence(claim), **message, "channel": OUTBOX_CHANNEL}),
            )
            if row is None:
                return
            if row["status"] == "cancelled":
                self._cancelled(claim)
            else:
                self.metrics.processed("released")
                log.info("gave the job's lease back at shutdown", extra=claim.log_fields)
        else:
            self.metrics.processed("lease_lost")
            log.warning(
                "lease lost while the handler ran; its outcome is discarded",
                extra=claim.log_fields,
            )

    async def _succeed(self, running: RunningJob, result: Any) -> None:
        claim, context = running.claim, running.context
        effects = effect_rows(context, claim.lease_token)
        try:
            encoded = encode_result(result, effects)
        except UnstorableOutcome as exc:
            await self._fail(claim, str(exc))
            return
        result_ref = context.result_ref
        if encoded is not None and len(encoded) > self.settings.inline_result_max_bytes:
            if result_ref is not None:
                await self._fail(
                    claim, "the handler stored a result file and returned a too large result"
                )
                return
            try:
                result_ref = await asyncio.to_thread(
                    self.result_store.put, claim.job_id, encoded, suffix="json"
                )
            except OSError as exc:
                # A full disk or a broken mount: this attempt failed; another may not.
                await self._attempt_failed(claim, exc, during="storing the result")
                return
            encoded = None
        success = Success(
            claim.job_id,
            claim.lease_token,
            encoded.decode() if encoded is not None else None,
            result_ref,
            effects,
        )
        if await self._write_outcome(claim, "succeed", lambda: self.successes.submit(success)):
            self.metrics.processed("succeeded", claim)

    async def _record_successes(self, batch: Sequence[Success]) -> list[bool]:
        params: JobSucceedManyParams = {
            "ids": [s.job_id for s in batch],
            "lease_tokens": [s.lease_token for s in batch],
            "results": [s.result for s in batch],
            "result_refs": [s.result_ref for s in batch],
            "effects": orjson.dumps([e for s in batch for e in s.effects]).decode(),
            **self.completion,
        }
        async with self.connections.connection() as conn:
            won = {row["id"] for row in await fetch_all(conn, JOB_SUCCEED_MANY(params))}
        return [s.job_id in won for s in batch]

    async def _attempt_failed(
        self, claim: Claim, exc: BaseException, *, during: str | None = None
    ) -> None:
        error = error_text(exc) if during is None else f"{during} failed: {error_text(exc)}"
        error = error[:ERROR_MAX_CHARS]
        if claim.attempt >= claim.max_attempts:
            await self._fail(claim, error)
            return
        delay = backoff_delay(
            claim.attempt,
            base=self.settings.retry_backoff_base,
            cap=self.settings.retry_backoff_cap,
        )
        message = self._message(claim, attempt=claim.attempt + 1)
        params: JobRetryParams = {
            **self._fence(claim),
            **message,
            "error": error,
            "delay": delay,
            "channel": OUTBOX_CHANNEL,
        }
        row = await self._write_fenced(claim, "retry", JOB_RETRY(params))
        if row is None:
            return
        if row["status"] == "cancelled":
            self._cancelled(claim)
        else:
            self.metrics.processed("retried")
            self.metrics.retry_scheduled()
            log.info(
                "attempt failed; retry scheduled",
                extra={**claim.log_fields, "error": error, "delay": round(delay, 3)},
            )

    def _cancelled(self, claim: Claim) -> None:
        self.metrics.processed("cancelled", claim)
        log.info("job cancelled while running", extra=claim.log_fields)

    async def _fail(self, claim: Claim, error: str) -> None:
        if (
            await self._write_fenced(
                claim,
                "fail",
                JOB_END_RUNNING({**self._fence(claim), "status": "failed", "error": error}),
            )
            is not None
        ):
            self.metrics.processed("failed", claim)
            log.warning("job failed", extra={**claim.log_fields, "error": error})

    def _message(self, claim: Claim, *, attempt: int) -> OutboxMessageParams:
        return job_message_row(
            self.topology,
            job_id=claim.job_id,
            job_type=claim.job_type,
            attempt=attempt,
            trace_headers=claim.trace_headers,
        )

    def _fence(self, claim: Claim) -> JobFencedParams:
        return {**self.completion, "id": claim.job_id, "lease_token": claim.lease_token}

    async def _write_fenced(
        self, claim: Claim, outcome: str, statement: Statement
    ) -> dict[str, Any] | None:
        """Run an outcome statement; its row, or None when the lease was lost."""
        written: dict[str, Any] | None = None

        async def write() -> bool:
            nonlocal written
            async with self.connections.connection() as conn:
                # Every outcome statement returns a row exactly when its fence let it write.
                row = await fetch_one(conn, statement)
            written = None if row is None else dict(row)
            return written is not None

        return written if await self._write_outcome(claim, outcome, write) else None

    async def _write_outcome(
        self, claim: Claim, outcome: str, write: Callable[[], Awaitable[bool]]
    ) -> bool:
        """Write an outcome; False when the lease was lost (nothing written).

        While the database is unreachable, keep trying for about one lease length: past
        that the reaper has most likely handed the job to another worker anyway.
        """
        deadline = time.monotonic() + claim.job_type.lease
        failures = 0
        while True:
            try:
                won = await write()
                break
            except (DatabaseUnavailable, TransientConflict) as exc:
                # A retry is safe: the fence makes a second run of an applied outcome a no-op.
                failures += 1
                if failures == 1:
                    continue  # a held connection that went stale: at once, on a fresh one
                if time.monotonic() > deadline:
                    log.error(
                        "could not record the job's outcome; its lease will expire",
                        extra={**claim.log_fields, "error": str(exc)},
                    )
                    return False
                if failures == 2:
                    log.warning(
                        "database unavailable while recording an outcome; retrying",
                        extra={**claim.log_fields, "error": str(exc)},
                    )
                await asyncio.sleep(0.5)  # retry pacing while the database is away
        if not won:
            self.metrics.processed("lease_lost")
            log.warning(
                "lease lost before the outcome was written; nothing recorded",
                extra={**claim.log_fields, "outcome": outcome},
            )
        return won

    # --- the lease ---------------------------------------------------------------------------

    async def _heartbeat_loop(self, running: RunningJob) -> None:
        interval = running.claim.job_type.lease / 3
        while running.stop_reason is None:
            await asyncio.sleep(interval)  # the heartbeat period: a third of the lease
            await self._heartbeat(running)

    async def _lease_watchdog(self, running: RunningJob) -> None:
        """Stop the handler once its lease may have expired without a renewal.

        While the database is unreachable the heartbeats fail (or hang until a timeout),
        the reaper of a worker that can reach it may reset the expired lease, and another
        worker may start the job: this handler must not still be running then. Its outcome
        would be fenced out anyway; stopping it keeps the handler's side effects to one run
        at a time."""
        while running.stop_reason is None:
            remaining = running.lease_deadline - time.monotonic()
            if remaining <= 0:
                log.warning(
                    "lease expired without a renewal; stopping the handler",
                    extra=running.claim.log_fields,
                )
                running.stop(StopReason.LEASE_LOST)
                return
            await asyncio.sleep(remaining)  # until the deadline, which a heartbeat may move

    async def _heartbeat(self, running: RunningJob) -> None:
        """Extend the lease; stop the handler if the lease is gone or cancel was asked for."""
        claim = running.claim
        params: JobHeartbeatParams = {
            "id": claim.job_id,
            "lease_token": claim.lease_token,
            "lease": claim.job_type.lease,
        }
        sent = time.monotonic()
        try:
            async with self.connections.connection() as conn:
                row = await fetch_one(conn, JOB_HEARTBEAT(params))
        except DatabaseUnavailable as exc:
            if not running.db_trouble_logged:
                running.db_trouble_logged = True
                log.warning(
                    "heartbeat failed: database unavailable",
                    extra={**claim.log_fields, "error": str(exc)},
                )
            return
        if row is None:
            running.stop(StopReason.LEASE_LOST)
            return
        # The database set the new expiry at or after `sent`: counting from `sent` is safe.
        running.lease_deadline = max(running.lease_deadline, lease_deadline(claim, sent))
        if row["cancel_requested_at"] is not None:
            running.stop(StopReason.CANCELLED)
