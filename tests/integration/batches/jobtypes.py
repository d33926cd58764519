"""Job types of the batch tests, on a registry of their own."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from jobcore.execution.registry import JobContext, Registry
from jobcore.kernel.errors import PermanentError

REGISTRY = Registry()

# Texts whose next run fails for good (once each): a member that dies, then succeeds when
# an operator retries it.
FAIL_ONCE: set[str] = set()


class MemberPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(max_length=100)
    fail: bool = False


@REGISTRY.job("batch_member", payload=MemberPayload, max_attempts=1, timeout=5, lease=5)
async def batch_member(ctx: JobContext[MemberPayload]) -> dict[str, str]:
    if ctx.payload.fail:
        raise PermanentError(f"refused: {ctx.payload.text}")
    if ctx.payload.text in FAIL_ONCE:
        FAIL_ONCE.discard(ctx.payload.text)
        raise PermanentError(f"refused once: {ctx.payload.text}")
    return {"text": ctx.payload.text}


class CallbackPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    note: str = Field(max_length=100)
    batch: dict[str, Any]


@REGISTRY.job("batch_callback", payload=CallbackPayload, max_attempts=1, timeout=5, lease=5)
async def batch_callback(ctx: JobContext[CallbackPayload]) -> dict[str, Any]:
    return {"note": ctx.payload.note, "event": ctx.payload.batch["event"]}
