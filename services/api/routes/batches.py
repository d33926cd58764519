"""The batch routes (:mod:`jobcore.usecases.batches`): create a batch of jobs with callbacks,
add jobs while it is open, close, read, list and cancel it. Every route needs a key with
its scope (enqueue to create, add and close; read; cancel) and sees only its tenant's
batches.

A batch's jobs are checked as ``POST /jobs/{type}/batch`` checks its items (each payload
by its type's model), and written all or none: an invalid job refuses the request with
``422`` locating it under ``jobs``; a job the database refuses (a unique key taken, a
quota) refuses it with that job's problem, nothing written.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' signatures.

import copy
import uuid
from typing import Annotated, Any, TypeVar

import orjson
from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.responses import Response

from jobcore.execution.completion_webhooks import completion_params
from jobcore.execution.payloads import validate_payload
from jobcore.execution.registry import InvalidPayloadError, Registry
from jobcore.kernel.envelope import PRINTABLE_TEXT
from jobcore.kernel.errors import InvalidField, JobcoreError
from jobcore.usecases import batches as batch_usecases
from jobcore.usecases.enqueue.submit import EnqueueRequest
from jobcore.usecases.enqueue.write_many import MAX_BATCH_ITEMS
from services.api.auth import CancelRoute, EnqueueRoute, ReadRoute, TenantDep
from services.api.body import read_json
from services.api.deps import DbDep, StateDep
from services.api.problems import BodyTooLarge, InvalidRequest, located, problem_document
from services.api.routes.batch import BatchItemFields, parse_json_strictly
from services.api.routes.jobs import payload_schemas
from services.api.schemas import BatchCreated, BatchJobsAdded, BatchList, BatchView, Problem
from services.api.views import JsonBody

_TYPE_PATTERN = r"^[a-z][a-z0-9_]{0,62}$"
M = TypeVar("M", bound=BaseModel)


class BatchJobFields(BatchItemFields):
    """One job of a batch: its type, and what an item of ``POST /jobs/{type}/batch`` takes
    (its payload, and what the single enqueue takes in its header and query)."""

    type: str = Field(pattern=_TYPE_PATTERN, description="The job type.")


class BatchCallbackFields(BaseModel):
    """A callback: a job of ``type`` enqueued once when its event first holds, with
    ``payload`` and the batch's outcome under ``payload.batch`` (``id``, ``event``,
    ``total``, ``succeeded``, ``failed``, ``cancelled``, ``pending``,
    ``first_death_job_id``, ``failed_job_ids``: up to 1,000)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    type: str = Field(pattern=_TYPE_PATTERN)
    payload: dict[str, Any] = Field(default_factory=dict)


