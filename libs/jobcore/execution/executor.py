"""The execution core: a claimed job's payload, its handler under a lease, and its
outcome, fenced. The worker service and the testing kit's InlineWorker both run it.

:meth:`JobExecutor.claim` claims messages (:mod:`jobcore.execution.claims`): each answer
is a :class:`~jobcore.execution.claims.ClaimedJob`, the one shape of the job from there to
its outcome, or why none was claimed. :meth:`JobExecutor.execute` then runs one: its
payload loaded (a payload stored by reference read from the result store) and validated,
the handler called, its outcome decided (:mod:`jobcore.execution.outcomes`) and recorded.
A runner that settles a delivery between those steps (the worker acknowledges it once the
payload loaded, dead-letters it when the payload no longer validates) calls them itself:
:meth:`~JobExecutor.payload_of`, then :meth:`~JobExecutor.run` or
:meth:`~JobExecutor.end_unstarted`.

The claim handed this runner a lease token. While the handler runs, heartbeats extend
the lease (every third of its length) and notice a cancel request or a lost lease; the
outcome — success with its result and effects, a retry through the outbox, failure,
cancellation, or a lease given back at shutdown — is one statement that only applies if
the job is still ``running`` under that token. A runner that lost its lease (the reaper
gave the job to someone else) therefore writes nothing, whatever its handler did.

A handler may instead record its success itself, in its own transaction
(``ctx.transaction()``, :mod:`jobcore.execution.transaction`): the same fenced success statement
runs on that transaction's connection before it commits, and the attempt is then over; nothing
else is written for it. Progress reports (``ctx.progress``) are throttled and fenced
writes of their own (:mod:`jobcore.execution.progress_reports`), flushed before the
outcome.

What stays with the runner: where connections come from (the worker holds a few for its
hot path), how successes are grouped into commits (the worker batches them; by default
each commits alone), and what is counted (:class:`AttemptMetrics`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import orjson
from opentelemetry.trace import Span
from pydantic import BaseModel

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import AsyncConn, Database, fetch_one
from jobcore.database.store import (
    JOBS_CONSUMER,
    JobFencedParams,
    JobHeartbeatParams,
    JobProgressSetParams,
    JobReleaseParams,
    JobRetryParams,
    JobSnoozeParams,
    JobSucceedManyParams,
    OutboxMessageParams,
    Statement,
    job_store,
)
from jobcore.execution.attempts import call_handler, error_text
from jobcore.execution.claims import (
    ClaimAnswer,
    ClaimedJob,
    ClaimRequest,
    OutboxScope,
    claim_batch,
    claim_from_outbox,
    resume_tokens,
)
from jobcore.execution.completion_webhooks import completion_params
from jobcore.execution.dependencies import read_dependency_results
from jobcore.execution.job_messages import job_message_row
from jobcore.execution.outcomes import (
    CANCEL,
    Fail,
    GiveBack,
    OutcomeLimits,
    Retry,
    Succeed,
    attempt_failed,
    give_back_delay,
    handler_failed,
    invalid_payload,
    snooze_cap_error,
    store_failed,
    success,
)
from jobcore.execution.payloads import read_payload
from jobcore.execution.progress_reports import JobProgress
from jobcore.execution.registry import InvalidPayloadError, JobContext
from jobcore.execution.transaction import JobTransaction
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.errors import (
    DatabaseUnavailable,
    LeaseLost,
    PermanentError,
    ServiceStateError,
    Snooze,
    StoreRefused,
    TransientConflict,
)
from jobcore.kernel.settings import Settings
from jobcore.storage.objectstore import open_result_store
from jobcore.storage.results import ResultNotFound, ResultStore
from jobcore.telemetry.traces import span_if_enabled, tracing_enabled

log = logging.getLogger(__name__)

# Storing a large result: tries within the lease before the job is given back (the result
# is in memory, and a blip of the store should not cost a whole run of the handler), and
# the pause before the second one (doubled before each next).
RESULT_PUT_TRIES = 3
RESULT_PUT_PAUSE = 0.2


class ResultNotRecordable(PermanentError):
    """The handler's result or effects cannot be recorded."""


class StopReason(StrEnum):
    CANCELLED = "cancelled"
    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"


# Why a payload cannot be loaded: the result store failed (OSError: the object store is
# unavailable, the local directory unreadable) or the object is gone.
PAYLOAD_UNREADABLE: tuple[type[Exception], ...] = (OSError, ResultNotFound)


@dataclass(frozen=True, slots=True)
class Success:
    """A success waiting for its commit (its result already stored when large)."""

    job: ClaimedJob
    outcome: Succeed


