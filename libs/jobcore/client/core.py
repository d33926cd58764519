"""What :class:`~jobcore.client.Client` and :class:`~jobcore.client.AsyncClient` share:
every operation written once, without I/O ("sans-I/O").

An operation is a generator (a :data:`Flow`): it yields a :class:`Call` to be sent and
receives the answer (an ``httpx.Response``, or the ``httpx.TransportError`` sending it
raised), or yields a :class:`Sleep` before trying again, and returns its typed result. The
two clients only drive flows, one with blocking I/O and ``time.sleep``, the other with
``await``: building requests, retrying, reading answers and errors happen here.
"""

from __future__ import annotations

import logging
import mimetypes
import random
import time
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import httpx
import orjson
from pydantic import BaseModel

from jobcore import __version__
from jobcore.client.errors import ApiError, ConnectionFailed, WaitTimeout, api_error
from jobcore.client.models import (
    Accepted,
    Batch,
    BatchAnswer,
    BatchCreated,
    BatchJobsAdded,
    CancelAnswer,
    Job,
    JobPage,
    JobResult,
    JobStatus,
    Workflow,
    WorkflowCancelAnswer,
    WorkflowCreated,
    WorkflowRetryAnswer,
)
from jobcore.client.retries import RETRYABLE_STATUSES, Attempts, RetryPolicy, retryable_error

log = logging.getLogger("jobcore.client")

T = TypeVar("T")
USER_AGENT = f"jobcore-client/{__version__}"
# The API shortens longer long-polls to 60 s; proxies often drop requests idle far longer.
DEFAULT_POLL_SECONDS = 30.0
MAX_POLL_SECONDS = 60.0
# Bytes per chunk of a stored result written by save_result.
SAVE_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Call:
    """One HTTP request to make (again, if it is retried: the same key, body and query)."""

    method: str
    url: str
    headers: dict[str, str]
    params: dict[str, str] = field(default_factory=dict)
    content: bytes | None = None
    # Seconds for the whole request when it is not the client's default (a long-poll).
    timeout: float | None = None
    # The driver hands the flow a 2xx answer with its body unread (the caller streams it
    # and closes it); any other answer arrives read, as without.
    stream: bool = False

    @property
    def target(self) -> str:
        return f"{self.method} {httpx.URL(self.url).path}"


def build_request(http: httpx.Client | httpx.AsyncClient, call: Call) -> httpx.Request:
    return http.build_request(
        call.method,
        call.url,
        headers=call.headers,
        # None, not {}: httpx replaces the URL's own query with an empty one (a presigned
        # URL's signature is its query).
        params=call.params or None,
        content=call.content,
        timeout=httpx.USE_CLIENT_DEFAULT if call.timeout is None else call.timeout,
    )


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Outcome = httpx.Response | httpx.TransportError
Flow = Generator[Call | Sleep, Outcome | None, T]


@dataclass(frozen=True, slots=True)
class JobFilter:
    """What ``GET /jobs`` lists: every member optional."""

    status: JobStatus | str | None = None
    type: str | None = None
    entity_id: str | None = None

    def params(self) -> dict[str, str]:
        found = {"status": self.status, "type": self.type, "entity_id": self.entity_id}
        return {name: str(value) for name, value in found.items() if value is not None}


