"""A job type for the PgBouncer tests (loaded by the processes through JOBCORE_JOB_MODULES).

Its lease is long, so its heartbeats (a third of the lease apart) come too late to be what
stops a cancelled job within the test's bound: the cancel NOTIFY, or the cancel poll,
must.
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, ConfigDict, Field

from jobcore.execution.registry import JobContext, job

LEASE_SECONDS = 90.0


class NapPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seconds: float = Field(ge=0, le=120)


@job("pgb_nap", payload=NapPayload, queue="testq", max_attempts=1, timeout=120, lease=LEASE_SECONDS)
async def pgb_nap(ctx: JobContext[NapPayload]) -> dict[str, float]:
    await asyncio.sleep(ctx.payload.seconds)
    return {"slept": ctx.payload.seconds}
