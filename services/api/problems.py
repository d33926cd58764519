"""Every error the API answers, as RFC 9457 problem JSON: the one place errors meet HTTP.

Domain errors (``jobcore.kernel.errors``) and the API's own input errors (below) are mapped to a
status and a stable ``type`` URI here and nowhere else; routes just raise.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from jobcore.access.apikeys import InvalidApiKey, MissingApiKey, MissingScope
from jobcore.execution.payloads import UnstorablePayload
from jobcore.execution.registry import InvalidPayloadError
from jobcore.kernel.errors import (
    BatchClosed,
    BatchIdTaken,
    BatchJobKeyTaken,
    BatchNotFound,
    DatabaseUnavailable,
    EnqueueRateExceeded,
    IdempotencyConflict,
    IllegalTransition,
    InvalidField,
    InvalidIdempotencyKey,
    InvalidPayload,
    InvalidWorkflow,
    JobcoreError,
    JobNotCancellable,
    JobNotEditable,
    JobNotFound,
    JobNotRetryable,
    JobVersionMismatch,
    JobVersionRequired,
    OutboxRowJobEnded,
    OutboxRowNotFound,
    OutboxRowNotQuarantined,
    QuotaExceeded,
    ResultNotReady,
    ServiceStateError,
    StoreRefused,
    TooManyLongPolls,
    TooManyUnfinishedJobs,
    UniqueJobExists,
    UnknownJobType,
    WorkflowNotFound,
    WorkflowStepNotFound,
)
from jobcore.storage.results import ResultNotFound, StoreUnavailable
from services.api.paths import allowed_methods

log = logging.getLogger(__name__)

PROBLEM_BASE = "https://jobcore.dev/problems/"
PROBLEM_MEDIA_TYPE = "application/problem+json"
# How long a client should wait before retrying while the database is unreachable.
RETRY_AFTER_SECONDS = 2
# The status a request gets when its client left before it could be answered: nobody
# receives it (the server drops what is sent after a disconnect), but the request's span
# records it. nginx's "client closed request", outside the range of errors of the API.
CLIENT_CLOSED_REQUEST = 499


# --- The API's own errors: bad input and states a request cannot be served in ---------


class MalformedJson(JobcoreError):
    """The request body is not valid JSON (UTF-8)."""


class UnsupportedMediaType(JobcoreError):
    """The request body must be JSON (Content-Type: application/json)."""


class BodyTooLarge(JobcoreError):
    """The request body is larger than allowed."""


class InvalidCursor(JobcoreError):
    """The cursor is not one this API handed out."""


class InvalidRequest(JobcoreError):
    """The request's parameters are invalid."""

    def __init__(self, errors: list[dict[str, Any]], message: str | None = None) -> None:
        self.errors = errors
        super().__init__(message)


class InvalidPayloadField(InvalidPayload):
    """The payload is invalid."""

    def __init__(self, errors: list[dict[str, Any]], message: str | None = None) -> None:
        self.errors = errors
        super().__init__(message)


def located(exc: InvalidField, where: list[str | int] | None) -> JobcoreError:
    """The API's error for a request field the library refused, located at ``where``
    (where this request carries the field: ``["query", "run_at"]``, ``["body"]``, a batch
    item's) and the field's own path (a payload field's name). ``where`` None: the field
    is a header, which the problem's type names (``exc`` itself, no ``errors``)."""
    if where is None:
        return exc
    errors = [{"loc": [*where, *exc.path], "msg": exc.reason, "type": exc.kind}]
    if isinstance(exc, InvalidPayload):
        return InvalidPayloadField(errors, exc.reason)
    return InvalidRequest(errors)


def payload_located(
    exc: InvalidPayloadError | UnstorablePayload, where: list[str | int]
) -> InvalidPayloadField:
    """The errors of a payload the job type refused, located at ``where`` (where this
    request carries the payload: a workflow's job) rather than as the body's own."""
    errors = []
    for error in exc.errors:
        loc = list(error["loc"])
        if isinstance(exc, UnstorablePayload) and loc[:1] == ["body"]:
            loc = loc[1:]
        errors.append({**error, "loc": [*where, *loc]})
    return InvalidPayloadField(errors, str(exc))


# --- The mapping ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProblemType:
    status: int
    slug: str
    title: str

    @property
    def uri(self) -> str:
        return PROBLEM_BASE + self.slug


