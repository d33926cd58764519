"""Response models: what /openapi.json promises. Routes build the same shapes as dicts
(serialised by orjson) on the hot paths; the tests validate answers against these."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from jobcore.kernel.scopes import Scope
from jobcore.kernel.states import JobStatus
from jobcore.usecases.enqueue.write_many import ItemStatus

# jobcore.kernel.priorities.Priority by name.
PriorityLabel = Literal["high", "normal", "low"]


class JobLinks(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    self_: str = Field(alias="self", examples=["/jobs/0b7c4f9e-8a51-4c1e-9d0c-6f1f3f7c2a10"])
    result: str
    cancel: str
    timeline: str
    # The payload, inline or stored by reference alike.
    payload: str


class Accepted(BaseModel):
    """The job is stored (with its outbox message); poll ``links.self`` for its status.

    ``joined``: true when the job type debounces or throttles by key and the key's open
    job answered the request: ``job_id`` is that job (a debounce's trailing job, which now
    also holds this payload and runs a period from now at the latest its max wait
    allows; a throttle's job of the period, this payload dropped) and nothing new was
    written. False: ``job_id`` is the job this request wrote (or, with
    ``Idempotent-Replayed``, the job its idempotency key wrote)."""

    job_id: uuid.UUID
    status: JobStatus
    joined: bool
    links: JobLinks


class JobSummary(BaseModel):
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


class JobProgress(BaseModel):
    """What the running handler last reported (``await ctx.progress(fraction, message)``),
    written at most every 250 ms; kept after the job ends."""

    fraction: float = Field(ge=0, le=1)
    message: str | None = Field(max_length=500)
    # The attempt that reported it: a retry's progress starts again from the new attempt's.
    attempt: int
    updated_at: datetime


class JobView(JobSummary):
    idempotency_key: str | None
    # Held while the job is pending or running (at most one such job per tenant, type and
    # key): the request's unique_key or the job type's unique payload field.
    unique_key: str | None = None
    # Null when the payload is larger than JOBCORE_INLINE_PAYLOAD_MAX_BYTES and stored by
    # reference (``payload_ref``): read it from ``links.payload``. Never an empty stand-in.
    payload: dict[str, Any] | None
    # The stored payload's key in the result store; null for a payload kept in the job.
    payload_ref: str | None = None
    # When the job may run first (scheduled with run_at / delay) or next (a retry).
    run_at: datetime | None
    # Inline result (small results), or null while there is none or it is in the store.
    result: Any = None
    # Set when the result is in the result store: fetch it from ``links.result``.
    result_ref: str | None
    # Null until the handler reports progress.
    progress: JobProgress | None = None
    # The job type's default unless the enqueue request named one.
    priority: PriorityLabel
    # Why a pending job does not start, when an operator paused its queue or job type
    # ("queue paused", "job type paused"); null otherwise.
    waiting_for: Literal["queue paused", "job type paused"] | None = None
    # Where the job is now and what it waits for, in words (for people, not for parsing):
    # "in backoff until 10:42:07 UTC after attempt 2 failed: ...", "running on worker w-3,
    # lease until ...". Its timeline: ``links.timeline``.
    where: str
    # The version of the job this answer read, as in its ETag: an edit (PATCH /jobs/{id})
    # names it in If-Match, and is refused (412) if the job changed since.
    version: str | None = None
    # The debounce or throttle key the job was written for (its type declares one), and how
    # many enqueues a debounced job coalesced; null otherwise.
    debounce_key: str | None = None
    debounce_count: int | None = None


class JobEventView(BaseModel):
    """One state change or hop of a job, as it happened (never changed afterwards)."""

    id: int
    at: datetime
    # accepted, published, claimed, retry_scheduled, released, lease_lost, cancel_requested,
    # quarantined, dead_lettered, republished, cancelled, finished, webhook_attempt
    kind: str
    # The job's attempt it happened to (null for accepted and webhook attempts).
    attempt: int | None
    # A few facts: the worker or relay, when next, why (an error's first 300 characters).
    detail: dict[str, Any]


class JobTimelineView(BaseModel):
    """The job's events, oldest first, and where it is now."""

    job_id: uuid.UUID
    type: str
    status: JobStatus
    where: str
    events: list[JobEventView]
    # False when the deployment records no events (JOBCORE_JOB_EVENTS=false): ``events``
    # then holds only those recorded before that.
    events_recorded: bool = True
    # The ordering key given at enqueue: jobs with the same key start in enqueue order.
    ordering_key: str | None = None
    # Why a pending job that is due waits (its type's concurrency or rate limit, or an
    # earlier job of its ordering key), and since when; null when nothing holds it.
    held_reason: Literal["concurrency", "rate_limit", "ordering", "dependencies"] | None = None
    held_since: datetime | None = None


class PageLinks(BaseModel):
    next: str | None


class JobPage(BaseModel):
    """Newest first. ``next_cursor`` is null on the last page."""

    items: list[JobSummary]
    next_cursor: str | None
    links: PageLinks


class JobEdit(BaseModel):
    """What ``PATCH /jobs/{id}`` changes in a pending job; a field left out stays as it is.
    At least one."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})

    # When it may run, with a time zone offset, within a year from now.
    run_at: datetime | SkipJsonSchema[None] = None
    priority: PriorityLabel | SkipJsonSchema[None] = None
    # The whole new payload, validated by the job type's model as an enqueue's is. It may
    # not change the job's unique key nor its concurrency or rate key.
    payload: dict[str, Any] | SkipJsonSchema[None] = None


class CancelAnswer(BaseModel):
    job_id: uuid.UUID
    # ``cancelled`` when it was pending; ``running`` with ``cancel_requested`` while the
    # worker stops it (it then ends ``cancelled``).
    status: JobStatus
    cancel_requested: bool
    cancel_requested_at: datetime | None
    links: JobLinks


class FieldError(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class Problem(BaseModel):
    """RFC 9457 problem details (``application/problem+json``). The optional members are
    absent when they do not apply, never null."""

    type: str = Field(examples=["https://jobcore.dev/problems/unknown-job-type"])
    title: str
    status: int
    detail: str
    # On a 422: which inputs are wrong.
    errors: list[FieldError] | SkipJsonSchema[None] = None
    # On a 409 about a job's status.
    job_status: JobStatus | SkipJsonSchema[None] = None
    # On a 403: the scope the API key lacks.
    required_scope: Scope | SkipJsonSchema[None] = None
    # On a 409 unique-job-exists: the live job that holds the unique key (with job_status).
    job_id: uuid.UUID | SkipJsonSchema[None] = None
    # On a 429: the quota reached (jobs per second, or jobs, or long-polls). In a batch
    # item's problem: with retry_after, the Retry-After its own answer would have carried.
    limit: float | SkipJsonSchema[None] = None
    retry_after: int | SkipJsonSchema[None] = None
    # On /readyz's 503: what was checked and how it went.
    checks: dict[str, str] | SkipJsonSchema[None] = None


class BatchItemAnswer(BaseModel):
    """One item's outcome, at its ``index`` in the request. ``created``: a new job;
    ``replayed``: the job of the item's idempotency key (same request); ``joined``: the
    open job of the item's debounce or throttle key (``job_id``; ``joined`` is true),
    nothing new written; ``unique_conflict``:
    the live job that holds its unique key (``job_id``, ``job_status``), nothing written;
    ``refused``: a quota (``problem``: enqueue-rate-limited or too-many-unfinished-jobs,
    with ``retry_after``); ``invalid``: the item's idempotency key was used for another
    request (``problem``: idempotency-key-reused). An item the schema refuses refuses
    the whole batch with a 422 instead."""

    index: int
    status: ItemStatus
    job_id: uuid.UUID | None
    job_status: JobStatus | None
    joined: bool
    problem: Problem | None


class BatchCounts(BaseModel):
    created: int
    replayed: int
    joined: int
    unique_conflict: int
    refused: int
    invalid: int


class BatchAnswer(BaseModel):
    """Every item's outcome in the request's order; the jobs created were committed
    together, with their outbox messages."""

    items: list[BatchItemAnswer]
    counts: BatchCounts


class BatchCallbackView(BaseModel):
    """A callback of a batch: its job type, and the job it fired (null until it fires)."""

    type: str
    job_id: uuid.UUID | None


class BatchCallbacks(BaseModel):
    on_success: BatchCallbackView | None = None
    on_complete: BatchCallbackView | None = None
    on_death: BatchCallbackView | None = None


class BatchView(BaseModel):
    """A batch (``POST /batches``). ``status``: ``open`` (jobs may join), ``closed`` (some
    member has not settled), ``succeeded`` (all did), ``settled`` (all settled, not all
    succeeded), ``cancelled``. The counts are of its own members, a child batch counting
    as one; ``failed_job_ids`` lists up to 1,000 of its failed jobs."""

    id: uuid.UUID
    parent_id: uuid.UUID | None
    description: str | None
    status: Literal["open", "closed", "succeeded", "settled", "cancelled"]
    total: int
    pending: int
    succeeded: int
    failed: int
    cancelled: int
    failed_job_ids: list[uuid.UUID]
    first_death_job_id: uuid.UUID | None
    callbacks: BatchCallbacks
    created_at: datetime
    closed_at: datetime | None
    settled_at: datetime | None
    cancelled_at: datetime | None


class BatchCreated(BatchView):
    """The batch created; ``job_ids``: its jobs, in the order given."""

    job_ids: list[uuid.UUID]


class BatchList(BaseModel):
    items: list[BatchView]


class BatchJobsAdded(BaseModel):
    batch_id: uuid.UUID
    job_ids: list[uuid.UUID]
    closed: bool


class Alive(BaseModel):
    status: Literal["alive"]


class Ready(BaseModel):
    ready: bool
    checks: dict[str, str]


# --- /admin: operators' view across tenants ----------------------------------------------


class AdminJobSummary(BaseModel):
    id: uuid.UUID
    tenant: str
    type: str
    status: JobStatus
    entity_id: str | None
    attempts: int
    max_attempts: int
    last_error: str | None
    created_at: datetime
    finished_at: datetime | None


class AdminJobList(BaseModel):
    """Newest first, at most ``limit``."""

    items: list[AdminJobSummary]


class AdminJobView(AdminJobSummary):
    queue: str
    idempotency_key: str | None
    unique_key: str | None = None
    # As in GET /jobs/{id}: null for a payload stored by reference (``payload_ref``).
    payload: dict[str, Any] | None
    payload_ref: str | None = None
    run_at: datetime | None
    result: Any = None
    result_ref: str | None
    worker_id: str | None
    lease_expires_at: datetime | None
    cancel_requested_at: datetime | None
    started_at: datetime | None
    updated_at: datetime
    where: str
    # As in GET /jobs/{id}, with the job's place in its ordering key.
    ordering_key: str | None = None
    ordering_seq: int | None = None
    held_reason: Literal["concurrency", "rate_limit", "ordering", "dependencies"] | None = None
    held_since: datetime | None = None


class AdminCancelAnswer(BaseModel):
    job_id: uuid.UUID
    status: JobStatus
    cancel_requested: bool
    cancel_requested_at: datetime | None


class AdminRetryAnswer(BaseModel):
    """The failed or cancelled job stays as it is; ``job_id`` is its new copy."""

    retried: uuid.UUID
    job_id: uuid.UUID
    status: JobStatus


class QuarantinedRow(BaseModel):
    id: int
    message_id: uuid.UUID
    job_id: uuid.UUID | None
    exchange: str
    routing_key: str
    message_type: str
    attempts: int
    last_error: str | None
    quarantined_at: datetime
    created_at: datetime


class QuarantinedList(BaseModel):
    """Earliest quarantined first, at most ``limit``."""

    items: list[QuarantinedRow]


class OutboxActedOn(BaseModel):
    id: int
    message_id: uuid.UUID
    job_id: uuid.UUID | None
    last_error: str | None


class AdminKey(BaseModel):
    """An API key as anyone may see it: never the key, never its hash."""

    id: uuid.UUID
    tenant: str
    prefix: str
    label: str | None
    scopes: list[Scope]
    state: Literal["active", "expired", "revoked"]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    lineage: uuid.UUID
    rotated_from: uuid.UUID | None


class AdminKeyList(BaseModel):
    """Oldest first."""

    items: list[AdminKey]
