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

from jobcore.batch import MAX_BATCH_ITEMS
from jobcore.enqueue import request_fingerprint
from jobcore.envelope import PRINTABLE_TEXT
from jobcore.errors import JobNotFound, UnknownJobType
from jobcore.payloads import validate_payload
from jobcore.priorities import Priority
from jobcore.registry import MAX_ATTEMPTS_LIMIT, JobType, Registry
from jobcore.states import JobStatus
from jobcore.usecases import jobs as job_usecases
from jobcore.usecases.timeline import job_timeline
from jobcore.webhooks import completion_params
from services.api import operations, paths, views
from services.api.auth import CancelRoute, EnqueueRoute, ReadRoute, TenantDep
from services.api.body import read_json
from services.api.callbacks import CallbackUrlDep
from services.api.cursor import CURSOR_PATTERN, MAX_CURSOR_LENGTH
from services.api.deps import DbDep, SessionDep, StateDep
from services.api.metrics import ENQUEUE_ROUTE_PREFIX
from services.api.routes import batch, waiting
from services.api.schemas import (
    Accepted,
    BatchAnswer,
    CancelAnswer,
    JobPage,
    JobTimelineView,
    JobView,
    PriorityLabel,
    Problem,
)
from services.api.views import JsonBody

# A printable id, as PostgreSQL text takes it (the envelope's rule for a job type).
_TEXT_PATTERN = PRINTABLE_TEXT
_TYPE_PATTERN = r"^[a-z][a-z0-9_]{0,62}$"
REF_TEMPLATE = "#/components/schemas/{model}"
MAX_DELAY_SECONDS = 366 * 24 * 3600
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
IDEMPOTENCY_KEY_PATTERN = r"^[!-~](?:[ -~]*[!-~])?$"


def _problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    # Shown as application/problem+json by problems.document_problem_responses.
    return {status: {"model": Problem} for status in (401, 403, 503, *statuses)}