INTERNAL = ProblemType(500, "internal-error", "Internal error")
UNAVAILABLE = ProblemType(503, "database-unavailable", "Database unavailable")

# Looked up along the exception's class hierarchy: the most specific entry wins.
PROBLEM_TYPES: dict[type[JobcoreError], ProblemType] = {
    MalformedJson: ProblemType(400, "malformed-json", "Malformed JSON"),
    InvalidIdempotencyKey: ProblemType(400, "invalid-idempotency-key", "Invalid Idempotency-Key"),
    InvalidCursor: ProblemType(400, "invalid-cursor", "Invalid cursor"),
    MissingApiKey: ProblemType(401, "missing-api-key", "API key required"),
    InvalidApiKey: ProblemType(401, "invalid-api-key", "Invalid API key"),
    MissingScope: ProblemType(403, "insufficient-scope", "Insufficient scope"),
    UnknownJobType: ProblemType(404, "unknown-job-type", "Unknown job type"),
    JobNotFound: ProblemType(404, "job-not-found", "Job not found"),
    BatchNotFound: ProblemType(404, "batch-not-found", "Batch not found"),
    BatchClosed: ProblemType(409, "batch-closed", "Batch closed"),
    BatchIdTaken: ProblemType(409, "batch-id-taken", "Batch id taken"),
    BatchJobKeyTaken: ProblemType(
        409, "batch-job-key-taken", "The idempotency key's job is not in this batch"
    ),
    WorkflowNotFound: ProblemType(404, "workflow-not-found", "Workflow not found"),
    WorkflowStepNotFound: ProblemType(404, "workflow-job-not-found", "Workflow job not found"),
    ResultNotFound: ProblemType(404, "result-not-found", "Result not found"),
    OutboxRowNotFound: ProblemType(404, "outbox-row-not-found", "Outbox row not found"),
    JobNotCancellable: ProblemType(409, "job-not-cancellable", "Job not cancellable"),
    JobNotEditable: ProblemType(409, "job-not-editable", "Job not editable"),
    JobVersionMismatch: ProblemType(412, "job-version-mismatch", "Job changed since read"),
    JobVersionRequired: ProblemType(428, "if-match-required", "If-Match required"),
    JobNotRetryable: ProblemType(409, "job-not-retryable", "Job not retryable"),
    UniqueJobExists: ProblemType(409, "unique-job-exists", "A live job holds the unique key"),
    OutboxRowNotQuarantined: ProblemType(
        409, "outbox-row-not-quarantined", "Outbox row not quarantined"
    ),
    OutboxRowJobEnded: ProblemType(409, "outbox-row-job-ended", "Outbox row's job has ended"),
    IllegalTransition: ProblemType(409, "illegal-transition", "Illegal status change"),
    ResultNotReady: ProblemType(409, "result-not-ready", "Result not ready"),
    BodyTooLarge: ProblemType(413, "body-too-large", "Request body too large"),
    UnsupportedMediaType: ProblemType(415, "unsupported-media-type", "Unsupported media type"),
    InvalidPayload: ProblemType(422, "invalid-payload", "Invalid payload"),
    InvalidRequest: ProblemType(422, "invalid-request", "Invalid request"),
    # A field not located by its route (located() does): named as the library names it.
    InvalidField: ProblemType(422, "invalid-request", "Invalid request"),
    InvalidWorkflow: ProblemType(422, "invalid-workflow", "Invalid workflow"),
    IdempotencyConflict: ProblemType(
        422, "idempotency-key-reused", "Idempotency key reused with a different request"
    ),
    EnqueueRateExceeded: ProblemType(429, "enqueue-rate-limited", "Enqueue rate limit reached"),
    TooManyUnfinishedJobs: ProblemType(429, "too-many-unfinished-jobs", "Too many unfinished jobs"),
    TooManyLongPolls: ProblemType(429, "too-many-long-polls", "Too many long-polls"),
    DatabaseUnavailable: UNAVAILABLE,
    StoreUnavailable: ProblemType(503, "store-unavailable", "Object store unavailable"),
    # Not a 503: retrying cannot help until an operator fixes the bucket or credentials.
    StoreRefused: ProblemType(502, "store-refused", "Object store refused the request"),
    # The pool is closed: the app is shutting down or never started.
    ServiceStateError: ProblemType(503, "unavailable", "Service unavailable"),
}

