"""Job types for `jobcore demo`: ones that fail and retry, fail for good, or run long.

Loaded only when ``JOBCORE_JOB_MODULES`` names this module (the demo sets it).
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, ConfigDict, Field

from jobcore.execution.registry import JobContext, job


class FlakyPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # The attempt that finally succeeds; the ones before it raise.
    succeed_on_attempt: int = Field(default=2, ge=1, le=10)


@job("flaky", payload=FlakyPayload, queue="default", max_attempts=5, timeout=30, lease=15)
async def flaky(ctx: JobContext[FlakyPayload]) -> dict[str, int]:
    if ctx.attempt < ctx.payload.succeed_on_attempt:
        raise ConnectionError(f"upstream unavailable (attempt {ctx.attempt})")
    return {"succeeded_on_attempt": ctx.attempt}


class DoomedPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="the upstream keeps refusing", max_length=200)


@job("doomed", payload=DoomedPayload, queue="default", max_attempts=3, timeout=30, lease=15)
async def doomed(ctx: JobContext[DoomedPayload]) -> None:
    raise RuntimeError(ctx.payload.reason)


class SlowPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seconds: float = Field(default=30.0, gt=0, le=600)


@job("slow", payload=SlowPayload, queue="default", max_attempts=1, timeout=660, lease=15)
async def slow(ctx: JobContext[SlowPayload]) -> dict[str, float]:
    """Runs for a while (cancellable: the worker cancels this task on request)."""
    await asyncio.sleep(ctx.payload.seconds)
    return {"slept": ctx.payload.seconds}
