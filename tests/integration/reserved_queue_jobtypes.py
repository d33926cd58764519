"""A job module that puts a job type on the reserved webhooks queue (for the start-up
checks: importing it must stop the process with one line)."""

from __future__ import annotations

from pydantic import BaseModel

from jobcore.execution.registry import JobContext, job


class Payload(BaseModel):
    pass


@job("misrouted", payload=Payload, queue="webhooks")
async def misrouted(ctx: JobContext[Payload]) -> None:
    """Never runs: the registry refuses it."""
