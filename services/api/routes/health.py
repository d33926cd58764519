"""Probes and metrics: /healthz (the process answers), /readyz (the database answers;
the broker is never consulted, since enqueueing does not need it), /metrics."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from starlette.responses import Response

from jobcore.kernel.errors import JobcoreError
from services.api.deps import StateDep
from services.api.metrics import CONTENT_TYPE
from services.api.problems import RETRY_AFTER_SECONDS, UNAVAILABLE, problem
from services.api.schemas import Alive, Problem, Ready
from services.api.views import JsonBody

READY_TIMEOUT = 2.0

router = APIRouter(tags=["health"], default_response_class=JsonBody)


@router.get("/healthz", response_model=Alive)
async def healthz() -> Response:
    return JsonBody({"status": "alive"})


@router.get(
    "/readyz",
    response_model=Ready,
    responses={503: {"model": Problem}},
)
async def readyz(state: StateDep) -> Response:
    retry = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    if state.db is None:
        return problem(
            UNAVAILABLE,
            "the database pool is not open",
            headers=retry,
            checks={"database": "closed"},
        )
    try:
        # Probes have short timeouts of their own; waiting out the pool's would miss them.
        await asyncio.wait_for(state.db.ping(), READY_TIMEOUT)
    except (JobcoreError, TimeoutError):
        return problem(
            UNAVAILABLE,
            "the database cannot be reached",
            headers=retry,
            checks={"database": "unavailable"},
        )
    return JsonBody({"ready": True, "checks": {"database": "ok"}})


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE: {"schema": {"type": "string"}}}}},
)
async def metrics(state: StateDep) -> Response:
    return Response(state.metrics.render(), media_type=CONTENT_TYPE)
