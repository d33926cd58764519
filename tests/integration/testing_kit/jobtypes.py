"""Job types of the testing kit's own tests, on a registry of their own (not the default
one the other tests and the services use)."""

from __future__ import annotations

import asyncio
import uuid

from pydantic import BaseModel, ConfigDict, Field

from jobcore.examples.jobtypes import CreditAccountPayload, post_credit
from jobcore.execution.registry import JobContext, Registry
from jobcore.kernel.errors import PermanentError, Snooze
from jobcore.kernel.gates import Limit
from jobcore.kernel.keyed import Debounce

REGISTRY = Registry()


class FlakyPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    succeed_on_attempt: int = Field(ge=1, le=10)


@REGISTRY.job("kit_flaky", payload=FlakyPayload, max_attempts=5, timeout=5, lease=5)
async def kit_flaky(ctx: JobContext[FlakyPayload]) -> dict[str, int]:
    ctx.record_effect("tried", {"attempt": ctx.attempt})
    if ctx.attempt < ctx.payload.succeed_on_attempt:
        raise ConnectionError(f"upstream unavailable (attempt {ctx.attempt})")
    return {"attempt": ctx.attempt}


class NotePayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(max_length=100)
    size: int = Field(default=0, ge=0, le=100_000)


@REGISTRY.job("kit_note", payload=NotePayload, max_attempts=3, timeout=5, lease=5)
async def kit_note(ctx: JobContext[NotePayload]) -> dict[str, object]:
    """Records an effect; returns its text, a UUID (JSON makes it a string) and ``size``
    bytes of padding (a large result goes to the result store)."""
    await ctx.heartbeat()
    ctx.record_effect("noted", {"text": ctx.payload.text})
    return {"text": ctx.payload.text, "job": ctx.job_id, "padding": "x" * ctx.payload.size}


@REGISTRY.job("kit_refuse", payload=NotePayload, max_attempts=3, timeout=5, lease=5)
async def kit_refuse(ctx: JobContext[NotePayload]) -> None:
    raise PermanentError(f"refused: {ctx.payload.text}")


@REGISTRY.job("kit_sleepy", payload=NotePayload, max_attempts=1, timeout=0.2, lease=5)
async def kit_sleepy(ctx: JobContext[NotePayload]) -> None:
    await asyncio.sleep(30)  # far past the type's 0.2 s timeout, which ends it


@REGISTRY.job("kit_unjson", payload=NotePayload, max_attempts=3, timeout=5, lease=5)
async def kit_unjson(ctx: JobContext[NotePayload]) -> object:
    return {"not json": {uuid.uuid4().hex: object()}}


@REGISTRY.job("kit_credit", payload=CreditAccountPayload, max_attempts=3, timeout=5, lease=5)
async def kit_credit(ctx: JobContext[CreditAccountPayload]) -> None:
    """Reports its progress, then credits the account on ``ctx.transaction()``: the credit
    commits with the job's success."""
    await ctx.progress(0.5, "crediting")
    async with ctx.transaction() as tx:
        tx.set_result(await post_credit(tx, ctx.payload.account, ctx.payload.amount_cents))


# Runs of each kit_snooze job, by job id (the handler snoozes its first).
SNOOZE_RUNS: dict[uuid.UUID, int] = {}


class SnoozePayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seconds: float = Field(default=0.2, ge=0)


@REGISTRY.job("kit_snooze", payload=SnoozePayload, max_attempts=1, timeout=5, lease=5)
async def kit_snooze(ctx: JobContext[SnoozePayload]) -> dict[str, int]:
    """Snoozes its first run; returns its attempt and run on the second."""
    runs = SNOOZE_RUNS[ctx.job_id] = SNOOZE_RUNS.get(ctx.job_id, 0) + 1
    if runs == 1:
        raise Snooze(ctx.payload.seconds)
    return {"attempt": ctx.attempt, "run": runs}


@REGISTRY.job(
    "kit_snooze_limited",
    payload=SnoozePayload,
    max_attempts=1,
    timeout=5,
    lease=5,
    concurrency=Limit(1),
)
async def kit_snooze_limited(ctx: JobContext[SnoozePayload]) -> dict[str, int]:
    """kit_snooze, one running at a time."""
    return await kit_snooze(ctx)


# Debounced by the note's text: each run returns every text it coalesced.
@REGISTRY.job(
    "kit_digest",
    payload=NotePayload,
    max_attempts=3,
    timeout=5,
    lease=5,
    debounce=Debounce(60.0, per="text", payloads="all"),
)
async def kit_digest(ctx: JobContext[NotePayload]) -> dict[str, object]:
    return {"sizes": [p.size for p in ctx.payloads]}