# Errors whose own message is not for clients (it names hosts, URLs, internals; or a
# field by the library's name where the API takes a header).
_GENERIC_DETAIL: dict[str, str] = {
    "invalid-idempotency-key": "An Idempotency-Key is 1 to 255 printable ASCII characters.",
    UNAVAILABLE.slug: "the database cannot be reached; retry later",
    "unavailable": "the service cannot take requests right now; retry later",
    "store-unavailable": "the object store cannot be reached; retry later",
    "store-refused": "the object store refused to store the payload; the operator must "
    "check the bucket, its policy and the credentials",
}

_HTTP_TYPES: dict[int, ProblemType] = {
    404: ProblemType(404, "not-found", "Not found"),
    405: ProblemType(405, "method-not-allowed", "Method not allowed"),
}


class ProblemResponse(Response):
    media_type = PROBLEM_MEDIA_TYPE

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def problem_type_for(exc: JobcoreError) -> ProblemType:
    for cls in type(exc).__mro__:
        found = PROBLEM_TYPES.get(cls)
        if found is not None:
            return found
    return INTERNAL


def problem(
    kind: ProblemType,
    detail: str,
    *,
    headers: dict[str, str] | None = None,
    **extensions: Any,
) -> ProblemResponse:
    body: dict[str, Any] = {
        "type": kind.uri,
        "title": kind.title,
        "status": kind.status,
        "detail": detail,
        **extensions,
    }
    return ProblemResponse(body, status_code=kind.status, headers=headers)


def _field_errors(errors: list[Any]) -> list[dict[str, Any]]:
    # Only location, message and type: the input itself may be large or sensitive.
    return [
        {
            "loc": [str(p) if not isinstance(p, int) else p for p in e["loc"]],
            "msg": e["msg"],
            "type": e["type"],
        }
        for e in errors
    ]


_last_unavailable_log = 0.0
UNAVAILABLE_LOG_INTERVAL = 10.0


def _log_unavailable(exc: JobcoreError) -> None:
    # During an outage every request fails the same way: say so now and then, not per request.
    global _last_unavailable_log
    now = time.monotonic()
    if now - _last_unavailable_log >= UNAVAILABLE_LOG_INTERVAL:
        _last_unavailable_log = now
        log.warning("answering 503: %s", exc)


def problem_document(exc: JobcoreError) -> dict[str, Any]:
    """The problem JSON of ``exc`` as a value (a batch item's ``problem``), with what its
    answer's headers would say about a quota as ``retry_after``."""
    kind, extensions, _ = _problem_parts(exc)
    if isinstance(exc, QuotaExceeded):
        extensions["retry_after"] = exc.retry_after
    return {
        "type": kind.uri,
        "title": kind.title,
        "status": kind.status,
        "detail": _GENERIC_DETAIL.get(kind.slug, str(exc)),
        **extensions,
    }


def jobcore_error_response(exc: JobcoreError) -> ProblemResponse:
    kind, extensions, headers = _problem_parts(exc)
    if kind.status == 503:
        _log_unavailable(exc)
    if kind is INTERNAL:
        log.error("unmapped jobcore error", exc_info=exc)
    return problem(kind, _GENERIC_DETAIL.get(kind.slug, str(exc)), headers=headers, **extensions)


def _problem_parts(exc: JobcoreError) -> tuple[ProblemType, dict[str, Any], dict[str, str]]:
    kind = problem_type_for(exc)
    extensions: dict[str, Any] = {}
    headers: dict[str, str] = {}
    if isinstance(
        exc, InvalidPayloadError | InvalidRequest | UnstorablePayload | InvalidPayloadField
    ):
        extensions["errors"] = _field_errors(exc.errors)
    elif isinstance(exc, InvalidField) and not isinstance(exc, InvalidIdempotencyKey):
        loc = [exc.field, *exc.path]
        extensions["errors"] = _field_errors([{"loc": loc, "msg": exc.reason, "type": exc.kind}])
    if isinstance(exc, JobNotCancellable | ResultNotReady | JobNotEditable):
        extensions["job_status"] = exc.job_status
    if isinstance(exc, UniqueJobExists):
        extensions["job_id"] = str(exc.job_id)
        extensions["job_status"] = exc.job_status
    if kind.status == 401:
        challenge = 'Bearer realm="jobcore"'
        if isinstance(exc, InvalidApiKey):
            challenge += ', error="invalid_token"'
        headers["WWW-Authenticate"] = challenge
    if isinstance(exc, QuotaExceeded):
        headers.update(exc.headers)
        headers["Retry-After"] = str(exc.retry_after)
        if exc.limit is not None:
            extensions["limit"] = exc.limit
    if isinstance(exc, MissingScope):
        # RFC 6750 section 3.1: the scope the request needs, for clients and for people.
        extensions["required_scope"] = exc.scope.value
        headers["WWW-Authenticate"] = (
            f'Bearer realm="jobcore", error="insufficient_scope", scope="{exc.scope.value}"'
        )
    if kind.status == 503:
        headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return kind, extensions, headers