RecordSuccesses = Callable[[Sequence[Success]], Awaitable[Sequence[bool]]]


class SuccessCommits(Protocol):
    """Successes grouped into commits: each submitted one is answered (whether its fence
    let it write) after the commit it went out in."""

    async def submit(self, item: Success, /) -> bool: ...

    async def close(self) -> None: ...


class OneCommitEach:
    """Each success commits alone, at once (the testing kit's runner)."""

    def __init__(self, record: RecordSuccesses) -> None:
        self._record = record

    async def submit(self, item: Success, /) -> bool:
        [won] = await self._record([item])
        return won

    async def close(self) -> None:
        return None


class Connections(Protocol):
    """Where the core's statements run: an autocommit connection per use, its driver
    errors translated (:class:`~jobcore.kernel.errors.DatabaseUnavailable`, and
    :class:`~jobcore.kernel.errors.TransientConflict` where the source tells deadlocks apart)."""

    def connection(self) -> AbstractAsyncContextManager[AsyncConn]: ...


class AttemptMetrics(Protocol):
    """What the core reports as attempts go (the worker's Prometheus metrics; the testing
    kit's counts). ``processed`` outcomes: succeeded, failed, cancelled, retried,
    released, store_unavailable, lease_lost."""

    def started(self, job: ClaimedJob) -> None: ...

    def handler_ran(self, job_type: str, seconds: float) -> None: ...

    def processed(self, outcome: str, job: ClaimedJob | None = None) -> None: ...

    def retry_scheduled(self) -> None: ...


@dataclass(slots=True)
class _Attempt:
    job: ClaimedJob
    context: JobContext[Any]
    progress: JobProgress
    task: asyncio.Task[Any] | None = None
    stop_reason: StopReason | None = None
    db_trouble_logged: bool = field(default=False)
    # time.monotonic() by which the lease this worker last confirmed may have expired.
    lease_deadline: float = 0.0
    # The handler's transaction (ctx.transaction) is open / committed the job's success:
    # once committed, the job is succeeded and nothing else is written for this attempt.
    in_transaction: bool = False
    committed: bool = False

    def stop(self, reason: StopReason) -> None:
        """Interrupt the handler; the first reason wins (it decides what gets written).
        Once its transaction committed the job is succeeded: there is nothing to stop."""
        if self.stop_reason is not None or self.committed:
            return
        self.stop_reason = reason
        if reason is StopReason.CANCELLED:
            self.context.cancel_requested.set()
        if self.task is not None:
            self.task.cancel()


# The lease is counted from just after the claim returned (or just before a heartbeat was
# sent), so a tenth of it is kept back for the claim statement's own time and clock rates.
LEASE_MARGIN = 0.1


def lease_deadline(job: ClaimedJob, since: float) -> float:
    """When, on this process's monotonic clock, ``job``'s lease counted from ``since``
    may have run out."""
    return since + job.job_type.lease * (1 - LEASE_MARGIN)


