"""A no-op enqueue for benchmarks (served only with JOBCORE_BENCH_ROUTES=true, which `jobcore
bench` sets for its own API processes; refused in production): the same server
stack, body reading and JSON answer, without authentication or the database."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from starlette.responses import Response

from services.api import views
from services.api.body import read_json
from services.api.deps import StateDep
from services.api.views import JsonBody

NOOP_JOB_ID = uuid.UUID(int=0)

router = APIRouter(include_in_schema=False)


@router.post("/bench/noop")
async def noop_enqueue(request: Request, state: StateDep) -> Response:
    await read_json(request, state.settings.max_body_bytes)
    body = {"job_id": NOOP_JOB_ID, "status": "pending", "links": views.links(NOOP_JOB_ID)}
    return JsonBody(body, status_code=202, headers={"Location": views.job_path(NOOP_JOB_ID)})
