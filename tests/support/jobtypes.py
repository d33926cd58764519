"""Job types used only by the tests (loaded through JOBCORE_JOB_MODULES)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from jobcore.registry import JobContext, job


class EchoPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(max_length=1000)
    count: int = Field(default=1, ge=0, le=1000)


@job("echo", payload=EchoPayload, queue="testq", max_attempts=3, timeout=10, lease=5)
async def echo(ctx: JobContext[EchoPayload]) -> dict[str, object]:
    return {"text": ctx.payload.text * ctx.payload.count}
