"""Job types for the worker tests (loaded in-process by the conftest, and by worker
processes through JOBCORE_JOB_MODULES)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
from pydantic import BaseModel, ConfigDict, Field, model_validator

from jobcore.examples.jobtypes import post_credit
from jobcore.execution.registry import JobContext, job
from jobcore.kernel.errors import PermanentError, Snooze

MODULE = __name__


class GatePayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The handler waits until this file exists (none: it does not wait).
    gate: str | None = None
    # Attempts up to this number raise (a transient failure each time).
    fail_times: int = Field(default=0, ge=0)
    permanent: bool = False
    # Size of the "blob" field of the result (to exercise the result store).
    result_size: int = Field(default=0, ge=0)
    effect: str = "completed"


@job("wt_gate", payload=GatePayload, queue="testq", max_attempts=3, timeout=60, lease=2)
async def wt_gate(ctx: JobContext[GatePayload]) -> dict[str, object]:
    """Fails as told, then waits for its gate file, records an effect and returns."""
    if ctx.payload.permanent:
        raise PermanentError("this job can never work")
    if ctx.attempt <= ctx.payload.fail_times:
        raise RuntimeError(f"planned failure on attempt {ctx.attempt}")
    if ctx.payload.gate is not None:
        gate = Path(ctx.payload.gate)
        while not gate.exists():
            await asyncio.sleep(0.02)  # polling a file the test creates
    ctx.record_effect(ctx.payload.effect, {"attempt": ctx.attempt})
    return {"attempt": ctx.attempt, "blob": "x" * ctx.payload.result_size}


class SlowPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seconds: float = 30.0


@job("wt_slow", payload=SlowPayload, queue="testq", max_attempts=2, timeout=0.3, lease=2)
async def wt_slow(ctx: JobContext[SlowPayload]) -> None:
    """Sleeps past its own timeout."""
    await asyncio.sleep(ctx.payload.seconds)


# What the API writes when a running job's cancellation is requested (without the NOTIFY).
REQUEST_CANCEL = """
    UPDATE jobs SET cancel_requested_at = now(), updated_at = now()
    WHERE id = %s AND status = 'running'
"""


class NoPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")


@job("wt_cancel_then_fail", payload=NoPayload, queue="testq", max_attempts=3, timeout=60, lease=2)
async def wt_cancel_then_fail(ctx: JobContext[NoPayload]) -> None:
    """Has its cancellation requested, then fails with a retryable error at once: before a
    heartbeat could notice the request, as when the cancel NOTIFY is missed."""
    assert ctx.settings is not None
    async with await psycopg.AsyncConnection.connect(
        ctx.settings.database_url, autocommit=True
    ) as conn:
        await conn.execute(REQUEST_CANCEL, (ctx.job_id,))
    raise RuntimeError("failed after its cancellation was requested")


class TripwirePayload(BaseModel):
    """Validates at enqueue; raises a non-validation error once, if its tripwire file
    exists (removing it), as a payload model with a bug would in the worker only."""

    model_config = ConfigDict(extra="forbid")

    tripwire: str

    @model_validator(mode="after")
    def _trip(self) -> TripwirePayload:
        wire = Path(self.tripwire)
        # Only a tripwire file a test made: fuzzers post any string here ('.', '/').
        if wire.name.startswith("tripwire") and wire.is_file():
            wire.unlink()
            raise RuntimeError("the payload model broke in the worker")
        return self


@job("wt_tripwire", payload=TripwirePayload, queue="testq", max_attempts=3, timeout=60, lease=2)
async def wt_tripwire(ctx: JobContext[TripwirePayload]) -> dict[str, int]:
    ctx.record_effect("completed", {"attempt": ctx.attempt})
    return {"attempt": ctx.attempt}


# NUL, which PostgreSQL text refuses, and a lone surrogate, which UTF-8 cannot encode.
UNSTORABLE_ERROR = "broken \x00 text \udce9 here"


@job("wt_unstorable_error", payload=NoPayload, queue="testq", max_attempts=1, timeout=60, lease=2)
async def wt_unstorable_error(ctx: JobContext[NoPayload]) -> None:
    """Fails with an error whose text PostgreSQL cannot store as it is."""
    raise RuntimeError(UNSTORABLE_ERROR)


@job("wt_put_result", payload=NoPayload, queue="testq", max_attempts=2, timeout=60, lease=2)
async def wt_put_result(ctx: JobContext[NoPayload]) -> None:
    """Stores a result file itself (JobContext.put_result)."""
    await ctx.put_result(b"a,b\n1,2\n", suffix="csv")


@job("wt_cancel_self", payload=NoPayload, queue="testq", max_attempts=3, timeout=60, lease=2)
async def wt_cancel_self(ctx: JobContext[NoPayload]) -> None:
    """Has its cancellation requested (as the API writes it, without the NOTIFY), then
    heartbeats until its runner tells it of the request, and stops with an error."""
    assert ctx.settings is not None
    async with await psycopg.AsyncConnection.connect(
        ctx.settings.database_url, autocommit=True
    ) as conn:
        await conn.execute(REQUEST_CANCEL, (ctx.job_id,))
    while not ctx.cancel_requested.is_set():
        await ctx.heartbeat()
        await asyncio.sleep(0.02)  # polling for what the heartbeat brings back
    raise RuntimeError("stopped: its cancellation was requested")


@job("wt_file_and_result", payload=NoPayload, queue="testq", max_attempts=2, timeout=60, lease=2)
async def wt_file_and_result(ctx: JobContext[NoPayload]) -> dict[str, str]:
    """Stores a result file and returns a large result as well (which cannot be stored)."""
    await ctx.put_result(b"a,b\n1,2\n", suffix="csv")
    return {"blob": "x" * (ctx.settings.inline_result_max_bytes + 1 if ctx.settings else 1)}


@job("wt_nul_result", payload=NoPayload, queue="testq", max_attempts=2, timeout=60, lease=2)
async def wt_nul_result(ctx: JobContext[NoPayload]) -> dict[str, str]:
    """Returns a result PostgreSQL's jsonb refuses."""
    return {"text": "nul \x00 here"}


