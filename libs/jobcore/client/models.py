"""The API's answers as the client reads them: the shapes of the API's response schemas
(``/openapi.json``), kept here so the client needs nothing of the server. Members the API
adds later are ignored, so an older client keeps working against a newer API."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from jobcore.kernel.states import JobStatus, is_terminal

__all__ = [
    "Accepted",
    "Batch",
    "BatchCallbackState",
    "BatchCreated",
    "BatchJobsAdded",
    "CancelAnswer",
    "Job",
    "JobLinks",
    "JobPage",
    "JobResult",
    "JobStatus",
    "JobSummary",
    "PageLinks",
    "Workflow",
    "WorkflowCancelAnswer",
    "WorkflowCreated",
    "WorkflowEdge",
    "WorkflowJob",
    "WorkflowRetryAnswer",
]


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


class JobLinks(_Answer):
    self_: str = Field(alias="self")
    result: str
    cancel: str
    # The payload, also one stored by reference (servers before it: absent).
    payload: str | None = None


class Accepted(_Answer):
    """``202`` to an enqueue: the job and its message are stored."""

    job_id: uuid.UUID
    status: JobStatus
    links: JobLinks
    # The open job of the type's debounce or throttle key answered (``job_id`` is that job;
    # nothing new was written). Servers before it: absent, False.
    joined: bool = False
    # Not in the body: the key the client sent, and whether the API answered with the job
    # an earlier request with that key made (``Idempotent-Replayed: true``).
    idempotency_key: str
    replayed: bool = False


class JobSummary(_Answer):
    id: uuid.UUID
    type: str
    status: JobStatus
    entity_id: str | None
    attempts: int
    max_attempts: int
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested_at: datetime | None
    links: JobLinks

    @property
    def is_terminal(self) -> bool:
        """Succeeded, failed or cancelled: it will not change any more."""
        return is_terminal(self.status)


class Job(JobSummary):
    """``GET /jobs/{id}``: the job with its payload and inline result."""

    idempotency_key: str | None
    # None when the payload was too large to keep in the job (JOBCORE_INLINE_PAYLOAD_MAX_BYTES)
    # and is stored by reference (``payload_ref``): :meth:`Client.payload` reads it.
    payload: dict[str, Any] | None
    payload_ref: str | None = None
    # When the job may run first (scheduled) or next (a retry).
    run_at: datetime | None
    # The inline result; null while there is none or when it is in the result store.
    result: Any = None
    # Set when the result is in the result store: :meth:`Client.result` fetches it.
    result_ref: str | None
    # high, normal or low (servers before priorities: absent, read as normal).
    priority: str = "normal"
    # "queue paused" or "job type paused" while an operator holds the pending job back.
    waiting_for: str | None = None
    # Where the job is now and what it waits for, in words (servers before job timelines
    # do not say).
    where: str | None = None
    # The version read (its ETag): :meth:`Client.edit` changes the job only if it is still
    # this version (servers before edits do not say).
    version: str | None = None
    # Its debounce or throttle key, and how many enqueues a debounced job coalesced.
    debounce_key: str | None = None
    debounce_count: int | None = None


class PageLinks(_Answer):
    next: str | None


class JobPage(_Answer):
    """One page of ``GET /jobs``, newest first; ``next_cursor`` is null on the last."""

    items: list[JobSummary]
    next_cursor: str | None
    links: PageLinks


class CancelAnswer(_Answer):
    """``cancelled`` when the job was pending; ``running`` with ``cancel_requested`` while
    its worker stops it (it then ends ``cancelled``)."""

    job_id: uuid.UUID
    status: JobStatus
    cancel_requested: bool
    cancel_requested_at: datetime | None
    links: JobLinks


class BatchItemOutcome(_Answer):
    """One item of a batch, at ``index`` in the request: ``created``, ``replayed`` (its
    idempotency key's job), ``joined`` (the open job of its debounce or throttle key,
    ``joined`` true), ``unique_conflict`` (``job_id``: the live job holding its
    unique key), ``refused`` by a quota, or ``invalid`` (its idempotency key was used
    for another request); ``problem`` is the problem JSON saying why, if any."""

    index: int
    status: str
    job_id: uuid.UUID | None
    job_status: JobStatus | None
    problem: dict[str, Any] | None
    joined: bool = False
    # The idempotency key the client sent for this item (its own, or a new UUID).
    idempotency_key: str


class BatchCounts(_Answer):
    created: int
    replayed: int
    joined: int = 0
    unique_conflict: int
    refused: int
    invalid: int


class BatchAnswer(_Answer):
    """``POST /jobs/{type}/batch``: every item's outcome, in the request's order."""

    items: list[BatchItemOutcome]
    counts: BatchCounts


class BatchCallbackState(_Answer):
    """A callback of a batch: its job type, and the job it fired (None until it fires)."""

    type: str
    job_id: uuid.UUID | None


class Batch(_Answer):
    """``GET /batches/{id}``: ``status`` is ``open``, ``closed`` (a member has not
    settled), ``succeeded``, ``settled`` (not all succeeded) or ``cancelled``; the counts
    are of its own members (a child batch counts as one)."""

    id: uuid.UUID
    parent_id: uuid.UUID | None
    description: str | None
    status: str
    total: int
    pending: int
    succeeded: int
    failed: int
    cancelled: int
    failed_job_ids: list[uuid.UUID]
    first_death_job_id: uuid.UUID | None
    # By name: on_success, on_complete, on_death.
    callbacks: dict[str, BatchCallbackState]
    created_at: datetime
    closed_at: datetime | None
    settled_at: datetime | None
    cancelled_at: datetime | None


class BatchCreated(Batch):
    """``POST /batches``: the batch and its jobs' ids in the order given; ``replayed``: a
    repeated request answered from the batch the first one made."""

    job_ids: list[uuid.UUID]
    replayed: bool = False


class BatchJobsAdded(_Answer):
    batch_id: uuid.UUID
    job_ids: list[uuid.UUID]
    closed: bool


@dataclass(frozen=True, slots=True)
class JobResult:
    """``GET /jobs/{id}/result``: an inline result as JSON, or the stored file's bytes."""

    content: bytes
    media_type: str

    @property
    def is_json(self) -> bool:
        return self.media_type == "application/json"

    def json(self) -> Any:
        return orjson.loads(self.content)

    def text(self, encoding: str = "utf-8") -> str:
        return self.content.decode(encoding)


