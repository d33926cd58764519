"""Job types only the benchmarks load (through JOBCORE_JOB_MODULES).

This module imports no other job module: importing one registers its types too.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from jobcore.execution.registry import JobContext, job


class SteadyNoopPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")


# The steady scenario declares a consumer timeout of seconds so that its inbox window (delivery
# limit × consumer timeout) fits in its retention of minutes; start-up refuses a type that
# could hold a slot longer, so this registry holds only a short no-op.
@job(
    "steady_noop", payload=SteadyNoopPayload, queue="default", max_attempts=3, timeout=10, lease=10
)
async def steady_noop(ctx: JobContext[SteadyNoopPayload]) -> None:
    """Does nothing, like ``noop``, with a short timeout."""
