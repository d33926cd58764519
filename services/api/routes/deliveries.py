"""``GET /jobs/{id}/deliveries``: the job's completion webhooks and how each one went."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel
from starlette.responses import Response

from jobcore.usecases.webhooks import job_deliveries
from services.api.auth import ReadRoute, TenantDep
from services.api.deps import SessionDep
from services.api.schemas import Problem
from services.api.views import JsonBody


class DeliveryView(BaseModel):
    # The delivery id: the Webhook-Id header of every attempt.
    id: uuid.UUID
    url: str
    event: str
    status: Literal["pending", "delivered", "failed"]
    attempts: int
    max_attempts: int
    last_status_code: int | None
    last_error: str | None
    # When the next attempt is due, while pending.
    next_attempt_at: datetime | None
    created_at: datetime
    delivered_at: datetime | None
    updated_at: datetime


class DeliveryList(BaseModel):
    job_id: uuid.UUID
    items: list[DeliveryView]


_COLUMNS = tuple(DeliveryView.model_fields)

router = APIRouter(tags=["jobs"], default_response_class=JsonBody, route_class=ReadRoute)


@router.get(
    "/jobs/{job_id}/deliveries",
    response_model=DeliveryList,
    responses={status: {"model": Problem} for status in (401, 403, 404, 422, 503)},
)
async def list_deliveries(job_id: uuid.UUID, tenant: TenantDep, db_session: SessionDep) -> Response:
    """The job's webhook deliveries, oldest first (none unless it has a callback URL)."""
    rows = await job_deliveries(db_session, tenant, job_id)
    items: list[dict[str, Any]] = [{column: row[column] for column in _COLUMNS} for row in rows]
    return JsonBody({"job_id": job_id, "items": items})
