"""Job types of the rolling-upgrade test (tests/e2e/test_rolling_upgrade.py), loaded by the
previous release's processes and the current ones alike: the file is copied to a directory
of its own on their PYTHONPATH (the checkout's would shadow the old release's `services`),
so both declare the same limits and record effects the same way. Only what v0.1.0 has,
imported from v0.1.0's paths, which the current release keeps (jobcore.kernel.old_paths):
a job module written for the previous release loads in both.
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, ConfigDict, Field

from jobcore.gates import Limit, Rate  # type: ignore[import-not-found]
from jobcore.registry import JobContext, job  # type: ignore[import-not-found]

QUEUE = "upgrade"
LIMIT = 2
RATE = 4.0


class Payload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: int = Field(ge=0)
    account: str = Field(default="a", max_length=20)
    seconds: float = Field(default=0.0, ge=0, le=5)


async def _work(ctx: JobContext[Payload]) -> dict[str, int]:
    if ctx.payload.seconds:
        await asyncio.sleep(ctx.payload.seconds)  # the job's work
    ctx.record_effect("upgrade", {"n": ctx.payload.n})
    return {"n": ctx.payload.n}


@job("up_plain", payload=Payload, queue=QUEUE, max_attempts=25, timeout=30, lease=5)
async def up_plain(ctx: JobContext[Payload]) -> dict[str, int]:
    return await _work(ctx)


@job(
    "up_rated",
    payload=Payload,
    queue=QUEUE,
    max_attempts=25,
    timeout=30,
    lease=5,
    rate=Rate(RATE, per="account"),
)
async def up_rated(ctx: JobContext[Payload]) -> dict[str, int]:
    """At most RATE starts a second per account."""
    return await _work(ctx)


@job(
    "up_limited",
    payload=Payload,
    queue=QUEUE,
    max_attempts=25,
    timeout=30,
    lease=5,
    concurrency=Limit(LIMIT, per="account"),
)
async def up_limited(ctx: JobContext[Payload]) -> dict[str, int]:
    """At most LIMIT running at once per account."""
    return await _work(ctx)
