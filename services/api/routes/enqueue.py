"""``POST /jobs/{type}``: the hot path, served without FastAPI's per-request machinery.

FastAPI documents the route from :func:`documented_endpoint`'s signature (the query
parameters, the ``Idempotency-Key`` header, the bearer scheme), but requests never reach
it: :func:`route_class` gives the route a handler of its own. FastAPI's dependency solving
for that signature (a dozen parameters and seven dependencies) cost the API more CPU than
the enqueue statement (docs/bench/measurements.md, "The API's hot path"). The
handler reads the same parameters with one pydantic model built from the same
``Annotated`` declarations (:class:`EnqueueQuery`), so the rules and the 422s they give
are the ones /openapi.json shows, in the order the documented signature resolved them:
the key, the ``Idempotency-Key``, the body, the query (then the rules between its fields,
which building the :class:`~jobcore.usecases.enqueue.submit.EnqueueRequest` checks), the callback
URL's host; a pooled connection is taken only after all of them, for the one statement.

The API key is authenticated before anything else, as on every route, from a memory of
keys this process verified in the last :data:`KEY_MEMORY_SECONDS` (a lookup otherwise);
the enqueue statement checks that the key is still usable by its id, so a revocation or
an expiry stops enqueues at once (:mod:`jobcore.database.sql.tenant_quotas`).
"""

# No `from __future__ import annotations`: FastAPI reads documented_endpoint's signature,
# which refers to a dependency local to the function that builds it.

from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.responses import Response

from jobcore.access.apikeys import InvalidApiKey
from jobcore.database.gateway import Database
from jobcore.execution.payloads import validate_payload
from jobcore.execution.registry import MAX_ATTEMPTS_LIMIT, JobType
from jobcore.kernel.envelope import PRINTABLE_TEXT
from jobcore.kernel.errors import InvalidField, JobcoreError, ServiceStateError
from jobcore.kernel.priorities import Priority
from jobcore.kernel.scopes import Scope
from jobcore.usecases.enqueue.submit import (
    MAX_IDEMPOTENCY_KEY_LENGTH,
    EnqueueRequest,
    check_idempotency_key,
    coalescable,
    enqueue_coalesced,
    enqueue_on,
)
from jobcore.usecases.enqueue.write_one import EnqueueResult
from services.api import views
from services.api.auth import (
    EnqueueRoute,
    KeyCache,
    TenantDep,
    authenticate,
    request_principal,
)
from services.api.body import read_json
from services.api.callbacks import CallbackUrlDep, CallbackUrlQuery, check_callback
from services.api.coalescing import EnqueueCoalescer
from services.api.deps import ApiState
from services.api.problems import located
from services.api.schemas import PriorityLabel
from services.api.tracing import enqueue_span
from services.api.views import JsonBody

# Long enough that a key in steady use costs no lookup; short enough that the key's
# last_used_at (a minute's resolution) stays true. Revocation does not wait for it.
KEY_MEMORY_SECONDS = 10.0
# Remembers nothing: the key is looked up whatever JOBCORE_API_KEY_CACHE_SECONDS says.
NO_MEMORY = KeyCache(0.0)
MAX_DELAY_SECONDS = 366 * 24 * 3600
IDEMPOTENCY_KEY_PATTERN = r"^[!-~](?:[ -~]*[!-~])?$"

EntityIdQuery = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=255,
        pattern=PRINTABLE_TEXT,
        description="Your id of what the job is about, for `GET /jobs?entity_id=`.",
    ),
]
OrderingKeyQuery = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=255,
        pattern=PRINTABLE_TEXT,
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
        pattern=PRINTABLE_TEXT,
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


