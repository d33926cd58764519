"""The job types of `jobcore chaos`'s multi-step load (:mod:`jobcore.testing.multistep`).

Each one, like ``effect``, reports progress first (a failed job without progress never had
a handler start) and records exactly one effect in ``job_effects`` when it succeeds, with
what the check needs (its payload's tag and number, whether it ran edited, the payloads a
debounced run took). Not in :mod:`jobcore.testing.jobtypes`: only the chaos run loads them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from jobcore.execution.registry import JobContext, job
from jobcore.kernel.batches import BatchOutcome
from jobcore.kernel.errors import PermanentError, Snooze
from jobcore.kernel.keyed import Debounce
from jobcore.testing.multistep import (
    CALLBACK,
    DEBOUNCE_MAX_WAIT,
    DEBOUNCE_PERIOD,
    DEBOUNCED,
    SNOOZE_SECONDS,
    STEP,
)


class StepPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tag: str = Field(max_length=100)  # which workflow, batch or edit, and which step of it
    fail: bool = False  # fail for good (a PermanentError): a compensation edge's cause
    snooze: bool = False  # snooze once before running
    edited: bool = False  # set by the run's PATCH: the effect says which payload ran


# Many attempts, so the faults do not use them up; a short lease, so a killed worker's job
# is reaped within seconds.
@job(STEP, payload=StepPayload, queue="testq", max_attempts=25, timeout=30, lease=2)
async def chaos_step(ctx: JobContext[StepPayload]) -> object:
    await ctx.progress(0.0, "started")
    if ctx.payload.snooze and ctx.snoozes == 0:
        return Snooze(SNOOZE_SECONDS)
    if ctx.payload.fail:
        raise PermanentError(f"{ctx.payload.tag} fails on purpose")
    ctx.record_effect("step", {"tag": ctx.payload.tag, "edited": ctx.payload.edited})
    return {"tag": ctx.payload.tag, "attempt": ctx.attempt, "snoozes": ctx.snoozes}


class CallbackPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tag: str = Field(max_length=100)  # which batch
    batch: BatchOutcome


@job(CALLBACK, payload=CallbackPayload, queue="testq", max_attempts=25, timeout=30, lease=2)
async def chaos_callback(ctx: JobContext[CallbackPayload]) -> object:
    await ctx.progress(0.0, "started")
    ctx.record_effect("callback", {"tag": ctx.payload.tag, "event": ctx.payload.batch.event})
    return {"tag": ctx.payload.tag, "event": ctx.payload.batch.event}


class DebouncedPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    key: str = Field(max_length=100)
    n: int = Field(ge=0, le=2**31 - 1)  # which enqueue of the run this is


@job(
    DEBOUNCED,
    payload=DebouncedPayload,
    queue="testq",
    max_attempts=25,
    timeout=30,
    lease=2,
    debounce=Debounce(
        DEBOUNCE_PERIOD, max_wait=DEBOUNCE_MAX_WAIT, per="key", payloads="all", max_payloads=100
    ),
)
async def chaos_debounced(ctx: JobContext[DebouncedPayload]) -> object:
    await ctx.progress(0.0, "started")
    numbers = [p.n for p in ctx.payloads] or [ctx.payload.n]
    ctx.record_effect("debounced", {"key": ctx.payload.key, "ns": numbers})
    return {"key": ctx.payload.key, "ns": numbers}
