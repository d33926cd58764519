"""Job types of the workflow tests, on a registry of their own: each run is recorded (in
order) with what it read of its dependencies."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from jobcore.execution.registry import JobContext, Registry
from jobcore.kernel.errors import PermanentError

REGISTRY = Registry()

# (step label, attempt, {dependency name: (status, result)}) per run, in run order.
RUNS: list[tuple[str, int, dict[str, Any]]] = []


class StepPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label: str
    fail: bool = False
    size: int = Field(default=0, ge=0, le=200_000)


async def _record(ctx: JobContext[StepPayload]) -> None:
    deps = await ctx.dependency_results()
    RUNS.append(
        (
            ctx.payload.label,
            ctx.attempt,
            {name: (dep.status, dep.result) for name, dep in deps.items()},
        )
    )


@REGISTRY.job("wf_step", payload=StepPayload, max_attempts=1, timeout=5, lease=5)
async def wf_step(ctx: JobContext[StepPayload]) -> dict[str, Any]:
    await _record(ctx)
    if ctx.payload.fail:
        raise PermanentError(f"{ctx.payload.label} failed")
    return {"label": ctx.payload.label, "padding": "x" * ctx.payload.size}