class Core:
    """Requests for one API, with one key and one retry policy."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        timeout: float,
        retry: RetryPolicy,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retry = retry
        self.clock = clock
        self.rng = rng
        self.headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if api_key is not None:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def call(self, method: str, path: str, **kwargs: Any) -> Call:
        extra = kwargs.pop("headers", {})
        return Call(method, self.base_url + path, {**self.headers, **extra}, **kwargs)

    # -- sending, with retries ------------------------------------------------------------

    def exchange(
        self, call: Call, *, redirect: bool = False, once: bool = False
    ) -> Flow[httpx.Response]:
        """Send ``call`` until it is answered 2xx (or, with ``redirect``, a redirect that
        names its ``Location``), retrying 503, 429 and connection errors within the retry
        policy; raise the last failure's error otherwise. ``once``: a request that must not
        be sent twice (it has no idempotency key) is retried after a connection error only
        when the connection was never made."""
        attempts = Attempts(self.retry, clock=self.clock, rng=self.rng)
        while True:
            outcome = yield call
            error: ApiError | ConnectionFailed
            if isinstance(outcome, httpx.Response):
                if outcome.is_success:
                    return outcome
                if redirect and outcome.is_redirect and "location" in outcome.headers:
                    return outcome
                error = api_error(outcome)
                delay = (
                    attempts.next_delay(error.retry_after)
                    if outcome.status_code in RETRYABLE_STATUSES
                    else None
                )
            elif isinstance(outcome, httpx.TransportError):
                error = ConnectionFailed(f"{call.target}: {type(outcome).__name__}: {outcome}")
                error.__cause__ = outcome
                unsent = isinstance(outcome, httpx.ConnectError)
                retry = retryable_error(outcome) and (unsent or not once)
                delay = attempts.next_delay() if retry else None
            else:  # pragma: no cover - a driver bug
                raise TypeError(f"a flow was sent {outcome!r}")
            if delay is None:
                raise error
            log.info(
                "retrying %s in %.2f s (attempt %d of %d): %s",
                call.target,
                delay,
                attempts.made,
                self.retry.max_attempts,
                error,
            )
            yield Sleep(delay)

    # -- the operations -------------------------------------------------------------------

    def enqueue(
        self,
        job_type: str,
        payload: Mapping[str, Any] | BaseModel,
        *,
        idempotency_key: str | None = None,
        entity_id: str | None = None,
        max_attempts: int | None = None,
        run_at: datetime | None = None,
        delay: float | None = None,
        callback_url: str | None = None,
        priority: str | None = None,
    ) -> Flow[Accepted]:
        key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
        body = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else dict(payload)
        params = {
            name: value
            for name, value in (
                ("entity_id", entity_id),
                ("max_attempts", None if max_attempts is None else str(max_attempts)),
                ("run_at", None if run_at is None else run_at.isoformat()),
                ("delay", None if delay is None else repr(float(delay))),
                ("callback_url", callback_url),
                ("priority", priority),
            )
            if value is not None
        }
        # Every retry is this very request: the same key, body and query, so the API
        # answers it with the job the first one made if that one got through.
        call = self.call(
            "POST",
            f"/jobs/{job_type}",
            headers={"Content-Type": "application/json", "Idempotency-Key": key},
            params=params,
            content=orjson.dumps(body),
        )
        response = yield from self.exchange(call)
        replayed = response.headers.get("idempotent-replayed") == "true"
        return Accepted.model_validate(
            {**orjson.loads(response.content), "idempotency_key": key, "replayed": replayed}
        )

    def enqueue_batch(
        self,
        job_type: str,
        items: Sequence[Mapping[str, Any]],
        *,
        callback_url: str | None = None,
    ) -> Flow[BatchAnswer]:
        # Every item gets an idempotency key (its own, or a new UUID), so a batch retried
        # after a lost answer is answered item by item as replays: no job twice.
        sent = [_batch_item(item) for item in items]
        params = {} if callback_url is None else {"callback_url": callback_url}
        call = self.call(
            "POST",
            f"/jobs/{job_type}/batch",
            headers={"Content-Type": "application/json"},
            params=params,
            content=orjson.dumps({"items": sent}),
        )
        response = yield from self.exchange(call)
        answer = orjson.loads(response.content)
        for outcome in answer["items"]:
            outcome["idempotency_key"] = sent[outcome["index"]]["idempotency_key"]
        return BatchAnswer.model_validate(answer)

    def get(self, job_id: uuid.UUID | str) -> Flow[Job]:
        response = yield from self.exchange(self.call("GET", f"/jobs/{job_id}"))
        return Job.model_validate_json(response.content)

    def wait(
        self,
        job_id: uuid.UUID | str,
        *,
        timeout: float | None,
        poll: float = DEFAULT_POLL_SECONDS,
    ) -> Flow[Job]:
        """Long-poll ``GET /jobs/{id}?wait=`` until the job is terminal; :class:`WaitTimeout`
        after ``timeout`` seconds (None: no limit)."""
        poll = min(max(poll, 0.0), MAX_POLL_SECONDS)
        deadline = None if timeout is None else self.clock() + timeout
        while True:
            seconds = poll if deadline is None else max(0.0, min(poll, deadline - self.clock()))
            call = self.call(
                "GET",
                f"/jobs/{job_id}",
                params={"wait": f"{seconds:.3f}"},
                timeout=seconds + self.timeout,
            )
            response = yield from self.exchange(call)
            job = Job.model_validate_json(response.content)
            if job.is_terminal:
                return job
            if deadline is not None and self.clock() >= deadline:
                raise WaitTimeout(job, f"job {job_id} is still {job.status} after {timeout} s")

    def download(
        self, path: str, *, stream: bool = False
    ) -> Flow[tuple[httpx.Response, httpx.URL]]:
        """``GET path``, following the API's redirect to the object store (a result or
        payload in a bucket is a ``302`` to a presigned URL): the answer with the bytes,
        and the URL that gave it.

        The store is sent the API key only when it is the API's own origin (scheme, host
        and port, as httpx and browsers decide): a presigned URL is its own credential, and
        a key sent to another host would leak to whoever runs it."""
        call = self.call("GET", path, stream=stream)
        response = yield from self.exchange(call, redirect=True)
        if response.is_success:
            return response, httpx.URL(call.url)
        location = httpx.URL(call.url).join(response.headers["location"])
        headers = {"User-Agent": USER_AGENT, "Accept": "*/*"}
        if _same_origin(location, httpx.URL(call.url)):
            headers = {**call.headers, "Accept": "*/*"}
        moved = Call("GET", str(location), headers, stream=stream)
        stored: httpx.Response = yield from self.exchange(moved)
        return stored, location

    def result(self, job_id: uuid.UUID | str) -> Flow[JobResult]:
        response, url = yield from self.download(f"/jobs/{job_id}/result")
        return JobResult(response.content, media_type(response, url))

    def payload(self, job_id: uuid.UUID | str) -> Flow[Any]:
        """The job's payload as JSON, also one stored by reference (``payload_ref``)."""
        response, _ = yield from self.download(f"/jobs/{job_id}/payload")
        return orjson.loads(response.content)

    def edit(
        self,
        job_id: uuid.UUID | str,
        *,
        version: str,
        run_at: datetime | None = None,
        priority: str | None = None,
        payload: Mapping[str, Any] | BaseModel | None = None,
    ) -> Flow[Job]:
        """``PATCH /jobs/{id}`` with ``If-Match`` naming ``version`` (a :class:`Job`'s):
        the job as it is after the edit. Not retried on a 412 or 409: the job changed."""
        body: dict[str, Any] = {}
        if run_at is not None:
            body["run_at"] = run_at.isoformat()
        if priority is not None:
            body["priority"] = priority
        if payload is not None:
            body["payload"] = (
                payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
            )
        call = self.call(
            "PATCH",
            f"/jobs/{job_id}",
            headers={"Content-Type": "application/json", "If-Match": f'"{version}"'},
            content=orjson.dumps(body),
        )
        response = yield from self.exchange(call)
        return Job.model_validate_json(response.content)

    def cancel(self, job_id: uuid.UUID | str) -> Flow[CancelAnswer]:
        response = yield from self.exchange(self.call("POST", f"/jobs/{job_id}/cancel"))
        return CancelAnswer.model_validate_json(response.content)

    def create_batch(
        self,
        jobs: Sequence[Mapping[str, Any]],
        *,
        callbacks: Mapping[str, Mapping[str, Any]],
        open: bool,
        parent_id: uuid.UUID | str | None,
        description: str | None,
        batch_id: uuid.UUID | str | None,
    ) -> Flow[BatchCreated]:
        # The batch's id and every job's idempotency key are chosen here, so a request
        # retried after a lost answer is answered from what the first one wrote.
        body: dict[str, Any] = {
            "id": str(batch_id or uuid.uuid4()),
            "jobs": [_batch_item(job) for job in jobs],
            "open": open,
        }
        for name, callback in callbacks.items():
            body[name] = _callback(callback)
        if parent_id is not None:
            body["parent_id"] = str(parent_id)
        if description is not None:
            body["description"] = description
        call = self.call(
            "POST",
            "/batches",
            headers={"Content-Type": "application/json"},
            content=orjson.dumps(body),
        )
        response = yield from self.exchange(call)
        answer = orjson.loads(response.content)
        answer["replayed"] = response.headers.get("idempotent-replayed") == "true"
        return BatchCreated.model_validate(answer)

    def add_to_batch(
        self, batch_id: uuid.UUID | str, jobs: Sequence[Mapping[str, Any]], *, close: bool
    ) -> Flow[BatchJobsAdded]:
        body = {"jobs": [_batch_item(job) for job in jobs], "close": close}
        call = self.call(
            "POST",
            f"/batches/{batch_id}/jobs",
            headers={"Content-Type": "application/json"},
            content=orjson.dumps(body),
        )
        response = yield from self.exchange(call)
        return BatchJobsAdded.model_validate_json(response.content)

    def batch_action(self, method: str, path: str) -> Flow[Batch]:
        """``GET /batches/{id}``, or its close or cancel (each safe to repeat)."""
        response = yield from self.exchange(self.call(method, path))
        return Batch.model_validate_json(response.content)

    def list_batches(self, *, limit: int | None) -> Flow[list[Batch]]:
        params = {} if limit is None else {"limit": str(limit)}
        response = yield from self.exchange(self.call("GET", "/batches", params=params))
        return [Batch.model_validate(item) for item in orjson.loads(response.content)["items"]]

    def create_workflow(
        self,
        jobs: Sequence[Mapping[str, Any]],
        *,
        name: str | None = None,
        idempotency_key: str | None = None,
    ) -> Flow[WorkflowCreated]:
        key = idempotency_key if idempotency_key is not None else str(uuid.uuid4())
        body: dict[str, Any] = {"jobs": [dict(job) for job in jobs]}
        if name is not None:
            body["name"] = name
        # Every retry is this very request, key and body: the API answers it with the
        # workflow the first one made if that one got through, so a lost answer is retried.
        call = self.call(
            "POST",
            "/workflows",
            headers={"Content-Type": "application/json", "Idempotency-Key": key},
            content=orjson.dumps(body),
        )
        response = yield from self.exchange(call)
        replayed = response.headers.get("idempotent-replayed") == "true"
        return WorkflowCreated.model_validate(
            {**orjson.loads(response.content), "idempotency_key": key, "replayed": replayed}
        )

    def get_workflow(self, workflow_id: uuid.UUID | str) -> Flow[Workflow]:
        response = yield from self.exchange(self.call("GET", f"/workflows/{workflow_id}"))
        return Workflow.model_validate_json(response.content)

    def cancel_workflow(self, workflow_id: uuid.UUID | str) -> Flow[WorkflowCancelAnswer]:
        call = self.call("POST", f"/workflows/{workflow_id}/cancel")
        response = yield from self.exchange(call)
        return WorkflowCancelAnswer.model_validate_json(response.content)

    def retry_workflow_job(
        self, workflow_id: uuid.UUID | str, name: str
    ) -> Flow[WorkflowRetryAnswer]:
        call = self.call("POST", f"/workflows/{workflow_id}/jobs/{name}/retry")
        response = yield from self.exchange(call)
        return WorkflowRetryAnswer.model_validate_json(response.content)

    def page(self, where: JobFilter, *, limit: int | None, cursor: str | None) -> Flow[JobPage]:
        params = where.params()
        if limit is not None:
            params["limit"] = str(limit)
        if cursor is not None:
            params["cursor"] = cursor
        response = yield from self.exchange(self.call("GET", "/jobs", params=params))
        return JobPage.model_validate_json(response.content)


