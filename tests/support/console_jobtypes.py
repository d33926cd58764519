"""A job type for the console's browser test (loaded by its worker through
JOBCORE_JOB_MODULES): it reports progress, then waits for a file the test creates."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from jobcore.execution.registry import JobContext, job

MODULE = __name__


class ProgressPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    fraction: float = Field(ge=0, le=1)
    message: str = Field(max_length=200)
    # The handler finishes once this file exists.
    gate: str


@job("console_progress", payload=ProgressPayload, queue="testq", max_attempts=1, lease=5)
async def console_progress(ctx: JobContext[ProgressPayload]) -> dict[str, float]:
    await ctx.progress(ctx.payload.fraction, ctx.payload.message)
    gate = Path(ctx.payload.gate)
    while not gate.exists():
        await asyncio.sleep(0.02)  # polling a file the test creates
    await ctx.progress(1.0, "done")
    return {"fraction": ctx.payload.fraction}