class WorkflowCreated(_Answer):
    """``POST /workflows``: the workflow's id and each job's id by name."""

    id: uuid.UUID
    status: str
    created_at: datetime
    jobs: dict[str, uuid.UUID]
    # Not in the body: the key the client sent, and whether the API answered with the
    # workflow an earlier request with that key made (``Idempotent-Replayed: true``).
    idempotency_key: str | None = None
    replayed: bool = False


class WorkflowEdge(_Answer):
    name: str
    job_id: uuid.UUID
    policy: str
    state: str


class WorkflowJob(_Answer):
    id: uuid.UUID
    name: str
    type: str
    status: JobStatus
    waiting_for_dependencies: bool
    is_finally: bool
    attempts: int
    max_attempts: int
    last_error: str | None = None
    blocked_by: uuid.UUID | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    depends_on: list[WorkflowEdge]


class Workflow(_Answer):
    """``GET /workflows/{id}``: its status (running, succeeded, failed, cancelled) and
    each job's."""

    id: uuid.UUID
    name: str | None = None
    status: str
    jobs_total: int
    open_jobs: int
    failed_jobs: int
    counts: dict[str, int]
    cancel_requested_at: datetime | None = None
    created_at: datetime
    finished_at: datetime | None = None
    jobs: list[WorkflowJob]

    @property
    def is_finished(self) -> bool:
        return self.status != "running"

    def job(self, name: str) -> WorkflowJob:
        return next(job for job in self.jobs if job.name == name)


class WorkflowCancelAnswer(_Answer):
    id: uuid.UUID
    cancelled: int
    asked_to_stop: int


class WorkflowRetryAnswer(_Answer):
    workflow_id: uuid.UUID
    name: str
    job_id: uuid.UUID
    status: str
