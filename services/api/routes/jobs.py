"""The job routes. Every one needs an API key with the route's scope (checked before
anything else, :mod:`services.api.auth`) and sees only its tenant's jobs.

``POST /jobs/{type}`` is one route per registered job type, so /openapi.json shows each
type's payload schema (served by :mod:`services.api.routes.enqueue`); a catch-all answers
404 for any other type.
"""

# No `from __future__ import annotations` here: FastAPI reads the routes' signatures.

import asyncio
import mimetypes
import uuid
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Header, Query, Request
from pydantic.json_schema import models_json_schema
from starlette.responses import FileResponse, RedirectResponse, Response

from jobcore.execution.completion_webhooks import completion_params
from jobcore.execution.registry import JobType, Registry
from jobcore.kernel.errors import JobNotFound, UnknownJobType
from jobcore.kernel.priorities import Priority
from jobcore.kernel.states import JobStatus
from jobcore.usecases import job_edits, reads
from jobcore.usecases import jobs as job_usecases
from jobcore.usecases.enqueue.write_many import MAX_BATCH_ITEMS
from jobcore.usecases.job_edits import JobChanges
from jobcore.usecases.timeline import job_timeline
from services.api import paths, views
from services.api.auth import ActorDep, CancelRoute, EnqueueRoute, ReadRoute, TenantDep
from services.api.cursor import CURSOR_PATTERN, MAX_CURSOR_LENGTH, decode_cursor, encode_cursor
from services.api.deps import DbDep, SessionDep, StateDep
from services.api.metrics import ENQUEUE_ROUTE_PREFIX
from services.api.routes import batch, enqueue, waiting
from services.api.routes.enqueue import EntityIdQuery
from services.api.schemas import (
    Accepted,
    BatchAnswer,
    CancelAnswer,
    JobEdit,
    JobPage,
    JobTimelineView,
    JobView,
    Problem,
)
from services.api.views import JsonBody

_TYPE_PATTERN = r"^[a-z][a-z0-9_]{0,62}$"
REF_TEMPLATE = "#/components/schemas/{model}"
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 200


def _problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    # Shown as application/problem+json by problems.document_problem_responses.
    return {status: {"model": Problem} for status in (401, 403, 503, *statuses)}


# jobcore.kernel.quotas.rate_headers: on every enqueue answer while the tenant's rate is limited.
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
    **_problems(400, 409, 413, 415, 422, 502),
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


def _unique_note(job_type: JobType[Any]) -> str:
    if job_type.unique_field is None:
        return ""
    return (
        f" Unique by the payload's `{job_type.unique_field}`: while a pending or running "
        "job has the same value (or `unique_key`), the request answers 409."
    )


def _keyed_note(job_type: JobType[Any]) -> str:
    """What the route's description says of the type's debounce or throttle."""
    if job_type.debounce is not None:
        debounce = job_type.debounce
        kept = (
            f"every payload (up to {debounce.max_payloads})"
            if debounce.payloads == "all"
            else "the last payload"
        )
        return (
            f" Debounced by {_per(debounce.per)}: requests of one key join one job "
            f"(`joined`), which runs {debounce.period:g} s after the last of them and at "
            f"most {debounce.wait_cap:g} s after the first, with {kept}."
        )
    if job_type.throttle is not None:
        throttle = job_type.throttle
        return (
            f" Throttled by {_per(throttle.per)}: one job per {throttle.period:g} s; the "
            "requests of a key within that period are answered with its job (`joined`) "
            "and write nothing."
        )
    return ""