# --- handler transactions (ctx.transaction) and progress (ctx.progress) -------------------

# A worker process started with this variable set SIGKILLs itself at the named point of
# wt_credit (the fault tests): before_write, after_write (inside the transaction, before
# its commit), after_commit (the transaction committed, the handler has not returned) or
# after_return (the handler returned, before the worker's own bookkeeping ran).
CRASH_AT_ENV = "JOBCORE_TEST_CRASH_AT"
CRASH_POINTS = ("before_write", "after_write", "after_commit", "after_return")


def crash_here(point: str) -> None:
    if os.environ.get(CRASH_AT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


class CreditPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    account: str = Field(min_length=1, max_length=64)
    amount_cents: int = Field(default=100, ge=1, le=10**6)
    # Inside the transaction, after the write: wait until this file exists.
    gate: str | None = None
    # Write the name of the exception the transaction raised (if any) to this file.
    seen: str | None = None
    # Attempts up to this number raise inside the transaction, after the write.
    fail_in_transaction: int = Field(default=0, ge=0, le=10)


async def credit(ctx: JobContext[CreditPayload]) -> None:
    """Credits an account on the handler's transaction (the shipped credit_account's
    statement), records an effect, and crashes where CRASH_AT_ENV says."""
    crash_here("before_write")
    try:
        async with ctx.transaction() as tx:
            credited = await post_credit(tx, ctx.payload.account, ctx.payload.amount_cents)
            ctx.record_effect("credited", {"attempt": ctx.attempt})
            crash_here("after_write")
            if ctx.attempt <= ctx.payload.fail_in_transaction:
                raise RuntimeError(f"planned failure in the transaction of attempt {ctx.attempt}")
            if ctx.payload.gate is not None:
                gate = Path(ctx.payload.gate)
                while not gate.exists():
                    await asyncio.sleep(0.02)  # polling a file the test creates
            fence = ctx.fence
            tx.set_result(
                {
                    **credited,
                    "fence": {
                        "job_id": str(fence.job_id),
                        "attempt": fence.attempt,
                        "lease_token": str(fence.lease_token),
                    },
                }
            )
    except Exception as exc:
        if ctx.payload.seen is not None:
            Path(ctx.payload.seen).write_text(type(exc).__name__)
        raise
    crash_here("after_commit")
    if os.environ.get(CRASH_AT_ENV) == "after_return":
        # Runs once this handler's task has returned, before the runner resumes.
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGKILL)


# A short lease, so a killed worker's job is reaped within seconds.
job("wt_credit", payload=CreditPayload, queue="testq", max_attempts=5, timeout=60, lease=2)(credit)
# A long lease: no heartbeat (every 10 s) comes between a test's take-over and the commit.
job(
    "wt_credit_long_lease",
    payload=CreditPayload,
    queue="testq",
    max_attempts=2,
    timeout=60,
    lease=30,
)(credit)


class ProgressPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Between the two bursts of reports, wait until this file exists.
    gate: str
    reports: int = Field(default=100, ge=1, le=10_000)


