"""Response models: what /openapi.json promises. Routes build the same shapes as dicts
(serialised by orjson) on the hot paths; the tests validate answers against these."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from jobcore.scopes import Scope
from jobcore.states import JobStatus


class JobLinks(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    self_: str = Field(alias="self", examples=["/jobs/0b7c4f9e-8a51-4c1e-9d0c-6f1f3f7c2a10"])
    result: str
    cancel: str


class Accepted(BaseModel):
    """The job is stored (with its outbox message); poll ``links.self`` for its status."""

    job_id: uuid.UUID
    status: JobStatus
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
    payload: dict[str, Any]
    # When the job may run first (scheduled with run_at / delay) or next (a retry).
    run_at: datetime | None
    # Inline result (small results), or null while there is none or it is in the store.
    result: Any = None
    # Set when the result is in the result store: fetch it from ``links.result``.
    result_ref: str | None
    # Null until the handler reports progress.
    progress: JobProgress | None = None
    # The ordering key given at enqueue: jobs with the same key start in enqueue order.
    ordering_key: str | None = None
    # Why a pending job that is due waits (its type's concurrency or rate limit, or an
    # earlier job of its ordering key), and since when; null when nothing holds it.
    held_reason: Literal["concurrency", "rate_limit", "ordering"] | None = None
    held_since: datetime | None = None


class PageLinks(BaseModel):
    next: str | None


class JobPage(BaseModel):
    """Newest first. ``next_cursor`` is null on the last page."""

    items: list[JobSummary]
    next_cursor: str | None
    links: PageLinks


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
    """RFC 9457 problem details (``application/problem+json``)."""

    type: str = Field(examples=["https://jobcore.dev/problems/unknown-job-type"])
    title: str
    status: int
    detail: str
    errors: list[FieldError] | None = None
    job_status: JobStatus | None = None
    # On a 403: the scope the API key lacks.
    required_scope: Scope | None = None


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
    payload: dict[str, Any]
    run_at: datetime | None
    result: Any = None
    result_ref: str | None
    worker_id: str | None
    lease_expires_at: datetime | None
    cancel_requested_at: datetime | None
    started_at: datetime | None
    updated_at: datetime
    # As in GET /jobs/{id}, with the job's place in its ordering key.
    ordering_key: str | None = None
    ordering_seq: int | None = None
    held_reason: Literal["concurrency", "rate_limit", "ordering"] | None = None
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
