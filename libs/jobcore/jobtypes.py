"""The job types jobcore ships: two real examples and a no-op for benchmarks.

Handlers run in the worker; the API only needs the payload models and queues.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, EmailStr, Field

from jobcore.registry import JobContext, job


class NoopPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")


@job("noop", payload=NoopPayload, queue="default", max_attempts=3, timeout=30, lease=30)
async def noop(ctx: JobContext[NoopPayload]) -> None:
    """Does nothing: the cost of jobcore itself, for benchmarks and smoke tests."""


class ExportCsvPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rows: int = Field(default=1000, ge=1, le=1_000_000)
    columns: list[str] = Field(
        default_factory=lambda: ["id", "name", "amount"], min_length=1, max_length=50
    )
    seed: int = 0


class SendEmailPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to: EmailStr
    subject: str = Field(min_length=1, max_length=200)
    body: str = Field(default="", max_length=100_000)