def _per(per: str) -> str:
    return "tenant" if per == "tenant" else f"the payload's `{per}`"


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
    where = reads.JobFilter(entity_id=entity_id, status=status, type=type)
    after = decode_cursor(cursor) if cursor else None
    page = await reads.list_jobs(db_session, tenant, where, limit=limit, after=after)
    next_cursor = None if page.next_after is None else encode_cursor(*page.next_after)
    next_link = None
    if next_cursor is not None:
        query = {**request.query_params, "cursor": next_cursor}
        next_link = f"{request.url.path}?{urlencode(query)}"
    body = {
        "items": [views.job_summary(row) for row in page.rows],
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
    row = await reads.job_result(db_session, tenant, job_id)
    if row["result_ref"] is None:
        return JsonBody(row["result"])
    url = state.results.presigned_url(row["result_ref"])
    if url is not None:
        # A bucket: the client fetches it from the store, with a URL that soon expires.
        return RedirectResponse(url, status_code=302, headers={"Cache-Control": "no-store"})
    path = state.results.path(row["result_ref"])
    media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return FileResponse(path, media_type=media_type)


async def get_payload(
    job_id: uuid.UUID, tenant: TenantDep, db_session: SessionDep, state: StateDep
) -> Response:
    """The job's payload as JSON: the one kept in the job, or the one stored by reference
    (``payload_ref``), which ``GET /jobs/{id}`` answers as null."""
    row = await reads.job_payload(db_session, tenant, job_id)
    if row["payload_ref"] is None:
        return JsonBody(row["payload"])
    url = state.results.presigned_url(row["payload_ref"])
    if url is not None:
        # A bucket: as for a result, the client fetches it from the store.
        return RedirectResponse(url, status_code=302, headers={"Cache-Control": "no-store"})
    # The local directory: at most JOBCORE_MAX_BODY_BYTES, as it came in.
    data = await asyncio.to_thread(state.results.get, row["payload_ref"])
    return Response(data, media_type="application/json")


# Read as optional, so that a request without it is answered 428 (not FastAPI's 422);
# documented as required (_IF_MATCH).
IfMatchHeader = Annotated[str | None, Header(alias="If-Match", include_in_schema=False)]
_IF_MATCH = {
    "name": "If-Match",
    "in": "header",
    "required": True,
    "description": "The ETag of the job as `GET /jobs/{id}` answered it (its `version`, "
    "quoted): the edit applies only if the job is still that version. Without it, or with "
    "`*` or a weak ETag: 428.",
    "schema": {"type": "string", "pattern": '^"[0-9]{1,20}"$', "examples": ['"48213"']},
}


def if_match_version(value: str | None) -> str | None:
    """The version an If-Match names: its one strong ETag, unquoted. None (428) without
    one; ``*`` names no version and a weak ETag is not a version either, so an edit
    cannot skip the comparison."""
    if value is None:
        return None
    tag = value.strip()
    if len(tag) < 2 or not (tag.startswith('"') and tag.endswith('"')) or "," in tag:
        return None
    return tag[1:-1]


async def edit_job(
    job_id: uuid.UUID,
    edit: JobEdit,
    tenant: TenantDep,
    actor: ActorDep,
    db: DbDep,
    state: StateDep,
    if_match: IfMatchHeader = None,
) -> Response:
    """Change a pending job's `run_at`, `priority` or `payload` in place, if it is still
    the version read (`If-Match`). Answers the job as it is now, with its new ETag."""
    changes = JobChanges(
        run_at=edit.run_at,
        priority=None if edit.priority is None else Priority.parse(edit.priority),
        payload=edit.payload,
    )
    await job_edits.edit_job(
        db,
        state.settings,
        state.registry,
        job_id,
        version=if_match_version(if_match),
        changes=changes,
        actor=actor,
        tenant=tenant,
    )
    async with db.session() as session:
        row = await reads.get_job(session, tenant, job_id)
    return views.job_answer(row)


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
            enqueue.documented_endpoint(job_type),
            name=f"{ENQUEUE_ROUTE_PREFIX}{job_type.name}",
            methods=["POST"],
            status_code=202,
            response_model=Accepted,
            summary=f"Enqueue a {job_type.name} job",
            description=f"The body is the job's payload. Queue: `{job_type.queue}`; "
            f"up to {job_type.max_attempts} attempts unless `max_attempts` says otherwise."
            + _unique_note(job_type)
            + _keyed_note(job_type),
            openapi_extra=_request_body(schema_refs[job_type.name]),
            responses=_ENQUEUE_RESPONSES,
            route_class_override=enqueue.route_class(job_type),
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
        paths.ONE_JOB,
        edit_job,
        methods=["PATCH"],
        response_model=JobView,
        summary="Change a pending job in place",
        description="Changes `run_at`, `priority` and `payload` of a job that is pending "
        "(never claimed since it was read, or back to pending), compare-and-set on the "
        "version read: `If-Match` names the ETag of `GET /jobs/{id}`. `428` without it, "
        "`412` when the job changed since (read it again), `409` when it was claimed or "
        "ended (a running attempt never sees a change). A new payload is validated as an "
        "enqueue's and may not change the job's unique, concurrency or rate key (`422`). "
        "Audited; the job's timeline gets an `edited` event.",
        responses={
            200: {
                "description": "Changed: the job as it is now.",
                "headers": {
                    "ETag": {
                        "description": "The job's new version: the next edit's `If-Match`.",
                        "schema": {"type": "string"},
                    }
                },
            },
            **_problems(404, 409, 412, 422, 428),
            405: {
                "model": Problem,
                "description": "The id is shaped like a job type name: the path is that "
                "type's enqueue route (`POST` only).",
            },
        },
        openapi_extra={"parameters": [_IF_MATCH]},
        route_class_override=EnqueueRoute,
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
            302: {
                "description": "The stored result is in an S3-compatible bucket "
                "(`JOBCORE_RESULT_STORE=s3://...`): `Location` is a presigned URL for it, "
                "valid `JOBCORE_S3_PRESIGN_EXPIRY` seconds.",
                "headers": {
                    "Location": {
                        "description": "A short-lived presigned URL of the result.",
                        "schema": {"type": "string", "format": "uri"},
                    }
                },
            },
            **_problems(404, 409, 422),
        },
        route_class_override=ReadRoute,
    )
    router.add_api_route(
        "/jobs/{job_id}/payload",
        get_payload,
        methods=["GET"],
        responses={
            200: {
                "description": "The payload as JSON, as the job was enqueued with it (after "
                "its type's validation and defaults).",
                "content": {"application/json": {"schema": {"type": "object"}}},
            },
            302: {
                "description": "The payload is stored by reference (larger than "
                "`JOBCORE_INLINE_PAYLOAD_MAX_BYTES`) in an S3-compatible bucket: "
                "`Location` is a presigned URL for it, valid `JOBCORE_S3_PRESIGN_EXPIRY` "
                "seconds.",
                "headers": {
                    "Location": {
                        "description": "A short-lived presigned URL of the payload.",
                        "schema": {"type": "string", "format": "uri"},
                    }
                },
            },
            **_problems(404, 422),
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