class BatchCreateFields(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    id: uuid.UUID | None = Field(
        default=None,
        description="The batch's id (a new one unless given): a request repeated with the "
        "same id is answered from the batch it made (`200`, `Idempotent-Replayed: true`), "
        "its jobs matched by their `idempotency_key`.",
    )

    jobs: list[BatchJobFields] = Field(default_factory=list, max_length=MAX_BATCH_ITEMS)
    on_success: BatchCallbackFields | None = Field(
        default=None, description="Fires once every member has succeeded."
    )
    on_complete: BatchCallbackFields | None = Field(
        default=None, description="Fires once every member has settled, whatever its outcome."
    )
    on_death: BatchCallbackFields | None = Field(
        default=None, description="Fires once, at the first member that fails for good."
    )
    open: bool = Field(
        default=False,
        description="Leave the batch open for `POST /batches/{id}/jobs` until "
        "`POST /batches/{id}/close`; by default it is closed with the jobs given.",
    )
    parent_id: uuid.UUID | None = Field(
        default=None, description="An open batch this one joins as a member."
    )
    description: str | None = Field(default=None, max_length=500, pattern=PRINTABLE_TEXT)


class BatchAddFields(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    jobs: list[BatchJobFields] = Field(min_length=1, max_length=MAX_BATCH_ITEMS)
    close: bool = Field(default=False, description="Close the batch after these jobs.")


def _problems(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": Problem} for status in (401, 403, 503, *statuses)}


def _parse(model: type[M], body: Any) -> M:
    """The body as ``model``, refusing what its schema refuses (parse_json_strictly), with
    every error located under ``body``."""
    try:
        return parse_json_strictly(model, body)
    except ValidationError as exc:
        errors = [
            {"loc": ["body", *e["loc"]], "msg": e["msg"], "type": e["type"]}
            for e in exc.errors(include_url=False, include_input=False)
        ]
        raise InvalidRequest(errors, "the request body is invalid") from None


def _requests(
    registry: Registry, tenant: str, jobs: list[BatchJobFields], max_payload: int
) -> list[EnqueueRequest]:
    """Each job's request; every invalid one located under ``jobs`` in one 422."""
    requests: list[EnqueueRequest] = []
    errors: list[dict[str, Any]] = []
    for index, job in enumerate(jobs):
        where: list[str | int] = ["body", "jobs", index]
        try:
            if len(orjson.dumps(job.payload)) > max_payload:
                raise BodyTooLarge(f"job {index}'s payload is larger than {max_payload} bytes")
            job_type = registry.get(job.type)
            requests.append(
                EnqueueRequest(
                    tenant=tenant,
                    job_type=job_type,
                    payload=validate_payload(job_type, job.payload),
                    sent=job.payload,
                    idempotency_key=job.idempotency_key,
                    unique_key=job.unique_key,
                    entity_id=job.entity_id,
                    max_attempts=job.max_attempts,
                    run_at=job.run_at,
                    delay=job.delay,
                )
            )
        except InvalidField as exc:
            at = where if exc.field == "payload" else [*where, exc.field]
            errors.extend(_errors_of(located(exc, at), at))
        except InvalidPayloadError as exc:
            errors.extend(_errors_of(exc, [*where, "payload"]))
        except JobcoreError as exc:
            errors.extend(_errors_of(exc, where))
    if errors:
        raise InvalidRequest(errors, "a job of the batch is invalid; nothing was written")
    return requests


def _errors_of(error: JobcoreError, where: list[str | int]) -> list[dict[str, Any]]:
    document = problem_document(error)
    slug = str(document["type"]).rsplit("/", 1)[-1]
    found = document.get("errors") or [{"loc": [], "msg": document["detail"], "type": slug}]
    located_errors = []
    for one in found:
        loc = list(one.get("loc") or [])
        if loc[:1] == ["body"]:
            loc = loc[1:]
        if loc[: len(where)] != where:
            loc = [*where, *loc]
        located_errors.append({**one, "loc": loc})
    return located_errors


def _callbacks(registry: Registry, fields: BatchCreateFields) -> dict[str, batch_usecases.Callback]:
    callbacks = {}
    errors: list[dict[str, Any]] = []
    for name in batch_usecases.CALLBACK_EVENTS:
        given: BatchCallbackFields | None = getattr(fields, name)
        if given is None:
            continue
        try:
            callbacks[name] = batch_usecases.Callback(registry.get(given.type), given.payload)
        except JobcoreError as exc:
            errors.extend(_errors_of(exc, ["body", name, "type"]))
    if errors:
        raise InvalidRequest(errors, "a callback of the batch is invalid")
    return callbacks


def _member_refused(exc: batch_usecases.MemberRefused) -> JobcoreError:
    """A job the database refused: its own problem (409 unique key, 429 quota), or a 422
    locating it."""
    if isinstance(exc.error, InvalidField):
        return located(exc.error, ["body", "jobs", exc.index, exc.error.field])
    return exc.error


async def create_batch(request: Request, tenant: TenantDep, db: DbDep, state: StateDep) -> Response:
    """Create a batch with its jobs and callbacks, in one transaction (201)."""
    body = await read_json(request, state.settings.max_batch_body_bytes)
    fields = _parse(BatchCreateFields, body)
    members = _requests(state.registry, tenant, fields.jobs, state.settings.max_body_bytes)
    callbacks = _callbacks(state.registry, fields)
    try:
        written = await batch_usecases.create_batch(
            db,
            state.topology,
            tenant=tenant,
            members=members,
            callbacks=callbacks,
            parent_id=fields.parent_id,
            description=fields.description,
            close=not fields.open,
            quotas=state.settings.quota_defaults,
            batch_id=fields.id,
        )
    except batch_usecases.MemberRefused as exc:
        raise _member_refused(exc) from None
    except InvalidField as exc:
        raise located(exc, ["body", exc.field]) from None
    batch = await batch_usecases.get_batch(db, tenant=tenant, batch_id=written.batch_id)
    headers = {"Location": f"/batches/{written.batch_id}"}
    if written.replayed:
        headers["Idempotent-Replayed"] = "true"
    return JsonBody(
        {**batch, "job_ids": written.job_ids},
        status_code=200 if written.replayed else 201,
        headers=headers,
    )


async def add_jobs(
    batch_id: uuid.UUID, request: Request, tenant: TenantDep, db: DbDep, state: StateDep
) -> Response:
    """Add jobs to an open batch (409 once it is closed), all or none."""
    body = await read_json(request, state.settings.max_batch_body_bytes)
    fields = _parse(BatchAddFields, body)
    members = _requests(state.registry, tenant, fields.jobs, state.settings.max_body_bytes)
    try:
        written = await batch_usecases.add_members(
            db,
            state.topology,
            tenant=tenant,
            batch_id=batch_id,
            members=members,
            close=fields.close,
            quotas=state.settings.quota_defaults,
        )
    except batch_usecases.MemberRefused as exc:
        raise _member_refused(exc) from None
    return JsonBody({"batch_id": batch_id, "job_ids": written.job_ids, "closed": fields.close})


async def close_batch(batch_id: uuid.UUID, tenant: TenantDep, db: DbDep) -> Response:
    """Close the batch: no job joins it any more, and its callbacks fire once their
    conditions hold (at once, if its jobs have settled). Closing it again changes nothing."""
    return JsonBody(await batch_usecases.close_batch(db, tenant=tenant, batch_id=batch_id))


async def get_batch(batch_id: uuid.UUID, tenant: TenantDep, db: DbDep) -> Response:
    """The batch: its counts, status, failed jobs (up to 1,000) and callbacks fired."""
    return JsonBody(await batch_usecases.get_batch(db, tenant=tenant, batch_id=batch_id))


async def list_batches(
    tenant: TenantDep,
    db: DbDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> Response:
    """The tenant's newest batches, newest first."""
    items = await batch_usecases.list_batches(db, tenant=tenant, limit=limit)
    return JsonBody({"items": items})


async def cancel_batch(
    batch_id: uuid.UUID, tenant: TenantDep, db: DbDep, state: StateDep
) -> Response:
    """Close the batch and its child batches, cancel their pending jobs and ask the
    workers of their running ones to stop. on_complete fires once they have all settled."""
    completion = completion_params(state.topology, state.settings)
    batch = await batch_usecases.cancel_batch(
        db, tenant=tenant, batch_id=batch_id, completion=dict(completion)
    )
    return JsonBody(batch)


def _inlined(model: type[BaseModel]) -> dict[str, Any]:
    """The model's schema with its own definitions written in place (the document has no
    ``$defs`` for a ``$ref`` of the body's own to reach)."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(definitions[ref.removeprefix("#/$defs/")])
            return {key: inline(value) for key, value in node.items()}
        if isinstance(node, list):
            return [inline(item) for item in node]
        return node

    inlined: dict[str, Any] = inline(schema)
    return inlined


def _job_schema(registry: Registry, refs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A job of a batch: one of the registered types, with that type's payload (not a type
    debounced or throttled by key: an enqueue of a key may join a job outside the batch)."""
    job = _inlined(BatchJobFields)
    variants = []
    for job_type in registry:
        if job_type.debounce is not None or job_type.throttle is not None:
            continue
        variant = copy.deepcopy(job)
        variant["properties"]["type"] = {"type": "string", "const": job_type.name}
        variant["properties"]["payload"] = refs[job_type.name]
        variants.append(variant)
    return {"oneOf": variants} if variants else job


def _callback_schema(registry: Registry, definitions: dict[str, Any]) -> dict[str, Any] | None:
    """A callback: one of the types whose payload takes the batch's outcome under
    ``batch``, with that payload without it."""
    variants = []
    for job_type in registry:
        payload = definitions.get(job_type.payload_model.__name__)
        if payload is None or "batch" not in payload.get("properties", {}):
            continue
        given = copy.deepcopy(payload)
        del given["properties"]["batch"]
        if "required" in given:
            given["required"] = [name for name in given["required"] if name != "batch"]
        variants.append(
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["type"],
                "properties": {
                    "type": {"type": "string", "const": job_type.name},
                    "payload": given,
                },
            }
        )
    return {"oneOf": variants} if variants else None


def _request_bodies(registry: Registry) -> tuple[dict[str, Any], dict[str, Any]]:
    """The create and add request bodies for /openapi.json: each job one of the registered
    types with its payload, each callback one of the types that take a batch's outcome."""
    refs, definitions = payload_schemas(registry)
    job = _job_schema(registry, refs)
    create = _inlined(BatchCreateFields)
    create["properties"]["jobs"]["items"] = job
    callback = _callback_schema(registry, definitions)
    for name in batch_usecases.CALLBACK_EVENTS:
        if callback is None:
            del create["properties"][name]
        else:
            create["properties"][name] = {
                **callback,
                "description": create["properties"][name].get("description", ""),
            }
    add = _inlined(BatchAddFields)
    add["properties"]["jobs"]["items"] = job
    return _body(create), _body(add)


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def build_router(registry: Registry) -> APIRouter:
    router = APIRouter(tags=["batches"], default_response_class=JsonBody)
    create_body, add_body = _request_bodies(registry)
    router.add_api_route(
        "/batches",
        create_batch,
        methods=["POST"],
        status_code=201,
        response_model=BatchCreated,
        summary="Create a batch of jobs with callbacks",
        description=f"Up to {MAX_BATCH_ITEMS} jobs of any registered types, written with the "
        "batch in one transaction (all or none), and callbacks that each fire once: "
        "`on_success` when every member has succeeded (a member retried to success "
        "counts), `on_complete` when every member has settled, `on_death` at the first "
        "member that fails for good. Never before the batch is closed: at once by "
        "default, or by `POST /batches/{id}/close` for one created `open`. A batch "
        "created with `parent_id` is a member of that open batch.",
        openapi_extra=create_body,
        responses={
            **_problems(400, 404, 409, 413, 415, 422, 429),
            200: {"model": BatchCreated, "description": "A repeated request's batch."},
        },
        route_class_override=EnqueueRoute,
    )
    router.add_api_route(
        "/batches",
        list_batches,
        methods=["GET"],
        response_model=BatchList,
        responses=_problems(422),
        route_class_override=ReadRoute,
    )
    router.add_api_route(
        "/batches/{batch_id}",
        get_batch,
        methods=["GET"],
        response_model=BatchView,
        responses=_problems(404, 422),
        route_class_override=ReadRoute,
    )
    router.add_api_route(
        "/batches/{batch_id}/jobs",
        add_jobs,
        methods=["POST"],
        response_model=BatchJobsAdded,
        summary="Add jobs to an open batch",
        openapi_extra=add_body,
        responses=_problems(400, 404, 409, 413, 415, 422, 429),
        route_class_override=EnqueueRoute,
    )
    router.add_api_route(
        "/batches/{batch_id}/close",
        close_batch,
        methods=["POST"],
        response_model=BatchView,
        responses=_problems(404, 422),
        route_class_override=EnqueueRoute,
    )
    router.add_api_route(
        "/batches/{batch_id}/cancel",
        cancel_batch,
        methods=["POST"],
        response_model=BatchView,
        responses=_problems(404, 422),
        route_class_override=CancelRoute,
    )
    return router
