"""``/admin/...``: operators' routes, across tenants, for keys with the ``admin`` scope.

Each route calls the use case its `jobcore` verb calls (:mod:`jobcore.usecases`), once:
jobs (list, show, cancel, retry), quarantined outbox rows (list, requeue, discard) and
API keys (list). Like every authenticated route, the key and its scope are checked
before anything else (:mod:`services.api.auth`).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Query
from starlette.responses import Response

from jobcore.kernel.errors import OutboxRowNotFound
from jobcore.kernel.states import JobStatus
from jobcore.usecases import jobs as job_usecases
from jobcore.usecases import keys as key_usecases
from jobcore.usecases import outbox as outbox_usecases
from services.api.auth import ActorDep, AdminRoute
from services.api.deps import DbDep, StateDep
from services.api.schemas import (
    AdminCancelAnswer,
    AdminJobList,
    AdminJobSummary,
    AdminJobView,
    AdminKeyList,
    AdminRetryAnswer,
    OutboxActedOn,
    Problem,
    QuarantinedList,
    QuarantinedRow,
)
from services.api.views import JsonBody

MAX_LIMIT = 1000
# A bigint id: at most 18 digits is always in range (19 may overflow).
_ROW_ID = re.compile(r"^[0-9]{1,18}$")
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_TYPE_PATTERN = r"^[a-z][a-z0-9_]{0,62}$"

LimitQuery = Annotated[int, Query(ge=1, le=MAX_LIMIT)]
TenantQuery = Annotated[str | None, Query(pattern=_NAME_PATTERN, description="Only this tenant's.")]


def _problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": Problem} for status in (401, 403, 422, 503, *statuses)}


router = APIRouter(
    prefix="/admin", tags=["admin"], default_response_class=JsonBody, route_class=AdminRoute
)


def _shape(model: type[Any], row: dict[str, Any]) -> dict[str, Any]:
    return {name: row[name] for name in model.model_fields}


def _job_view(row: dict[str, Any]) -> dict[str, Any]:
    # A payload stored by reference leaves {} in the row: null beside its key, as in
    # GET /jobs/{id}, not an empty payload.
    payload = None if row["payload_ref"] is not None else row["payload"]
    return _shape(AdminJobView, {**row, "run_at": row["next_attempt_at"], "payload": payload})


def _row_key(row: str) -> outbox_usecases.OutboxRowKey:
    """An outbox row by its numeric id or its message id (as `jobcore outbox` names it)."""
    if _ROW_ID.match(row):
        return outbox_usecases.OutboxRowKey(id=int(row), named=row)
    try:
        return outbox_usecases.OutboxRowKey(message_id=uuid.UUID(row), named=row)
    except ValueError:
        raise OutboxRowNotFound("no outbox row has that id or message id") from None


@router.get("/jobs", response_model=AdminJobList, responses=_problems())
async def list_jobs(
    db: DbDep,
    tenant: TenantQuery = None,
    status: JobStatus | None = None,
    type: Annotated[str | None, Query(pattern=_TYPE_PATTERN)] = None,
    limit: LimitQuery = 50,
) -> Response:
    """The newest jobs of every tenant (or one), newest first."""
    where = job_usecases.AdminJobFilter(tenant=tenant, status=status, type=type)
    rows = await job_usecases.list_jobs(db, where, limit=limit)
    return JsonBody({"items": [_shape(AdminJobSummary, row) for row in rows]})


@router.get("/jobs/{job_id}", response_model=AdminJobView, responses=_problems(404))
async def show_job(job_id: uuid.UUID, db: DbDep) -> Response:
    """Any tenant's job."""
    return JsonBody(_job_view(await job_usecases.show_job(db, job_id)))


@router.post(
    "/jobs/{job_id}/cancel",
    response_model=AdminCancelAnswer,
    responses={202: {"model": AdminCancelAnswer}, **_problems(404, 409)},
)
async def cancel_job(job_id: uuid.UUID, db: DbDep, state: StateDep, actor: ActorDep) -> Response:
    """Any tenant's job: pending, cancelled now (200); running, the worker is asked (202)."""
    outcome = await job_usecases.cancel_any_job(db, state.settings, job_id, actor=actor)
    body = {
        "job_id": outcome.job_id,
        "status": outcome.status.value,
        "cancel_requested": outcome.cancel_requested_at is not None,
        "cancel_requested_at": outcome.cancel_requested_at,
    }
    return JsonBody(body, status_code=202 if outcome.requested else 200)


@router.post(
    "/jobs/{job_id}/retry",
    status_code=201,
    response_model=AdminRetryAnswer,
    responses=_problems(404, 409),
)
async def retry_job(job_id: uuid.UUID, db: DbDep, state: StateDep, actor: ActorDep) -> Response:
    """A new pending copy of a failed or cancelled job (same tenant, type, payload, entity)."""
    outcome = await job_usecases.retry_job(db, state.settings, state.registry, job_id, actor=actor)
    body = {"retried": outcome.retried, "job_id": outcome.job_id, "status": outcome.status.value}
    return JsonBody(body, status_code=201)


@router.get("/outbox/quarantined", response_model=QuarantinedList, responses=_problems())
async def list_quarantined(db: DbDep, limit: LimitQuery = 50) -> Response:
    """Outbox rows no longer retried (their message can never be published as it is)."""
    rows = await outbox_usecases.list_quarantined(db, limit=limit)
    return JsonBody({"items": [_shape(QuarantinedRow, row) for row in rows]})


@router.post("/outbox/{row}/requeue", response_model=OutboxActedOn, responses=_problems(404, 409))
async def requeue_row(row: str, db: DbDep, actor: ActorDep) -> Response:
    """Publish a quarantined row again with fresh attempts (``row``: id or message id)."""
    acted_on = await outbox_usecases.requeue(db, _row_key(row), actor=actor)
    return JsonBody(_shape(OutboxActedOn, acted_on))


@router.post("/outbox/{row}/discard", response_model=OutboxActedOn, responses=_problems(404, 409))
async def discard_row(row: str, db: DbDep, actor: ActorDep) -> Response:
    """Delete a quarantined row: its message is never published (``row``: id or message id)."""
    acted_on = await outbox_usecases.discard(db, _row_key(row), actor=actor)
    return JsonBody(_shape(OutboxActedOn, acted_on))


@router.get("/keys", response_model=AdminKeyList, responses=_problems())
async def list_keys(db: DbDep, tenant: TenantQuery = None) -> Response:
    """Every API key (or one tenant's), oldest first: never a key or its hash."""
    keys = await key_usecases.list_keys(db, tenant)
    return JsonBody({"items": [asdict(key) for key in keys]})