def _counted(request: Request, response: ProblemResponse) -> ProblemResponse:
    state = getattr(request.app.state, "api", None)
    if state is not None:
        route = request.scope.get("route")
        state.metrics.count_error(getattr(route, "name", None), response.status_code)
    return response


async def _on_jobcore_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, JobcoreError)
    state = getattr(request.app.state, "api", None)
    if isinstance(exc, QuotaExceeded) and state is not None:
        state.metrics.count_refusal(exc.reason)
    return _counted(request, jobcore_error_response(exc))


async def _on_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = _field_errors(list(exc.errors()))
    invalid = InvalidRequest(errors, f"the request is invalid ({len(errors)} errors)")
    return _counted(request, jobcore_error_response(invalid))


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    kind = _HTTP_TYPES.get(exc.status_code) or ProblemType(
        exc.status_code, f"http-{exc.status_code}", str(exc.detail)
    )
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request))
    return _counted(request, problem(kind, str(exc.detail), headers=headers))


async def _on_client_disconnect(request: Request, exc: Exception) -> Response:
    """The client closed its connection before its body arrived (a load generator
    stopping, a client's timeout): not a failure of the API, so one line and a count, not
    an error with a traceback, and no answer (there is no one to read it)."""
    assert isinstance(exc, ClientDisconnect)
    route = request.scope.get("route")
    state = getattr(request.app.state, "api", None)
    if state is not None:
        state.metrics.client_disconnects.inc()
    log.info(
        "client disconnected before its request body arrived",
        extra={"method": request.method, "route": getattr(route, "name", None)},
    )
    return Response(status_code=CLIENT_CLOSED_REQUEST)


async def _on_unexpected_error(request: Request, exc: Exception) -> Response:
    # Starlette logs the exception and re-raises it after this answer is sent.
    return _counted(request, problem(INTERNAL, "the server failed to handle this request"))


_RETRY_AFTER = {
    "description": "Seconds to wait before trying again.",
    "required": True,
    "schema": {"type": "integer", "minimum": 0},
}
_CHALLENGE = {
    "description": "The Bearer challenge (RFC 6750), naming the error and the scope.",
    "required": True,
    "schema": {"type": "string"},
}
# The headers the error answers carry, by status.
ERROR_HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": _CHALLENGE},
    403: {"WWW-Authenticate": _CHALLENGE},
    405: {
        "Allow": {
            "description": "The methods the path takes.",
            "required": True,
            "schema": {"type": "string"},
        }
    },
    429: {"Retry-After": _RETRY_AFTER},
    503: {"Retry-After": _RETRY_AFTER},
}


def document_problem_responses(schema: dict[str, Any]) -> None:
    """Make every error response in an OpenAPI document problem JSON (FastAPI documents
    them as application/json, and its own 422 with a shape this API never sends), with
    the headers it carries."""
    problem_ref = {"$ref": "#/components/schemas/Problem"}
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for status, response in operation.get("responses", {}).items():
                if status.isdigit() and int(status) >= 400:
                    response["content"] = {PROBLEM_MEDIA_TYPE: {"schema": problem_ref}}
                    headers = {**ERROR_HEADERS.get(int(status), {}), **response.get("headers", {})}
                    if headers:
                        response["headers"] = headers
    components = schema.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)


def install(app: FastAPI) -> None:
    app.add_exception_handler(JobcoreError, _on_jobcore_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_error)
    app.add_exception_handler(ClientDisconnect, _on_client_disconnect)
    app.add_exception_handler(Exception, _on_unexpected_error)