class JobExecutor:
    """Claims jobs, runs them and records their outcomes. One per runner (a worker
    process, an InlineWorker)."""

    def __init__(
        self,
        settings: Settings,
        connections: Connections,
        topology: Topology,
        metrics: AttemptMetrics,
        *,
        worker_id: str,
        transactions: Database | None = None,
        success_commits: Callable[[RecordSuccesses], SuccessCommits] = OneCommitEach,
        result_store: ResultStore | None = None,
    ) -> None:
        self.settings = settings
        self.connections = connections
        self.worker_id = worker_id
        # Handlers' transactions (ctx.transaction): in the worker a pool of their own, so
        # a handler that holds one never takes a connection the claims, outcomes and
        # heartbeats need.
        self.transactions = transactions
        self.topology = topology
        self.metrics = metrics
        # Every outcome statement that ends a job also records its completion webhook.
        self.completion = completion_params(topology, settings)
        self.limits = OutcomeLimits.from_settings(settings)
        self.result_store = (
            result_store if result_store is not None else open_result_store(settings)
        )
        self.running: dict[uuid.UUID, _Attempt] = {}
        self.successes = success_commits(self.record_successes)
        self._shutting_down = False
        # Store outages met in a row by this worker: the delay before a job given back
        # for one grows with it, so jobs do not hot-loop against a store that is down.
        self._store_outages = 0

    async def close(self) -> None:
        await self.successes.close()

    # --- requests from outside (cancel listener, shutdown) -------------------------------

    def request_cancel(self, job_id: uuid.UUID) -> bool:
        running = self.running.get(job_id)
        if running is None:
            return False
        log.info("cancelling running job on request", extra=running.job.log_fields)
        running.stop(StopReason.CANCELLED)
        return True

    def cancellable(self) -> list[uuid.UUID]:
        """The jobs running here that nothing asked to stop yet."""
        return [job_id for job_id, running in self.running.items() if running.stop_reason is None]

    def release_all(self) -> None:
        """Shutdown: interrupt every handler still running; their leases are given back."""
        self._shutting_down = True
        for running in list(self.running.values()):
            running.stop(StopReason.SHUTDOWN)

    # --- the claim -------------------------------------------------------------------------

    async def claim(self, requests: Sequence[ClaimRequest]) -> list[ClaimAnswer]:
        """Claim the requests' messages in one commit per round (one round unless a message
        came twice): a job claimed, or why not, per request."""
        async with self.connections.connection() as conn:
            return await claim_batch(
                conn,
                requests,
                exchange=self.topology.jobs_exchange,
                worker_id=self.worker_id,
            )

    async def claim_from_outbox(
        self, scope: OutboxScope, limit: int, *, window: float
    ) -> list[ClaimAnswer]:
        """Take up to ``limit`` fresh outbox rows of ``scope`` that no relay holds and claim
        their messages in one commit (direct pickup): an answer per row taken.

        If the connection breaks, the commit may have happened unanswered: the jobs running
        under the lease tokens drawn for it are then its own, and they are resumed (their
        leases renewed), so none waits for the reaper; if it did not commit, there are
        none, and the rows are still in the outbox for the relays."""
        tokens = [uuid.uuid4() for _ in range(limit)]
        try:
            async with self.connections.connection() as conn:
                return await claim_from_outbox(
                    conn,
                    scope,
                    tokens,
                    window=window,
                    exchange=self.topology.jobs_exchange,
                    worker_id=self.worker_id,
                )
        except DatabaseUnavailable:
            async with self.connections.connection() as conn:
                return list(await resume_tokens(conn, scope, tokens))

    # --- one job ---------------------------------------------------------------------------

    async def execute(self, job: ClaimedJob) -> None:
        """Load the claimed job's payload, run it and record its outcome; if the payload
        cannot be loaded, record why. Raises nothing but cancellation."""
        try:
            try:
                payload = await self.payload_of(job)
            except (InvalidPayloadError, OSError, ResultNotFound) as exc:
                await self.end_unstarted(job, exc)
                return
        except Exception as exc:
            log.exception("unexpected error before the handler", extra=job.log_fields)
            await self.fail_attempt(job, exc, during="starting the job")
            return
        await self.run(job, payload)

    async def payload_of(self, job: ClaimedJob) -> BaseModel:
        """The job's payload (the row's, or the one stored by reference, ``payload_ref``),
        validated by its type: InvalidPayloadError when it no longer validates, one of
        :data:`PAYLOAD_UNREADABLE` when it cannot be read."""
        raw = job.raw_payload
        if job.payload_ref is not None:
            raw = await read_payload(self.result_store, job.raw_payload, job.payload_ref)
            self._store_outages = 0
        # By the model's own rules, not strictly as an enqueue checks a payload: a job
        # accepted before payloads were strict (or enqueued through SQL, unchecked) runs
        # as it always would have (docs/handlers.md, "Payloads are validated strictly").
        payload: BaseModel = job.job_type.validate_payload(raw)
        return payload

    async def end_unstarted(self, job: ClaimedJob, exc: BaseException) -> None:
        """Record the outcome of a job whose payload :meth:`payload_of` refused: a payload
        that no longer validates fails the job (every attempt would fail); an unreadable
        one is an attempt failed or, the object store away, the job given back (that one
        never raises: if it cannot be written, the lease expires)."""
        if isinstance(exc, InvalidPayloadError):
            await self.fail_invalid_payload(job, exc)
        else:
            await self.after_store_error(job, exc, during="reading the payload")

    async def fail_invalid_payload(self, job: ClaimedJob, error: InvalidPayloadError) -> None:
        await self._write_fenced(
            job,
            "fail",
            job_store.end_running_statement(
                {**self._fence(job), "status": "failed", "error": invalid_payload(error).error}
            ),
        )
        self.metrics.processed("failed", job)

    async def after_store_error(self, job: ClaimedJob, exc: BaseException, *, during: str) -> None:
        """The result store failed (``exc``) while ``during``: the job is given back if the
        object store is unavailable, else the attempt failed
        (:func:`~jobcore.execution.outcomes.store_failed`). Never raises: if even that cannot
        be written, the lease expires and the reaper takes the job back."""
        outcome = store_failed(
            exc,
            during=during,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            limits=self.limits,
            give_backs=job.store_give_backs,
        )
        try:
            await self._apply(job, outcome)
        except Exception:
            log.exception(
                "could not record the attempt's failure; its lease will expire",
                extra={**job.log_fields, "during": during},
            )

    async def give_back(self, job: ClaimedJob, outcome: GiveBack) -> None:
        """The object store was unavailable: the job goes back to pending without consuming
        an attempt, even its last one (:class:`~jobcore.execution.outcomes.GiveBack`), its
        new message due after a delay that grows with the outages met in a row, last_error
        saying why. Never raises: if even that cannot be written, the lease expires and the
        reaper takes the job back."""
        self._store_outages += 1
        delay = give_back_delay(self._store_outages, self.limits)
        error = outcome.error
        params: JobReleaseParams = {
            **self._fence(job),
            **self._message(job, attempt=job.attempt),
            "channel": OUTBOX_CHANNEL,
            "delay": delay,
            "error": error,
        }
        try:
            row = await self._write_fenced(
                job,
                "release",
                job_store.release_statement(params),
                message_id=params["message_id"],
            )
        except Exception:
            log.exception(
                "could not give the job back after a store outage; its lease will expire",
                extra={**job.log_fields, "during": outcome.during},
            )
            return
        if row is None:
            return
        if row["status"] == "cancelled":
            self._cancelled(job)
        else:
            self.metrics.processed("store_unavailable", job)
            log.warning(
                "object store unavailable; job given back without consuming an attempt",
                extra={**job.log_fields, "error": error, "delay": round(delay, 3)},
            )

    async def fail_attempt(self, job: ClaimedJob, exc: BaseException, *, during: str) -> None:
        """End an attempt that failed outside its handler as a retryable failure whose
        last_error is ``exc``. Never raises: if even that cannot be written, the lease
        expires and the reaper takes the job back."""
        try:
            await self._attempt_failed(job, exc, during=during)
        except Exception:
            log.exception(
                "could not record the attempt's failure; its lease will expire",
                extra={**job.log_fields, "during": during},
            )

    async def run(self, job: ClaimedJob, payload: Any) -> None:
        """Run a claimed job to its outcome. Raises nothing but cancellation: an error
        after the handler (storing its result, writing its outcome) fails the attempt."""
        try:
            await self._run(job, payload)
        except Exception as exc:
            log.exception("unexpected error after the handler", extra=job.log_fields)
            await self.fail_attempt(job, exc, during="recording the outcome")

    async def _run(self, job: ClaimedJob, payload: Any) -> None:
        context: JobContext[Any] = JobContext(
            job_id=job.job_id,
            job_type=job.job_type.name,
            payload=payload,
            payloads=[job.job_type.validate_payload(raw) for raw in job.raw_payloads or ()],
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            idempotency_key=str(job.job_id),
            heartbeat=lambda: self._heartbeat(running),
            result_store=self.result_store,
            settings=self.settings,
            lease_token=job.lease_token,
            open_transaction=lambda: self._transaction(running),
            report_progress=lambda fraction, message: running.progress.report(fraction, message),
            snoozes=job.snoozes,
            read_dependencies=lambda: read_dependency_results(
                self.connections.connection, self.result_store, job.job_id
            ),
        )
        progress = JobProgress(
            lambda fraction, message: self._write_progress(running, fraction, message),
            log_fields=job.log_fields,
        )
        running = _Attempt(
            job, context, progress, lease_deadline=lease_deadline(job, time.monotonic())
        )
        self.running[job.job_id] = running
        self.metrics.started(job)
        # The lease keepers (heartbeats, watchdog) start only once a third of the lease has
        # gone: the first heartbeat is due then and the watchdog's deadline is later still.
        # Most jobs end before, and then cost a timer instead of two tasks created,
        # cancelled and gathered.
        keepers: list[asyncio.Task[None]] = []
        timer = asyncio.get_running_loop().call_later(
            job.job_type.lease / 3, self._keep_lease, running, keepers
        )
        running.task = asyncio.create_task(self._call_handler(job, context), name="handler")
        if job.cancel_requested:
            running.stop(StopReason.CANCELLED)
        elif self._shutting_down:
            running.stop(StopReason.SHUTDOWN)
        try:
            await self._finish(running)
        finally:
            running.progress.abandon()
            timer.cancel()
            if keepers:
                for keeper in keepers:
                    keeper.cancel()
                await asyncio.gather(*keepers, return_exceptions=True)
            del self.running[job.job_id]

    async def _call_handler(self, job: ClaimedJob, context: JobContext[Any]) -> Any:
        # In the worker, a child of the delivery's process span (this task copied its context).
        with handler_span(job):
            started = time.monotonic()
            try:
                return await call_handler(job.job_type, context)
            finally:
                self.metrics.handler_ran(job.job_type.name, time.monotonic() - started)

    async def _finish(self, running: _Attempt) -> None:
        job = running.job
        assert running.task is not None
        result: Any = None
        error: BaseException | None = None
        try:
            result = await running.task
        except asyncio.CancelledError as exc:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                running.task.cancel()
                raise
            error = exc
        except Exception as exc:
            error = exc
        # The last progress reported goes out before the outcome (which ends the lease).
        await running.progress.close()
        if running.committed:
            self._after_commit(running, result, error)
        elif isinstance(error, asyncio.CancelledError):
            if running.stop_reason is None:  # the handler cancelled itself
                await self._attempt_failed(job, error)
            else:
                await self._stopped(running)
        elif error is not None:
            # A handler that turned our interruption into an error was still interrupted.
            if running.stop_reason is not None:
                await self._stopped(running)
            elif isinstance(error, LeaseLost):
                self.metrics.processed("lease_lost", job)
                log.warning(
                    "lease lost before the handler's transaction committed; it was rolled back",
                    extra=job.log_fields,
                )
            elif isinstance(error, Snooze):
                await self._snooze(job, error)
            else:
                outcome = handler_failed(
                    error,
                    attempt=job.attempt,
                    max_attempts=job.max_attempts,
                    limits=self.limits,
                    give_backs=job.store_give_backs,
                )
                await self._apply(job, outcome)
        elif isinstance(result, Snooze):
            await self._snooze(job, result)
        else:
            await self._succeed(running, result)

    def _after_commit(self, running: _Attempt, result: Any, error: BaseException | None) -> None:
        """The handler's transaction recorded the success: nothing is left to write."""
        fields = running.job.log_fields
        if isinstance(error, Exception):
            log.warning(
                "the handler failed after its transaction committed; the job stays succeeded",
                extra={**fields, "error": error_text(error)},
            )
        elif result is not None:
            log.warning(
                "the handler returned a result after its transaction committed; it is "
                "ignored (set it with tx.set_result)",
                extra=fields,
            )

    # --- ctx.transaction(): the handler's writes and the success, one commit ----------------

    @contextlib.asynccontextmanager
    async def _transaction(self, running: _Attempt) -> AsyncIterator[JobTransaction]:
        job = running.job
        if self.transactions is None:
            raise ServiceStateError("this worker runs no handler transactions")
        if running.committed:
            raise ServiceStateError("this attempt's transaction has committed: the job succeeded")
        if running.in_transaction:
            raise ServiceStateError("this attempt's transaction is already open")
        running.in_transaction = True
        try:
            async with self.transactions.connection() as conn, conn.transaction():
                tx = JobTransaction(conn, running.context.fence)
                yield tx
                # The handler's block ended without an error: its success joins the
                # transaction, fenced by the lease token; no row means the lease is lost
                # and raising rolls everything back.
                await running.progress.flush()
                success = await self._success_of(running, tx.result)
                won = await job_store.succeed_many(conn, self._success_params([success]))
                if not won:
                    raise LeaseLost(
                        f"the lease of job {job.job_id} attempt {job.attempt} was lost: "
                        "its transaction was rolled back"
                    )
            running.committed = True
            running.progress.abandon()  # the job is succeeded: later reports have nowhere to go
            self.metrics.processed("succeeded", job)
        finally:
            running.in_transaction = False

    async def _stopped(self, running: _Attempt) -> None:
        job = running.job
        if running.stop_reason is StopReason.CANCELLED:
            if (
                await self._write_fenced(
                    job,
                    "cancel_running",
                    job_store.end_running_statement(
                        {**self._fence(job), "status": "cancelled", "error": CANCEL.error}
                    ),
                )
                is not None
            ):
                self._cancelled(job)
        elif running.stop_reason is StopReason.SHUTDOWN:
            message = self._message(job, attempt=job.attempt)
            row = await self._write_fenced(
                job,
                "release",
                job_store.release_statement(
                    {
                        **self._fence(job),
                        **message,
                        "channel": OUTBOX_CHANNEL,
                        "delay": 0.0,
                        "error": None,
                    }
                ),
                message_id=message["message_id"],
            )
            if row is None:
                return
            if row["status"] == "cancelled":
                self._cancelled(job)
            else:
                self.metrics.processed("released", job)
                log.info("gave the job's lease back at shutdown", extra=job.log_fields)
        else:
            self.metrics.processed("lease_lost", job)
            log.warning(
                "lease lost while the handler ran; its outcome is discarded",
                extra=job.log_fields,
            )

    async def _succeed(self, running: _Attempt, result: Any) -> None:
        job = running.job
        try:
            success = await self._success_of(running, result)
        except ResultNotRecordable as exc:
            await self._fail(job, str(exc))
            return
        except OSError as exc:
            # The object store is down (the job is given back: it does not cost an
            # attempt, up to a bound), or it refused the result, or the local result
            # directory cannot be written (the attempt failed).
            outcome = store_failed(
                exc,
                during="storing the result",
                attempt=job.attempt,
                max_attempts=job.max_attempts,
                limits=self.limits,
                give_backs=job.store_give_backs,
            )
            await self._apply(job, outcome)
            return
        tries = 0

        async def write() -> bool:
            nonlocal tries
            tries += 1
            won = await self.successes.submit(success)
            if not won and tries > 1:
                won = await self._earlier_outcome(job, None) == "succeeded"
            return won

        if await self._write_outcome(job, "succeed", write):
            self.metrics.processed("succeeded", job)

    async def _success_of(self, running: _Attempt, result: Any) -> Success:
        """What recording the attempt's success writes: the result (inline, or stored when
        large) and the effects. ResultNotRecordable when they cannot be recorded, OSError
        (StoreUnavailable: the object store) when the result store failed."""
        job = running.job
        outcome = success(result, running.context, job.lease_token, self.limits)
        if isinstance(outcome, Fail):
            raise ResultNotRecordable(outcome.error)
        if outcome.to_store is not None:
            outcome = outcome.stored(await self._put_result(running, outcome.to_store))
        return Success(job, outcome)

    async def _put_result(self, running: _Attempt, encoded: bytes) -> str:
        """Store a large result, trying again a few times (within the lease) when the
        store fails: the result exists only in memory. The last OSError (StoreUnavailable
        from the object store) when it never took it; StoreRefused at once, as trying it
        again would be refused again."""
        job = running.job
        pause = RESULT_PUT_PAUSE
        for tried in range(1, RESULT_PUT_TRIES + 1):
            try:
                key = await asyncio.to_thread(
                    self.result_store.put,
                    job.job_id,
                    encoded,
                    suffix="json",
                    lease_token=job.lease_token,
                )
            except StoreRefused:
                raise
            except OSError as exc:
                if tried == RESULT_PUT_TRIES or time.monotonic() + pause > running.lease_deadline:
                    raise
                log.info(
                    "storing the result failed; trying again",
                    extra={**job.log_fields, "error": error_text(exc), "tried": tried},
                )
                await asyncio.sleep(pause)  # pacing between tries against a failing store
                pause *= 2
            else:
                self._store_outages = 0
                return key
        raise AssertionError("unreachable")

    def _success_params(self, batch: Sequence[Success]) -> JobSucceedManyParams:
        return {
            "ids": [s.job.job_id for s in batch],
            "lease_tokens": [s.job.lease_token for s in batch],
            "results": [s.outcome.result for s in batch],
            "result_refs": [s.outcome.result_ref for s in batch],
            "effects": orjson.dumps([e for s in batch for e in s.outcome.effects]).decode(),
            **self.completion,
        }

    async def record_successes(self, batch: Sequence[Success]) -> list[bool]:
        """Record the successes in one statement: whether each one's fence let it write."""
        params = self._success_params(batch)
        async with self.connections.connection() as conn:
            won = {row["id"] for row in await job_store.succeed_many(conn, params)}
        return [s.job.job_id in won for s in batch]

    async def _attempt_failed(
        self, job: ClaimedJob, exc: BaseException, *, during: str | None = None
    ) -> None:
        outcome = attempt_failed(
            exc,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            limits=self.limits,
            during=during,
        )
        await self._apply(job, outcome)

    async def _apply(self, job: ClaimedJob, outcome: Retry | Fail | GiveBack) -> None:
        """Write an attempt's failure as :mod:`jobcore.execution.outcomes` decided it."""
        if isinstance(outcome, Retry):
            await self._retry(job, outcome)
        elif isinstance(outcome, Fail):
            await self._fail(job, outcome.error)
        else:
            await self.give_back(job, outcome)

    async def _retry(self, job: ClaimedJob, outcome: Retry) -> None:
        error, delay = outcome.error, outcome.delay
        message = self._message(job, attempt=job.attempt + 1)
        params: JobRetryParams = {
            **self._fence(job),
            **message,
            "error": error,
            "delay": delay,
            "channel": OUTBOX_CHANNEL,
        }
        row = await self._write_fenced(
            job, "retry", job_store.retry_statement(params), message_id=message["message_id"]
        )
        if row is None:
            return
        if row["status"] == "cancelled":
            self._cancelled(job)
        else:
            self.metrics.processed("retried", job)
            self.metrics.retry_scheduled()
            log.info(
                "attempt failed; retry scheduled",
                extra={**job.log_fields, "error": error, "delay": round(delay, 3)},
            )

    async def _snooze(self, job: ClaimedJob, snooze: Snooze) -> None:
        """The handler asked to run the job again in ``snooze.seconds``: pending again,
        its attempt unspent (the new message carries the same attempt number), unless the
        snooze is past its type's cap (then it fails) or its cancellation was asked for
        (JOB_SNOOZE)."""
        cap = job.job_type.max_snoozes
        if cap is None:
            cap = self.settings.max_snoozes
        message = self._message(job, attempt=job.attempt)
        params: JobSnoozeParams = {
            **self._fence(job),
            **message,
            "channel": OUTBOX_CHANNEL,
            "delay": snooze.seconds,
            "max_snoozes": cap,
            "cap_error": snooze_cap_error(cap, snooze.seconds),
        }
        row = await self._write_fenced(
            job, "snooze", job_store.snooze_statement(params), message_id=message["message_id"]
        )
        if row is None:
            return
        if row["status"] == "cancelled":
            self._cancelled(job)
        elif row["status"] == "failed":
            self.metrics.processed("failed", job)
            log.warning("job failed: past its snooze cap", extra={**job.log_fields, "cap": cap})
        else:
            self.metrics.processed("snoozed", job)
            log.info(
                "job snoozed; its attempt is not spent",
                extra={**job.log_fields, "delay": snooze.seconds},
            )

    def _cancelled(self, job: ClaimedJob) -> None:
        self.metrics.processed("cancelled", job)
        log.info("job cancelled while running", extra=job.log_fields)

    async def _fail(self, job: ClaimedJob, error: str) -> None:
        if (
            await self._write_fenced(
                job,
                "fail",
                job_store.end_running_statement(
                    {**self._fence(job), "status": "failed", "error": error}
                ),
            )
            is not None
        ):
            self.metrics.processed("failed", job)
            log.warning("job failed", extra={**job.log_fields, "error": error})

    def _message(self, job: ClaimedJob, *, attempt: int) -> OutboxMessageParams:
        return job_message_row(
            self.topology,
            job_id=job.job_id,
            job_type=job.job_type,
            attempt=attempt,
            trace_headers=job.trace_headers,
        )

    def _fence(self, job: ClaimedJob) -> JobFencedParams:
        return {**self.completion, "id": job.job_id, "lease_token": job.lease_token}

    async def _write_fenced(
        self,
        job: ClaimedJob,
        outcome: str,
        statement: Statement,
        *,
        message_id: uuid.UUID | None = None,
    ) -> dict[str, Any] | None:
        """Run an outcome statement; its row, or None when the lease was lost.
        ``message_id``: the next message the statement writes, if it writes one."""
        written: dict[str, Any] | None = None
        tries = 0

        async def write() -> bool:
            nonlocal written, tries
            tries += 1
            async with self.connections.connection() as conn:
                # Every outcome statement returns a row exactly when its fence let it write.
                row = await fetch_one(conn, statement)
            written = None if row is None else dict(row)
            if written is None and tries > 1:
                status = await self._earlier_outcome(job, message_id)
                written = None if status is None else {"status": status}
            return written is not None

        return written if await self._write_outcome(job, outcome, write) else None

    async def _earlier_outcome(self, job: ClaimedJob, message_id: uuid.UUID | None) -> str | None:
        """After a try that broke off, a retry found no row to update: the status the
        earlier try left if it committed unanswered (so the outcome counts as written),
        None if the lease went to someone else (JOB_OUTCOME_WRITTEN)."""
        async with self.connections.connection() as conn:
            row = await job_store.outcome_written(
                conn,
                {
                    "id": job.job_id,
                    "lease_token": job.lease_token,
                    "message_id": message_id,
                    "consumer": JOBS_CONSUMER,
                },
            )
        status = None if row is None else row["status"]
        if status is not None:
            log.info(
                "the outcome's first try committed unanswered; counted as written",
                extra={**job.log_fields, "status": status},
            )
        return status

    async def _write_outcome(
        self, job: ClaimedJob, outcome: str, write: Callable[[], Awaitable[bool]]
    ) -> bool:
        """Write an outcome; False when the lease was lost (nothing written).

        While the database is unreachable, keep trying for about one lease length: past
        that the reaper has most likely handed the job to another worker anyway.
        """
        deadline = time.monotonic() + job.job_type.lease
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
                        extra={**job.log_fields, "error": str(exc)},
                    )
                    return False
                if failures == 2:
                    log.warning(
                        "database unavailable while recording an outcome; retrying",
                        extra={**job.log_fields, "error": str(exc)},
                    )
                await asyncio.sleep(0.5)  # retry pacing while the database is away
        if not won:
            self.metrics.processed("lease_lost", job)
            log.warning(
                "lease lost before the outcome was written; nothing recorded",
                extra={**job.log_fields, "outcome": outcome},
            )
        return won

    # --- the lease ---------------------------------------------------------------------------

    def _keep_lease(self, running: _Attempt, keepers: list[asyncio.Task[None]]) -> None:
        """A third of the lease has gone and the job still runs: start heartbeating (the
        first one now) and watching the lease's deadline."""
        if running.stop_reason is not None or running.committed:
            return
        keepers.append(asyncio.create_task(self._heartbeat_loop(running), name="heartbeat"))
        keepers.append(asyncio.create_task(self._lease_watchdog(running), name="lease-watchdog"))

    async def _heartbeat_loop(self, running: _Attempt) -> None:
        interval = running.job.job_type.lease / 3
        while running.stop_reason is None and not running.committed:
            await self._heartbeat(running)
            await asyncio.sleep(interval)  # the heartbeat period: a third of the lease

    async def _lease_watchdog(self, running: _Attempt) -> None:
        """Stop the handler once its lease may have expired without a renewal.

        While the database is unreachable the heartbeats fail (or hang until a timeout),
        the reaper of a worker that can reach it may reset the expired lease, and another
        worker may start the job: this handler must not still be running then. Its outcome
        would be fenced out anyway; stopping it keeps the handler's side effects to one run
        at a time."""
        while running.stop_reason is None and not running.committed:
            remaining = running.lease_deadline - time.monotonic()
            if remaining <= 0:
                log.warning(
                    "lease expired without a renewal; stopping the handler",
                    extra=running.job.log_fields,
                )
                running.stop(StopReason.LEASE_LOST)
                return
            await asyncio.sleep(remaining)  # until the deadline, which a heartbeat may move

    async def _heartbeat(self, running: _Attempt) -> None:
        """Extend the lease; stop the handler if the lease is gone or cancel was asked for."""
        job = running.job
        if running.committed:
            return  # the job is succeeded: no lease left to extend
        params: JobHeartbeatParams = {
            "id": job.job_id,
            "lease_token": job.lease_token,
            "lease": job.job_type.lease,
        }
        sent = time.monotonic()
        try:
            async with self.connections.connection() as conn:
                row = await job_store.heartbeat(conn, params)
        except DatabaseUnavailable as exc:
            if not running.db_trouble_logged:
                running.db_trouble_logged = True
                log.warning(
                    "heartbeat failed: database unavailable",
                    extra={**job.log_fields, "error": str(exc)},
                )
            return
        if row is None:
            running.stop(StopReason.LEASE_LOST)
            return
        # The database set the new expiry at or after `sent`: counting from `sent` is safe.
        running.lease_deadline = max(running.lease_deadline, lease_deadline(job, sent))
        if row["cancel_requested_at"] is not None:
            running.stop(StopReason.CANCELLED)

    # --- progress ------------------------------------------------------------------------------

    async def _write_progress(
        self, running: _Attempt, fraction: float, message: str | None
    ) -> None:
        """Write a progress report under the lease (JobProgress throttles the calls); a lease
        found lost stops the handler, as a heartbeat would."""
        job = running.job
        params: JobProgressSetParams = {
            "id": job.job_id,
            "lease_token": job.lease_token,
            "fraction": fraction,
            "message": message,
        }
        async with self.connections.connection() as conn:
            row = await job_store.set_progress(conn, params)
        if row is None and not running.committed and not running.in_transaction:
            running.stop(StopReason.LEASE_LOST)


def handler_span(job: ClaimedJob) -> AbstractContextManager[Span | None]:
    """The attempt's INTERNAL ``handler`` span, around the handler call alone: in the
    worker a child of the delivery's CONSUMER ``process`` span (the handler's task copies
    the delivery's context); a handler that raises ends it failed, with ``error.type`` the
    exception's class. With tracing off, an empty context manager."""
    if not tracing_enabled():
        return nullcontext()
    attributes: dict[str, Any] = {
        "job.id": str(job.job_id),
        "job.type": job.job_type.name,
        "job.attempt": job.attempt,
    }
    if job.message_id:
        attributes["messaging.message.id"] = str(job.message_id)
    return span_if_enabled("handler", attributes=attributes)
