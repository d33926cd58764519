"""The job routes. Every one needs an API key with the route's scope (checked before
anything else, :mod:`services.api.auth`) and sees only its tenant's jobs.

``POST /jobs/{type}`` is one route per registered job type, so /openapi.json shows each
type's payload schema; a catch-all answers 404 for any other type.
"""

# No `from __future__ import annotations` here: FastAPI reads the enqueue routes'
# signatures, which refer to a dependency local to the function that builds each route,
# and a string annotation could not be resolved from the module's globals.

import mimetypes
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Header, Query, Request
from pydantic.json_schema import models_json_schema
from starlette.responses import FileResponse, Response

from jobcore.enqueue import request_fingerprint
from jobcore.envelope import PRINTABLE_TEXT
from jobcore.errors import UnknownJobType
from jobcore.payloads import validate_payload
from jobcore.registry import MAX_ATTEMPTS_LIMIT, JobType, Registry
from jobcore.states import JobStatus
from jobcore.usecases import jobs as job_usecases
from jobcore.webhooks import completion_params
from services.api import operations, views
from services.api.auth import CancelRoute, EnqueueRoute, ReadRoute, TenantDep
from services.api.body import read_json
from services.api.callbacks import CallbackUrlDep
from services.api.deps import SessionDep, StateDep
from services.api.metrics import ENQUEUE_ROUTE_PREFIX
from services.api.routes import waiting
from services.api.schemas import Accepted, CancelAnswer, JobPage, JobView, Problem
from services.api.views import JsonBody

# A printable id, as PostgreSQL text takes it (the envelope's rule for a job type).
_TEXT_PATTERN = PRINTABLE_TEXT
_TYPE_PATTERN = r"^[a-z][a-z0-9_]{0,62}$"
REF_TEMPLATE = "#/components/schemas/{model}"
MAX_DELAY_SECONDS = 366 * 24 * 3600
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200


def _problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    # Shown as application/problem+json by problems.document_problem_responses.
    return {status: {"model": Problem} for status in (401, 403, 503, *statuses)}


EntityIdQuery = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=255,
        pattern=_TEXT_PATTERN,
        description="Your id of what the job is about, for `GET /jobs?entity_id=`.",
    ),
]
OrderingKeyQuery = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=255,
        pattern=_TEXT_PATTERN,
        description="Jobs of yours with the same ordering key start one at a time, in the "
        "order they were accepted: each after the one before it has finished (a failed one "
        'keeps the rest waiting if its type says `ordering="block"`).',
    ),
]
MaxAttemptsQuery = Annotated[
    int | None,
    Query(ge=1, le=MAX_ATTEMPTS_LIMIT, description="Defaults to the job type's own limit."),
]
RunAtQuery = Annotated[
    datetime | None,
    Query(description="Run no earlier than this (RFC 3339 with an offset, within a year)."),
]
DelayQuery = Annotated[
    float | None,
    Query(
        ge=0, le=MAX_DELAY_SECONDS, description="Run no earlier than this many seconds from now."
    ),
]


async def idempotency_key(
    key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            description="Makes retries safe: the same key (per tenant and job type) and "
            "request (payload, callback_url, run_at/delay, max_attempts, entity_id, "
            "ordering_key) answer "
            "the same job; a different request answers 422. A key is kept as long as its "
            "job.",
        ),
    ] = None,
) -> str | None:
    return operations.check_idempotency_key(key)


IdempotencyKeyDep = Annotated[str | None, Depends(idempotency_key)]


def _enqueue_route(job_type: JobType[Any]) -> Callable[..., Awaitable[Response]]:
    async def read_payload(request: Request, state: StateDep) -> operations.ReceivedPayload:
        raw = await read_json(request, state.settings.max_body_bytes)
        return operations.ReceivedPayload(raw, validate_payload(job_type, raw))

    # Parameter order is resolution order: the Idempotency-Key, the body and the callback
    # URL are checked before a pooled connection is taken (the key was checked before all).
    async def enqueue_job(
        tenant: TenantDep,
        key: IdempotencyKeyDep,
        payload: Annotated[operations.ReceivedPayload, Depends(read_payload)],
        callback_url: CallbackUrlDep,
        db_session: SessionDep,
        state: StateDep,
        entity_id: EntityIdQuery = None,
        max_attempts: MaxAttemptsQuery = None,
        run_at: RunAtQuery = None,
        delay: DelayQuery = None,
        ordering_key: OrderingKeyQuery = None,
    ) -> Response:
        submission = operations.Submission(
            idempotency_key=key,
            entity_id=entity_id,
            ordering_key=ordering_key,
            max_attempts=max_attempts,
            run_at=operations.schedule(run_at, delay),
            callback_url=callback_url,
            fingerprint=request_fingerprint(
                payload.raw,
                callback_url=callback_url,
                run_at=run_at,
                delay=delay,
                max_attempts=max_attempts,
                entity_id=entity_id,
                ordering_key=ordering_key,
            ),
        )
        # One statement, committed on its own: the job with its outbox row, or neither.
        result = await operations.submit(
            db_session,
            state.topology,
            tenant=tenant,
            job_type=job_type,
            payload=payload.model,
            submission=submission,
            quotas=state.settings.quota_defaults,
        )
        state.metrics.count_enqueued(job_type.name, replayed=result.replayed)
        headers = {"Location": views.job_path(result.job_id), **result.rate_headers}
        if result.replayed:
            headers["Idempotent-Replayed"] = "true"
        return JsonBody(views.accepted(result), status_code=202, headers=headers)

    return enqueue_job


