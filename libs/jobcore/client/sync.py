"""The blocking client: :class:`Client`, with the calls of
:class:`~jobcore.client.AsyncClient`.

Generated from :mod:`jobcore.client.aio` by ``scripts/unasync_client.py``: do not edit."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import IO, Any, TypeVar

import httpx
from pydantic import BaseModel

from jobcore.client.core import (
    DEFAULT_POLL_SECONDS,
    SAVE_CHUNK_BYTES,
    Call,
    Core,
    Flow,
    JobFilter,
    Outcome,
    Sleep,
    build_request,
    media_type,
)
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
    JobSummary,
    Workflow,
    WorkflowCancelAnswer,
    WorkflowCreated,
    WorkflowRetryAnswer,
)
from jobcore.client.primitives import sleep, write
from jobcore.client.retries import RetryPolicy

T = TypeVar("T")


class ResultStream:
    """A result being downloaded (the client's ``stream_result``): its media type, its size
    when the server said it, and its bytes, read as they arrive."""

    def __init__(self, response: httpx.Response, media_type: str) -> None:
        self._response = response
        self.media_type = media_type

    @property
    def content_length(self) -> int | None:
        length = self._response.headers.get("content-length")
        return int(length) if length is not None and length.isdigit() else None

    def iter_bytes(self, chunk_size: int | None = None) -> Iterator[bytes]:
        """The bytes in chunks of ``chunk_size`` (None: as they arrive)."""
        return self._response.iter_bytes(chunk_size)


class Client:
    """The jobcore HTTP API. Every call retries ``503``, ``429`` and connection
    errors within ``retry``; an enqueue's retries carry its Idempotency-Key, so each call
    makes exactly one job. An ``http`` client passed in is used as it is (its base URL and
    headers aside) and never closed here."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = 10.0,
        retry: RetryPolicy | None = None,
        http: httpx.Client | None = None,
    ) -> None:
        self._core = Core(base_url, api_key, timeout=timeout, retry=retry or RetryPolicy())
        self._owns_http = http is None
        self._http = http if http is not None else httpx.Client(timeout=timeout)

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _send(self, call: Call) -> Outcome:
        request = build_request(self._http, call)
        try:
            response = self._http.send(request, stream=call.stream)
            if call.stream and not response.is_success:
                try:
                    response.read()  # an error's problem JSON, or a redirect's
                finally:
                    response.close()
        except httpx.TransportError as exc:
            return exc
        return response

    def _run(self, flow: Flow[T]) -> T:
        outcome: Outcome | None = None
        try:
            while True:
                step = flow.send(outcome)
                if isinstance(step, Sleep):
                    sleep(step.seconds)  # the backoff before a retry
                    outcome = None
                else:
                    outcome = self._send(step)
        except StopIteration as done:
            result: T = done.value
            return result

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
    ) -> Accepted:
        """``POST /jobs/{job_type}``, with ``idempotency_key`` (a new UUID unless given);
        ``priority``: ``"high"``, ``"normal"`` or ``"low"`` (default: the job type's).
        For a type that debounces or throttles by key, ``joined`` says whether the key's
        open job answered (``job_id`` is then that job's)."""
        return self._run(
            self._core.enqueue(
                job_type,
                payload,
                idempotency_key=idempotency_key,
                entity_id=entity_id,
                max_attempts=max_attempts,
                run_at=run_at,
                delay=delay,
                callback_url=callback_url,
                priority=priority,
            )
        )

    def enqueue_batch(
        self,
        job_type: str,
        items: Sequence[Mapping[str, Any]],
        *,
        callback_url: str | None = None,
    ) -> BatchAnswer:
        """``POST /jobs/{job_type}/batch``: up to 1,000 items (``{"payload": ...}`` with
        optional ``idempotency_key``, ``unique_key``, ``entity_id``, ``max_attempts``,
        ``run_at`` or ``delay``), written in one transaction. Each item without an
        idempotency key gets a new UUID, so the retries (503, 429, connection errors) of a
        batch never make a job twice; each outcome carries its item's key."""
        return self._run(self._core.enqueue_batch(job_type, items, callback_url=callback_url))

    def create_batch(
        self,
        jobs: Sequence[Mapping[str, Any]] = (),
        *,
        on_success: Mapping[str, Any] | None = None,
        on_complete: Mapping[str, Any] | None = None,
        on_death: Mapping[str, Any] | None = None,
        open: bool = False,
        parent_id: uuid.UUID | str | None = None,
        description: str | None = None,
        batch_id: uuid.UUID | str | None = None,
    ) -> BatchCreated:
        """``POST /batches``: up to 1,000 jobs (``{"type": ..., "payload": ...}`` with the
        optional fields of :meth:`enqueue_batch`'s items) and callbacks
        (``{"type": ..., "payload": ...}``), each fired once as a job whose payload gets
        the batch's outcome under ``batch``. ``open``: jobs may be added
        (:meth:`add_to_batch`) until :meth:`close_batch`; else it is closed now. The batch's
        id (``batch_id``, a new UUID unless given) and each job's idempotency key make
        the retries of this call safe."""
        given = {"on_success": on_success, "on_complete": on_complete, "on_death": on_death}
        callbacks = {name: spec for name, spec in given.items() if spec is not None}
        return self._run(
            self._core.create_batch(
                jobs,
                callbacks=callbacks,
                open=open,
                parent_id=parent_id,
                description=description,
                batch_id=batch_id,
            )
        )

    def add_to_batch(
        self,
        batch_id: uuid.UUID | str,
        jobs: Sequence[Mapping[str, Any]],
        *,
        close: bool = False,
    ) -> BatchJobsAdded:
        """``POST /batches/{id}/jobs``: add jobs to an open batch (all or none), closing it
        after them if ``close``; :class:`~jobcore.client.Conflict` once it is closed."""
        return self._run(self._core.add_to_batch(batch_id, jobs, close=close))

    def close_batch(self, batch_id: uuid.UUID | str) -> Batch:
        """``POST /batches/{id}/close``: no job joins it any more; its callbacks may fire."""
        return self._run(self._core.batch_action("POST", f"/batches/{batch_id}/close"))

    def get_batch(self, batch_id: uuid.UUID | str) -> Batch:
        """``GET /batches/{id}``: its counts, failed jobs and callbacks fired."""
        return self._run(self._core.batch_action("GET", f"/batches/{batch_id}"))

    def cancel_batch(self, batch_id: uuid.UUID | str) -> Batch:
        """``POST /batches/{id}/cancel``: close it and its child batches, cancel their
        pending jobs, ask the workers of their running ones to stop."""
        return self._run(self._core.batch_action("POST", f"/batches/{batch_id}/cancel"))

    def list_batches(self, *, limit: int | None = None) -> list[Batch]:
        """``GET /batches``: the newest batches, newest first."""
        return self._run(self._core.list_batches(limit=limit))

    def get(self, job_id: uuid.UUID | str) -> Job:
        """``GET /jobs/{id}``: the job as it is now."""
        return self._run(self._core.get(job_id))

    def wait(
        self,
        job_id: uuid.UUID | str,
        *,
        timeout: float | None = None,
        poll: float = DEFAULT_POLL_SECONDS,
    ) -> Job:
        """The job once it succeeded, failed or was cancelled, by long-polls of ``poll``
        seconds; :class:`~jobcore.client.WaitTimeout` after ``timeout`` seconds."""
        return self._run(self._core.wait(job_id, timeout=timeout, poll=poll))

    def result(self, job_id: uuid.UUID | str) -> JobResult:
        """``GET /jobs/{id}/result``, in memory; :class:`~jobcore.client.Conflict` until it
        succeeded. A result in an object store (the API answers ``302``) is fetched from
        it, without the API key (a presigned URL needs none)."""
        return self._run(self._core.result(job_id))

    @contextlib.contextmanager
    def stream_result(self, job_id: uuid.UUID | str) -> Iterator[ResultStream]:
        """The result as :meth:`result` gets it, read as it arrives rather than held whole:
        a context manager around the download, whose stream gives the bytes in chunks."""
        response, url = self._run(self._core.download(f"/jobs/{job_id}/result", stream=True))
        try:
            yield ResultStream(response, media_type(response, url))
        finally:
            response.close()

    def save_result(
        self, job_id: uuid.UUID | str, destination: str | os.PathLike[str] | IO[bytes]
    ) -> int:
        """Write the result to a file (a path, or a binary file open for writing) as it
        arrives; the number of bytes written."""
        with self.stream_result(job_id) as stream:
            chunks = stream.iter_bytes(SAVE_CHUNK_BYTES)
            if isinstance(destination, str | os.PathLike):
                with open(destination, "wb") as target:  # noqa: ASYNC230 - writes go to a thread
                    return _copy(chunks, target)
            return _copy(chunks, destination)

    def payload(self, job_id: uuid.UUID | str) -> Any:
        """The job's payload as JSON (``GET /jobs/{id}/payload``), also one too large to be
        kept in the job (:attr:`Job.payload` is None then, ``payload_ref`` set)."""
        return self._run(self._core.payload(job_id))

    def edit(
        self,
        job_id: uuid.UUID | str,
        *,
        version: str,
        run_at: datetime | None = None,
        priority: str | None = None,
        payload: Mapping[str, Any] | BaseModel | None = None,
    ) -> Job:
        """Change a pending job's ``run_at``, ``priority`` (``"high"``, ``"normal"``,
        ``"low"``) or ``payload`` in place, if it is still ``version`` (``Job.version``
        of :meth:`get`); the job after the edit, with its new version.
        :class:`~jobcore.client.PreconditionFailed` when it changed since,
        :class:`~jobcore.client.Conflict` when it was claimed or ended."""
        return self._run(
            self._core.edit(
                job_id, version=version, run_at=run_at, priority=priority, payload=payload
            )
        )

    def cancel(self, job_id: uuid.UUID | str) -> CancelAnswer:
        """``POST /jobs/{id}/cancel``; :class:`~jobcore.client.Conflict` once it ended."""
        return self._run(self._core.cancel(job_id))

    def create_workflow(
        self,
        jobs: Sequence[Mapping[str, Any]],
        *,
        name: str | None = None,
        idempotency_key: str | None = None,
    ) -> WorkflowCreated:
        """``POST /workflows``: named jobs (``name``, ``type``, ``payload``, ``depends_on``:
        names or ``{"name", "policy"}`` with policy ``on_success``, ``on_complete`` or
        ``on_failure``; ``finally``), written in one transaction. With
        ``idempotency_key`` (a new UUID unless given), so it is retried like an enqueue:
        a retry whose first request got through answers that workflow (``replayed``)."""
        return self._run(
            self._core.create_workflow(jobs, name=name, idempotency_key=idempotency_key)
        )

    def workflow(self, workflow_id: uuid.UUID | str) -> Workflow:
        """``GET /workflows/{id}``: its status and each job's."""
        return self._run(self._core.get_workflow(workflow_id))

    def cancel_workflow(self, workflow_id: uuid.UUID | str) -> WorkflowCancelAnswer:
        """``POST /workflows/{id}/cancel``: every job not ended is cancelled (a running one
        asked to stop)."""
        return self._run(self._core.cancel_workflow(workflow_id))

    def retry_workflow_job(
        self,
        workflow_id: uuid.UUID | str,
        name: str,
    ) -> WorkflowRetryAnswer:
        """``POST /workflows/{id}/jobs/{name}/retry``: a failed job runs again; the jobs it
        made unreachable then wait for it."""
        return self._run(self._core.retry_workflow_job(workflow_id, name))

    def page(
        self,
        *,
        status: JobStatus | str | None = None,
        type: str | None = None,
        entity_id: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> JobPage:
        """One page of ``GET /jobs`` (newest first)."""
        where = JobFilter(status, type, entity_id)
        return self._run(self._core.page(where, limit=limit, cursor=cursor))

    def pages(
        self,
        *,
        status: JobStatus | str | None = None,
        type: str | None = None,
        entity_id: str | None = None,
        limit: int | None = None,
    ) -> Iterator[JobPage]:
        """Every page of ``GET /jobs``, following the cursor, one request per page."""
        where = JobFilter(status, type, entity_id)
        cursor: str | None = None
        while True:
            page = self._run(self._core.page(where, limit=limit, cursor=cursor))
            yield page
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def jobs(
        self,
        *,
        status: JobStatus | str | None = None,
        type: str | None = None,
        entity_id: str | None = None,
        limit: int | None = None,
    ) -> Iterator[JobSummary]:
        """Every job that :meth:`pages` lists, one at a time."""
        for page in self.pages(status=status, type=type, entity_id=entity_id, limit=limit):
            for job in page.items:
                yield job


def _copy(chunks: Iterator[bytes], target: IO[bytes]) -> int:
    written = 0
    for chunk in chunks:
        write(target, chunk)
        written += len(chunk)
    return written