# jobcore.quotas.rate_headers: on every enqueue answer while the tenant's rate is limited.
_RATE_HEADERS = {
    "RateLimit-Policy": {
        "description": 'The enqueue rate limit: `"enqueue";q=<burst>;w=<seconds the burst '
        "takes to refill>` (IETF RateLimit headers). Absent when the rate is unlimited.",
        "schema": {"type": "string", "examples": ['"enqueue";q=200;w=2']},
    },
    "RateLimit": {
        "description": 'What is left of it: `"enqueue";r=<requests left>;t=<seconds until '
        "full>`. Absent when the rate is unlimited.",
        "schema": {"type": "string", "examples": ['"enqueue";r=199;t=1']},
    },
}
_ENQUEUE_RESPONSES: dict[int | str, dict[str, Any]] = {
    **_problems(400, 409, 413, 415, 422),
    202: {
        "description": "Accepted: the job and its outbox message are stored.",
        "headers": {
            "Location": {
                "description": "The job: poll it with `GET`.",
                "required": True,
                "schema": {"type": "string", "format": "uri-reference"},
            },
            "Idempotent-Replayed": {
                "description": "The request repeated one already accepted with the same "
                "`Idempotency-Key`: this is that job.",
                "schema": {"type": "string", "enum": ["true"]},
            },
            **_RATE_HEADERS,
        },
    },
    429: {"model": Problem, "headers": _RATE_HEADERS},
}


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
UniqueKeyQuery = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=255,
        pattern=_TEXT_PATTERN,
        description="At most one pending or running job of this type per unique key: while "
        "one holds it, the request answers 409 `unique-job-exists` with that job's id. "
        "Defaults to the job type's unique payload field, if it names one.",
    ),
]
RunAtQuery = Annotated[
    datetime | None,
    Query(description="Run no earlier than this (RFC 3339 with an offset, within a year)."),
]
PriorityQuery = Annotated[
    PriorityLabel | None,
    Query(
        description="high, normal or low; defaults to the job type's own. A worker's "
        "queue serves higher levels first without starving lower ones (4:2:1 while all "
        "three wait)."
    ),
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
            "unique_key, priority, ordering_key) answer the same job; a different request "
            "answers 422. A key is kept as long as its job. 1 to 255 printable ASCII "
            "characters, else 400 `invalid-idempotency-key`.",
            # Checked by operations.check_idempotency_key (a 400, not FastAPI's 422); HTTP
            # trims spaces around a header value, so a key neither starts nor ends with one.
            json_schema_extra={
                "minLength": 1,
                "maxLength": operations.MAX_IDEMPOTENCY_KEY_LENGTH,
                "pattern": IDEMPOTENCY_KEY_PATTERN,
            },
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
        unique_key: UniqueKeyQuery = None,
        priority: PriorityQuery = None,
        ordering_key: OrderingKeyQuery = None,
    ) -> Response:
        submission = operations.Submission(
            idempotency_key=key,
            entity_id=entity_id,
            ordering_key=ordering_key,
            max_attempts=max_attempts,
            run_at=operations.schedule(run_at, delay),
            callback_url=callback_url,
            priority=None if priority is None else Priority.parse(priority),
            fingerprint=request_fingerprint(
                payload.raw,
                callback_url=callback_url,
                run_at=run_at,
                delay=delay,
                max_attempts=max_attempts,
                entity_id=entity_id,
                unique_key=unique_key,
                priority=None if priority is None else Priority.parse(priority),
                ordering_key=ordering_key,
            ),
            unique_key=unique_key,
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


def _unique_note(job_type: JobType[Any]) -> str:
    if job_type.unique_field is None:
        return ""
    return (
        f" Unique by the payload's `{job_type.unique_field}`: while a pending or running "
        "job has the same value (or `unique_key`), the request answers 409."
    )


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
    cursor: Annotated[
        str | None,
        Query(
            max_length=MAX_CURSOR_LENGTH,
            pattern=CURSOR_PATTERN,
            description="An opaque token: the `next_cursor` of the previous page (or "
            "`links.next` whole). One this API did not hand out answers 400 "
            "`invalid-cursor`.",
        ),
    ] = None,
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


async def get_timeline(job_id: uuid.UUID, tenant: TenantDep, db: DbDep) -> Response:
    """The job's events, oldest first (accepted, published, claimed, retries, its end, each
    webhook attempt), and where it is now in words. Another tenant's job is 404."""
    timeline = await job_timeline(db, job_id, tenant=tenant)
    if timeline is None:
        raise JobNotFound("no job with that id")
    return JsonBody(views.timeline_view(timeline))


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
            f"up to {job_type.max_attempts} attempts unless `max_attempts` says otherwise."
            + _unique_note(job_type),
            openapi_extra=_request_body(schema_refs[job_type.name]),
            responses=_ENQUEUE_RESPONSES,
            route_class_override=EnqueueRoute,
        )
    for job_type in registry:
        router.add_api_route(
            f"/jobs/{job_type.name}/batch",
            batch.batch_route(job_type),
            name=f"batch_enqueue_{job_type.name}",
            methods=["POST"],
            status_code=200,
            response_model=BatchAnswer,
            summary=f"Enqueue up to {MAX_BATCH_ITEMS} {job_type.name} jobs",
            description="Each item is a payload with its own optional `idempotency_key`, "
            "`unique_key`, `entity_id`, `max_attempts` and `run_at` or `delay`; "
            "`callback_url` applies to every item. The jobs created are committed together. "
            "`200` whenever the batch could be read and every item is valid: every item's "
            "outcome is in `items`, in order (`created`, `replayed`, `unique_conflict`, "
            "`refused` by a quota, `invalid` for an idempotency key used for another "
            "request). An invalid item refuses the whole batch with `422`, locating its "
            "errors under `items`. The rate limit counts items.",
            openapi_extra=batch.request_schema(schema_refs[job_type.name]),
            responses=_problems(400, 413, 415, 422),
            route_class_override=EnqueueRoute,
        )
    router.add_api_route(
        "/jobs/{job_type}/batch",
        batch.enqueue_batch_unknown_type,
        name="batch_enqueue_unknown_type",
        methods=["POST"],
        include_in_schema=False,
        route_class_override=EnqueueRoute,
    )
    router.add_api_route(
        paths.ANY_JOB_TYPE,
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
        paths.ONE_JOB,
        waiting.get_job,
        methods=["GET"],
        response_model=JobView,
        responses={
            **_problems(404, 422, 429),
            405: {
                "model": Problem,
                "description": "The id is shaped like a job type name: the path is that "
                "type's enqueue route (`POST` only).",
            },
        },
        route_class_override=ReadRoute,
    )
    router.add_api_route(
        "/jobs/{job_id}/result",
        get_result,
        methods=["GET"],
        responses={
            200: {
                "description": "The inline result as JSON, or the stored result's bytes "
                "with its own content type (`.csv`: `text/csv`).",
                "content": {
                    "application/json": {"schema": {}},
                    "*/*": {"schema": {"type": "string", "format": "binary"}},
                },
            },
            **_problems(404, 409, 422),
        },
        route_class_override=ReadRoute,
    )
    router.add_api_route(
        "/jobs/{job_id}/timeline",
        get_timeline,
        methods=["GET"],
        response_model=JobTimelineView,
        responses=_problems(400, 404, 422),
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