def payload_schemas(registry: Registry) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Each job type's payload schema reference, and the schemas they refer to."""
    refs, definitions = models_json_schema(
        [(job_type.payload_model, "validation") for job_type in registry],
        ref_template=REF_TEMPLATE,
    )
    by_type = {job_type.name: refs[(job_type.payload_model, "validation")] for job_type in registry}
    return by_type, definitions.get("$defs", {})


def _request_body(schema_ref: dict[str, Any]) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema_ref}},
        }
    }


async def enqueue_unknown_type(job_type: str) -> Response:
    # An EnqueueRoute: a caller without a valid key gets 401, not this 404.
    raise UnknownJobType(f"unknown job type {job_type!r}")


async def list_jobs(
    tenant: TenantDep,
    db_session: SessionDep,
    request: Request,
    entity_id: EntityIdQuery = None,
    status: Annotated[JobStatus | None, Query()] = None,
    type: Annotated[str | None, Query(pattern=_TYPE_PATTERN)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = DEFAULT_PAGE_SIZE,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    """The tenant's jobs, newest first, a page at a time (follow ``links.next``)."""
    where = operations.JobFilter(entity_id=entity_id, status=status, type=type)
    rows, next_cursor = await operations.list_jobs(
        db_session, tenant, where, limit=limit, cursor=cursor
    )
    next_link = None
    if next_cursor is not None:
        query = {**request.query_params, "cursor": next_cursor}
        next_link = f"{request.url.path}?{urlencode(query)}"
    body = {
        "items": [views.job_summary(row) for row in rows],
        "next_cursor": next_cursor,
        "links": {"next": next_link},
    }
    return JsonBody(body)


async def cancel_job(
    job_id: uuid.UUID, tenant: TenantDep, db_session: SessionDep, state: StateDep
) -> Response:
    """Pending: cancelled now (200). Running: the worker is asked to stop it (202).
    Finished: 409 with its status."""
    completion = completion_params(state.topology, state.settings)
    async with db_session.transaction() as uow:
        outcome = await job_usecases.cancel_job(uow, tenant, job_id, completion=completion)
        await uow.commit()
    return JsonBody(views.cancel_answer(outcome), status_code=202 if outcome.requested else 200)


async def get_result(
    job_id: uuid.UUID, tenant: TenantDep, db_session: SessionDep, state: StateDep
) -> Response:
    """A succeeded job's result: inline JSON, or the stored file with its content type."""
    row = await operations.job_result(db_session, tenant, job_id)
    if row["result_ref"] is None:
        return JsonBody(row["result"])
    path = state.results.path(row["result_ref"])
    media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return FileResponse(path, media_type=media_type)


def build_router(registry: Registry) -> APIRouter:
    router = APIRouter(tags=["jobs"], default_response_class=JsonBody)
    schema_refs, _ = payload_schemas(registry)
    for job_type in registry:
        router.add_api_route(
            f"/jobs/{job_type.name}",
            _enqueue_route(job_type),
            name=f"{ENQUEUE_ROUTE_PREFIX}{job_type.name}",
            methods=["POST"],
            status_code=202,
            response_model=Accepted,
            summary=f"Enqueue a {job_type.name} job",
            description=f"The body is the job's payload. Queue: `{job_type.queue}`; "
            f"up to {job_type.max_attempts} attempts unless `max_attempts` says otherwise.",
            openapi_extra=_request_body(schema_refs[job_type.name]),
            responses=_problems(400, 413, 415, 422, 429),
            route_class_override=EnqueueRoute,
        )
    router.add_api_route(
        "/jobs/{job_type}",
        enqueue_unknown_type,
        name=f"{ENQUEUE_ROUTE_PREFIX}unknown_type",
        methods=["POST"],
        include_in_schema=False,
        route_class_override=EnqueueRoute,
    )
    router.add_api_route(
        "/jobs",
        list_jobs,
        methods=["GET"],
        response_model=JobPage,
        responses=_problems(400, 422),
        route_class_override=ReadRoute,
    )
    router.add_api_route(
        "/jobs/{job_id}",
        waiting.get_job,
        methods=["GET"],
        response_model=JobView,
        responses=_problems(400, 404, 422, 429),
        route_class_override=ReadRoute,
    )
    router.add_api_route(
        "/jobs/{job_id}/result",
        get_result,
        methods=["GET"],
        responses={
            200: {
                "description": "The inline result as JSON, or the stored result's bytes.",
                "content": {
                    "application/json": {"schema": {}},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                },
            },
            **_problems(404, 409, 422),
        },
        route_class_override=ReadRoute,
    )
    router.add_api_route(
        "/jobs/{job_id}/cancel",
        cancel_job,
        methods=["POST"],
        response_model=CancelAnswer,
        responses={202: {"model": CancelAnswer}, **_problems(404, 409, 422)},
        route_class_override=CancelRoute,
    )
    return router
