"""What the client raises: the API's problem JSON (RFC 9457) as an exception per status,
a connection that kept failing, a wait that ran out, a webhook that does not verify.

Every class derives from :class:`jobcore.kernel.errors.JobcoreError`, the library's one base.
"""

from __future__ import annotations

import contextlib
import email.utils
import time
from typing import Any

import httpx
import orjson

from jobcore.kernel.errors import JobcoreError

PROBLEM_BASE = "https://jobcore.dev/problems/"
_STANDARD_MEMBERS = frozenset({"type", "title", "status", "detail", "instance"})
# A body that is not problem JSON (a proxy's HTML page, say) shows this much as the detail.
_MAX_FOREIGN_DETAIL = 200


class ApiError(JobcoreError):
    """The API refused the request."""

    def __init__(
        self,
        *,
        type: str,
        title: str,
        status: int,
        detail: str,
        instance: str | None = None,
        extensions: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.type = type
        self.title = title
        self.status = status
        self.detail = detail
        self.instance = instance
        # The members other than the five standard ones: errors, job_status, limit, ...
        self.extensions = extensions or {}
        # Seconds the API asked the caller to wait (the Retry-After header), if it did.
        self.retry_after = retry_after
        super().__init__(f"{status} {title}: {detail}")

    @property
    def slug(self) -> str | None:
        """The problem type's name (``job-not-found``) when it is one of jobcore's."""
        return self.type.removeprefix(PROBLEM_BASE) if self.type.startswith(PROBLEM_BASE) else None

    @property
    def problem(self) -> dict[str, Any]:
        """The problem document as the API sent it (or as the client made it up)."""
        body: dict[str, Any] = {
            "type": self.type,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if self.instance is not None:
            body["instance"] = self.instance
        return {**body, **self.extensions}


class ClientError(ApiError):
    """The request was refused as it was sent (4xx)."""


class BadRequest(ClientError):
    """400: malformed JSON, a bad Idempotency-Key, cursor or wait."""


class Unauthorized(ClientError):
    """401: no API key, or one that is unknown, revoked or expired."""


class Forbidden(ClientError):
    """403: the API key lacks the route's scope (``extensions["required_scope"]``)."""


class NotFound(ClientError):
    """404: no such job (or another tenant's), job type or result."""


class Conflict(ClientError):
    """409: the job is not in a state for that (``extensions["job_status"]``)."""


class PreconditionFailed(ClientError):
    """412: the job changed since the version an edit names was read: read it again."""


class PreconditionRequired(ClientError):
    """428: an edit must name the version of the job it was decided on."""


class ContentTooLarge(ClientError):
    """413: the payload is larger than the API takes."""


class UnsupportedMediaType(ClientError):
    """415: the body must be JSON."""


class UnprocessableContent(ClientError):
    """422: an invalid payload or parameter (``extensions["errors"]``), or an idempotency
    key reused with a different request."""


class TooManyRequests(ClientError):
    """429: a quota (enqueue rate, unfinished jobs, long-polls); see ``retry_after``."""


class ServerError(ApiError):
    """The API failed to serve the request (5xx)."""


class ServiceUnavailable(ServerError):
    """503: the API cannot reach its database; see ``retry_after``."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    412: PreconditionFailed,
    413: ContentTooLarge,
    415: UnsupportedMediaType,
    422: UnprocessableContent,
    428: PreconditionRequired,
    429: TooManyRequests,
    503: ServiceUnavailable,
}


class ConnectionFailed(JobcoreError):
    """The API could not be reached (its cause is the transport error)."""


class WaitTimeout(JobcoreError, TimeoutError):
    """The job did not finish within the wait; ``job`` is how it was last seen."""

    def __init__(self, job: Any, message: str | None = None) -> None:
        self.job = job
        super().__init__(message)


class WebhookVerificationFailed(JobcoreError):
    """The webhook's signature or timestamp does not verify: do not trust its body."""


def error_class(status: int) -> type[ApiError]:
    found = _BY_STATUS.get(status)
    if found is not None:
        return found
    if 400 <= status < 500:
        return ClientError
    if status >= 500:
        return ServerError
    return ApiError


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """The Retry-After header in seconds: delay-seconds or an HTTP date; None if absent or
    unreadable."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT (RFC 9110 section 5.6.7)
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def api_error(response: httpx.Response) -> ApiError:
    """The exception for an answer of 400 or more, from its problem JSON when it has one."""
    status = response.status_code
    retry_after = retry_after_seconds(response.headers.get("retry-after"))
    body: Any = None
    with contextlib.suppress(orjson.JSONDecodeError):
        body = orjson.loads(response.content)
    cls = error_class(status)
    if isinstance(body, dict) and isinstance(body.get("type"), str):
        extensions = {k: v for k, v in body.items() if k not in _STANDARD_MEMBERS}
        instance = body.get("instance")
        return cls(
            type=body["type"],
            title=str(body.get("title") or response.reason_phrase),
            status=status,
            detail=str(body.get("detail") or ""),
            instance=instance if isinstance(instance, str) else None,
            extensions=extensions,
            retry_after=retry_after,
        )
    # Not from jobcore (a load balancer's page): RFC 9457's "about:blank" with the status.
    return cls(
        type="about:blank",
        title=response.reason_phrase or f"HTTP {status}",
        status=status,
        detail=response.text[:_MAX_FOREIGN_DETAIL],
        retry_after=retry_after,
    )