@job("wt_progress", payload=ProgressPayload, queue="testq", max_attempts=1, timeout=60, lease=2)
async def wt_progress(ctx: JobContext[ProgressPayload]) -> None:
    """Two bursts of progress reports, each in a tight loop: the first ends at 0.5
    "halfway" and waits for the gate; the second ends at 1.0 "done" and returns at once."""
    for i in range(ctx.payload.reports):
        await ctx.progress(0.5 * i / ctx.payload.reports, f"step {i}")
    await ctx.progress(0.5, "halfway")
    gate = Path(ctx.payload.gate)
    while not gate.exists():
        await asyncio.sleep(0.02)  # polling a file the test creates
    for i in range(ctx.payload.reports):
        await ctx.progress(0.5 + 0.5 * i / ctx.payload.reports, f"step {i}")
    await ctx.progress(1.0, "done")


class BlobPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Padding that makes the payload large (stored by reference above the inline limit).
    data: str = ""
    # Bytes of the result file the handler streams (ctx.put_result_chunks), 1 MiB a chunk.
    result_bytes: int = Field(default=0, ge=0)


@job("wt_blob", payload=BlobPayload, queue="testq", max_attempts=20, timeout=60, lease=10)
async def wt_blob(ctx: JobContext[BlobPayload]) -> dict[str, object]:
    """Streams a result file of ``result_bytes`` and says what payload it saw."""
    size = ctx.payload.result_bytes

    def chunks() -> Iterator[bytes]:
        for offset in range(0, size, 1 << 20):
            yield bytes([offset >> 20 & 0xFF]) * min(1 << 20, size - offset)

    if size:
        await ctx.put_result_chunks(chunks(), suffix="bin")
    return {
        "attempt": ctx.attempt,
        "payload_sha256": hashlib.sha256(ctx.payload.data.encode()).hexdigest(),
    }


@job("wt_self_cancelled", payload=NoPayload, queue="testq", max_attempts=2, timeout=60, lease=2)
async def wt_self_cancelled(ctx: JobContext[NoPayload]) -> None:
    """Raises CancelledError itself (nothing asked it to stop): a failed attempt."""
    raise asyncio.CancelledError


class UploadPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The first attempt's upload waits in its thread until this file exists.
    gate: str


@job("wt_slow_upload", payload=UploadPayload, queue="testq", max_attempts=3, timeout=60, lease=2)
async def wt_slow_upload(ctx: JobContext[UploadPayload]) -> None:
    """Streams a result file saying which attempt wrote it; the first attempt's upload
    outlives its lease (it runs in a thread that nothing can stop)."""
    gate, attempt = Path(ctx.payload.gate), ctx.attempt

    def chunks() -> Iterator[bytes]:
        while attempt == 1 and not gate.exists():
            time.sleep(0.02)  # polling, in the upload's thread, a file the test creates
        yield f"written by attempt {attempt}".encode()

    await ctx.put_result_chunks(chunks(), suffix="txt")


class SnoozePayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The handler counts its runs of each job in a file here, named by the job id.
    runs_dir: str
    # Runs up to this number snooze (returned, or raised with raise_it).
    snooze_times: int = Field(default=1, ge=0)
    seconds: float = Field(default=1.0, ge=0)
    raise_it: bool = False


def _count_run(runs_dir: str, job_id: object) -> int:
    counter = Path(runs_dir) / str(job_id)
    runs = int(counter.read_text()) + 1 if counter.exists() else 1
    counter.write_text(str(runs))
    return runs


@job("wt_snooze", payload=SnoozePayload, queue="testq", max_attempts=2, timeout=10, lease=2)
async def wt_snooze(ctx: JobContext[SnoozePayload]) -> object:
    """Snoozes its first ``snooze_times`` runs, then returns its attempt and run."""
    runs = _count_run(ctx.payload.runs_dir, ctx.job_id)
    if runs <= ctx.payload.snooze_times:
        if ctx.payload.raise_it:
            raise Snooze(ctx.payload.seconds)
        return Snooze(ctx.payload.seconds)
    return {"attempt": ctx.attempt, "run": runs, "snoozes": ctx.snoozes}


@job(
    "wt_snooze_capped",
    payload=SnoozePayload,
    queue="testq",
    max_attempts=2,
    timeout=10,
    lease=2,
    max_snoozes=2,
)
async def wt_snooze_capped(ctx: JobContext[SnoozePayload]) -> object:
    """Snoozes every run; its type allows two snoozes a job."""
    _count_run(ctx.payload.runs_dir, ctx.job_id)
    return Snooze(ctx.payload.seconds)