def _same_origin(one: httpx.URL, other: httpx.URL) -> bool:
    return (one.scheme, one.host, one.port) == (other.scheme, other.host, other.port)


# What object stores call bytes of no declared type: the object's name says more.
_UNTYPED = frozenset({"application/octet-stream", "binary/octet-stream"})


def media_type(response: httpx.Response, url: httpx.URL) -> str:
    """The media type of ``response`` (from ``url``); for an object the store serves as
    untyped bytes (a result in a bucket), the type its name implies (``.csv``:
    ``text/csv``), as the API's own answer of a stored file says."""
    header: str = response.headers.get("content-type", "application/octet-stream")
    declared = header.split(";")[0].strip()
    if declared.lower() in _UNTYPED:
        guessed = mimetypes.guess_type(url.path)[0]
        return guessed or declared
    return declared


def _callback(callback: Mapping[str, Any]) -> dict[str, Any]:
    """A batch's callback as the API takes it: ``type`` and ``payload`` (a mapping or a
    pydantic model, without its ``batch`` field)."""
    payload = callback.get("payload", {})
    if isinstance(payload, BaseModel):
        payload = payload.model_dump(mode="json", exclude={"batch"})
    return {"type": callback["type"], "payload": payload}


def _batch_item(item: Mapping[str, Any]) -> dict[str, Any]:
    """An item as the API takes it: ``payload`` (a mapping or a pydantic model) and the
    optional ``idempotency_key``, ``unique_key``, ``entity_id``, ``max_attempts``,
    ``run_at`` (a datetime) or ``delay``."""
    sent = {name: value for name, value in item.items() if value is not None}
    payload = sent.get("payload")
    if isinstance(payload, BaseModel):
        sent["payload"] = payload.model_dump(mode="json")
    if isinstance(sent.get("run_at"), datetime):
        sent["run_at"] = sent["run_at"].isoformat()
    sent.setdefault("idempotency_key", str(uuid.uuid4()))
    return sent
