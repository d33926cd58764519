"""Job types used only by the tests (loaded through JOBCORE_JOB_MODULES)."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, ConfigDict, Field

from jobcore.execution.registry import JobContext, job
from jobcore.kernel.batches import BatchOutcome


class EchoPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(max_length=1000)
    count: int = Field(default=1, ge=0, le=1000)


@job("echo", payload=EchoPayload, queue="testq", max_attempts=3, timeout=10, lease=5)
async def echo(ctx: JobContext[EchoPayload]) -> dict[str, object]:
    return {"text": ctx.payload.text * ctx.payload.count}


class BatchDonePayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    note: str = Field(default="", max_length=100)
    batch: BatchOutcome


# A batch's callback (jobcore.usecases.batches): the batch's outcome under ``batch``.
@job("batch_done", payload=BatchDonePayload, queue="testq", max_attempts=3, timeout=10, lease=5)
async def batch_done(ctx: JobContext[BatchDonePayload]) -> dict[str, object]:
    return {"event": ctx.payload.batch.event, "failed": ctx.payload.batch.failed}


class SyncPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The job type's unique key (None: no key). Longer than a key may be (255), so the
    # tests can see a payload refused for its key.
    account: str | None = Field(default=None, max_length=300)
    note: str = Field(default="", max_length=100)


# At most one live job per tenant and account.
@job(
    "sync_account",
    payload=SyncPayload,
    queue="testq",
    max_attempts=3,
    timeout=10,
    lease=5,
    unique_field="account",
)
async def sync_account(ctx: JobContext[SyncPayload]) -> dict[str, object]:
    return {"account": ctx.payload.account}


class EffectPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Which submission this is (the fault tests' own numbering; shows in the ledger).
    n: int = Field(default=0, ge=0, le=2**31 - 1)
    # How long the handler works before it records its effect (a kill can land mid-handler).
    seconds: float = Field(default=0.0, ge=0, le=10)


# A short lease, so a job whose worker was killed is reaped within seconds; many attempts,
# so the faults a test throws at it do not use them up.
@job("effect", payload=EffectPayload, queue="testq", max_attempts=25, timeout=30, lease=2)
async def effect(ctx: JobContext[EffectPayload]) -> dict[str, object]:
    """Records one effect in the ledger (``job_effects``), committed only with its success.

    Its first act is a progress report, which the worker writes before the outcome: a job
    with no progress_attempt never had a handler start (what `jobcore chaos` checks of
    the failed ones)."""
    await ctx.progress(0.0, "started")
    if ctx.payload.seconds:
        await asyncio.sleep(ctx.payload.seconds)
    ctx.record_effect("effect", {"n": ctx.payload.n})
    return {"n": ctx.payload.n, "attempt": ctx.attempt}
