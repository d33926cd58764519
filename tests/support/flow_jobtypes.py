"""Job types with flow-control gates (jobcore.kernel.gates), for the flow-control tests: loaded
in-process by them, and by worker processes through JOBCORE_JOB_MODULES."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from jobcore.execution.registry import JobContext, job
from jobcore.kernel.errors import PermanentError
from jobcore.kernel.gates import Limit, Rate

MODULE = __name__
# The worker tests' queue: a queue of its own would change what every in-process worker of
# the suite consumes once this module is imported (the default registry is shared).
QUEUE = "testq"
LIMIT = 2
RATE = 4.0


class AccountPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    account: str
    seconds: float = Field(default=0.05, ge=0, le=60)
    # The handler waits until this file exists (none: it does not wait).
    gate: str | None = None


async def _work(payload: AccountPayload) -> None:
    if payload.gate is not None:
        gate = Path(payload.gate)
        while not gate.exists():
            await asyncio.sleep(0.02)  # polling a file the test creates
    await asyncio.sleep(payload.seconds)  # the job's work


@job(
    "flow_limited",
    payload=AccountPayload,
    queue=QUEUE,
    max_attempts=3,
    lease=2,
    concurrency=Limit(LIMIT, per="account"),
)
async def flow_limited(ctx: JobContext[AccountPayload]) -> None:
    """At most LIMIT running per account."""
    await _work(ctx.payload)


@job("flow_rated", payload=AccountPayload, queue=QUEUE, lease=2, rate=Rate(RATE, per="account"))
async def flow_rated(ctx: JobContext[AccountPayload]) -> None:
    """At most RATE starts a second per account."""
    await _work(ctx.payload)


class OrderedPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: int
    seconds: float = Field(default=0.0, ge=0, le=60)
    # Attempts up to this number raise (a transient failure each time).
    fail_times: int = Field(default=0, ge=0)
    # Fails for good while this file does not exist (none: never).
    fail_unless: str | None = None
    # The handler waits until this file exists (none: it does not wait).
    gate: str | None = None


async def _ordered(ctx: JobContext[OrderedPayload]) -> dict[str, int]:
    # When the handler ran, by the machine's clock (every worker of a test shares it),
    # recorded as an effect of its successful attempt: the tests compare these intervals.
    started = time.time()
    if ctx.payload.fail_unless is not None and not Path(ctx.payload.fail_unless).exists():
        raise PermanentError("the file this job needs is missing")
    if ctx.attempt <= ctx.payload.fail_times:
        raise RuntimeError(f"planned failure on attempt {ctx.attempt}")
    if ctx.payload.gate is not None:
        gate = Path(ctx.payload.gate)
        while not gate.exists():
            await asyncio.sleep(0.02)  # polling a file the test creates
    await asyncio.sleep(ctx.payload.seconds)  # the job's work
    ctx.record_effect("ran", {"n": ctx.payload.n, "started": started, "ended": time.time()})
    return {"n": ctx.payload.n}


@job("flow_ordered", payload=OrderedPayload, queue=QUEUE, max_attempts=3, lease=2)
async def flow_ordered(ctx: JobContext[OrderedPayload]) -> dict[str, int]:
    """Ordered when enqueued with an ordering key; a failed one blocks its key."""
    return await _ordered(ctx)


@job(
    "flow_ordered_skip",
    payload=OrderedPayload,
    queue=QUEUE,
    max_attempts=3,
    lease=2,
    ordering="skip",
)
async def flow_ordered_skip(ctx: JobContext[OrderedPayload]) -> dict[str, int]:
    """Ordered, but a failed one lets the rest of its key go on."""
    return await _ordered(ctx)