class EnqueueQuery(BaseModel):
    """The query parameters of ``POST /jobs/{type}``, with the rules FastAPI documents."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    entity_id: EntityIdQuery = None
    max_attempts: MaxAttemptsQuery = None
    run_at: RunAtQuery = None
    delay: DelayQuery = None
    unique_key: UniqueKeyQuery = None
    priority: PriorityQuery = None
    ordering_key: OrderingKeyQuery = None
    callback_url: CallbackUrlQuery = None


def parse_query(request: Request) -> EnqueueQuery:
    """The request's query parameters (the last value of a repeated one, as FastAPI takes
    it), or the 422 FastAPI would answer, every bad parameter located under ``query``."""
    params = request.query_params
    if not params:
        return _NO_QUERY
    try:
        return EnqueueQuery.model_validate(dict(params))
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        for error in errors:
            error["loc"] = ("query", *error["loc"])
        raise RequestValidationError(errors) from None


_NO_QUERY = EnqueueQuery()


def idempotency_key_dependency(description: str) -> Callable[..., Awaitable[str | None]]:
    """The ``Idempotency-Key`` header of a route whose retries it makes safe, with what
    the route's key means as its ``description``: the same header, limits and check on
    every route that takes one (``POST /jobs/{type}``, ``POST /workflows``)."""

    async def idempotency_key(
        key: Annotated[
            str | None,
            Header(
                alias="Idempotency-Key",
                description=description,
                # Checked by jobcore.usecases.enqueue.submit (a 400, not FastAPI's 422);
                # HTTP trims spaces around a header value, so a key neither starts nor
                # ends with one.
                json_schema_extra={
                    "minLength": 1,
                    "maxLength": MAX_IDEMPOTENCY_KEY_LENGTH,
                    "pattern": IDEMPOTENCY_KEY_PATTERN,
                },
            ),
        ] = None,
    ) -> str | None:
        check_idempotency_key(key)
        return key

    return idempotency_key


IdempotencyKeyDep = Annotated[
    str | None,
    Depends(
        idempotency_key_dependency(
            "Makes retries safe: the same key (per tenant and job type) and request "
            "(payload, callback_url, run_at/delay, max_attempts, entity_id, unique_key, "
            "priority, ordering_key) answer the same job; a different request answers 422. "
            "A key is kept as long as its job. 1 to 255 printable ASCII characters, else "
            "400 `invalid-idempotency-key`."
        )
    ),
]


def documented_endpoint(job_type: JobType[Any]) -> Callable[..., Awaitable[Response]]:
    """What /openapi.json says of the route: its signature. Requests go to the route's own
    handler (:func:`route_class`), which reads the same parameters the same way."""

    # The body's schema is the route's openapi_extra (jobs.build_router).
    async def enqueue_job(
        tenant: TenantDep,
        key: IdempotencyKeyDep,
        callback_url: CallbackUrlDep,
        entity_id: EntityIdQuery = None,
        max_attempts: MaxAttemptsQuery = None,
        run_at: RunAtQuery = None,
        delay: DelayQuery = None,
        unique_key: UniqueKeyQuery = None,
        priority: PriorityQuery = None,
        ordering_key: OrderingKeyQuery = None,
    ) -> Response:
        raise RuntimeError(f"POST /jobs/{job_type.name} is served by its route's handler")

    return enqueue_job


def field_location(field: str) -> list[str | int] | None:
    """Where ``POST /jobs/{type}`` carries a field of its :class:`EnqueueRequest`: the
    body, a query parameter, or (None) the ``Idempotency-Key`` header."""
    if field == "payload":
        return ["body"]
    if field == "idempotency_key":
        return None
    return ["query", field]


def handler(job_type: JobType[Any]) -> Callable[[Request], Coroutine[Any, Any, Response]]:
    """The handler of ``POST /jobs/{job_type}``, once its caller is authenticated."""

    async def enqueue_job(request: Request) -> Response:
        state: ApiState = request.app.state.api
        principal = request_principal(request)
        try:
            key = request.headers.get("idempotency-key")
            # Before the body is read, as the documented signature resolves it; the
            # request checks it again with its other fields, at no noticeable cost.
            check_idempotency_key(key)
            raw = await read_json(request, state.settings.max_body_bytes)
            model = validate_payload(job_type, raw)
            query = parse_query(request)
            wanted = EnqueueRequest(
                tenant=principal.tenant,
                job_type=job_type,
                payload=model,
                sent=raw,
                idempotency_key=key,
                unique_key=query.unique_key,
                entity_id=query.entity_id,
                max_attempts=query.max_attempts,
                run_at=query.run_at,
                delay=query.delay,
                priority=None if query.priority is None else Priority.parse(query.priority),
                ordering_key=query.ordering_key,
                # Checked below, before the request takes a pooled connection.
                callback_url=query.callback_url,
                key_id=principal.key_id,
            )
        except (JobcoreError, RequestValidationError) as exc:
            # What the request got wrong is told only to a key that is usable now, not
            # one revoked since it was remembered (docs/design.md, invariant 13).
            await authenticate(request, Scope.ENQUEUE, fresh=True)
            if isinstance(exc, InvalidField):
                raise located(exc, field_location(exc.field)) from None
            raise
        await check_callback(wanted.callback_url, state)
        if state.db is None or state.enqueues is None:
            # Before start-up or after shutdown: the same answer as a closed pool.
            raise ServiceStateError("the database pool is not open")
        try:
            # Its job with its outbox row, committed alone or with others of the tenant's
            # that queued meanwhile (services.api.coalescing). Inside the enqueue span, so
            # the outbox row carries that span's context.
            with enqueue_span(job_type.name) as span:
                result = await state.enqueues.enqueue(wanted)
                if span is not None:
                    span.set_attributes(
                        {
                            "tenant": result.tenant,
                            "job.id": str(result.job_id),
                            "job.replayed": result.replayed,
                        }
                    )
        except InvalidApiKey:
            # Revoked or expired since it was remembered: looked up next time.
            if state.enqueue_keys is not None:
                state.enqueue_keys.forget(principal.key_id)
            raise
        state.metrics.count_enqueued(job_type.name, replayed=result.replayed, joined=result.joined)
        headers = {"Location": views.job_path(result.job_id), **result.rate_headers}
        if result.replayed:
            headers["Idempotent-Replayed"] = "true"
        return JsonBody(views.accepted(result), status_code=202, headers=headers)

    return enqueue_job


def coalescer(state: ApiState, db: Database) -> EnqueueCoalescer:
    """How ``POST /jobs/{type}`` writes its jobs while ``db`` is open: one statement
    each, or coalesced per tenant under load (JOBCORE_API_ENQUEUE_COALESCE_MAX)."""
    settings = state.settings

    async def write_one(request: EnqueueRequest) -> EnqueueResult:
        # One statement, committed on its own: the job with its outbox row, or neither.
        # No connection is held while a large payload uploads (enqueue_on).
        result = await enqueue_on(
            db,
            state.topology,
            request,
            quotas=settings.quota_defaults,
            wakeups=state.relay_wakeups,
            payload_store=state.results,
            inline_payload_max_bytes=settings.inline_payload_max_bytes,
            uploads=state.metrics,
        )
        state.metrics.count_write()
        return result

    async def write_many(
        requests: Sequence[EnqueueRequest], traces: Sequence[dict[str, str]]
    ) -> list[EnqueueResult | JobcoreError]:
        answers = await enqueue_coalesced(
            db,
            state.topology,
            requests,
            traces,
            quotas=settings.quota_defaults,
            wakeups=state.relay_wakeups,
        )
        state.metrics.count_write(requests=len(requests))
        return answers

    def may_coalesce(request: EnqueueRequest) -> bool:
        return coalescable(request, settings.inline_payload_max_bytes)

    return EnqueueCoalescer(
        write_one,
        write_many,
        coalescable=may_coalesce,
        max_items=settings.api_enqueue_coalesce_max,
    )


def route_class(job_type: JobType[Any]) -> type[EnqueueRoute]:
    """The route of ``POST /jobs/{job_type}``: authenticated first, from the keys it
    remembers (see the module), then :func:`handler`, with no dependency solving."""
    handle = handler(job_type)

    class EnqueueJobRoute(EnqueueRoute):
        def authenticated_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            return handle

        def key_memory(self, request: Request) -> KeyCache | None:
            if "callback_url" in request.query_params:
                # Resolving the caller's host is work done for the caller: such a
                # request has its key looked up, not taken from any memory.
                return NO_MEMORY
            memory: KeyCache | None = request.app.state.api.enqueue_keys
            return memory

    return EnqueueJobRoute
