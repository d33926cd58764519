"""What the job routes do, on a session: submit, read, list, fetch a result (cancel is a
use case the CLI shares: :func:`jobcore.usecases.jobs.cancel_job`).

Named statements from :mod:`jobcore.sql.jobs`; status changes checked with
:mod:`jobcore.states`. Every read is scoped to the tenant, so another tenant's job is
indistinguishable from a job that does not exist.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from psycopg.rows import DictRow
from pydantic import BaseModel

from jobcore.amqp.topology import Topology
from jobcore.db import Session, fetch_all, fetch_one
from jobcore.enqueue import EnqueueResult, enqueue
from jobcore.errors import JobNotFound, ResultNotReady
from jobcore.priorities import Priority
from jobcore.quotas import Quotas
from jobcore.registry import JobType
from jobcore.results import ResultStore
from jobcore.sql.jobs.reads import (
    JOB_GET,
    JOB_GET_RESULT,
    JOB_LIST,
    JOB_LIST_FOR_ENTITY,
    JobListParams,
)
from jobcore.sql.tenant_quotas import TENANT_MAX_LONG_POLLS
from jobcore.states import JobStatus
from jobcore.wakeups import RelayWakeups
from services.api.cursor import decode_cursor, encode_cursor
from services.api.problems import InvalidIdempotencyKey, InvalidRequest
from services.api.tracing import enqueue_span

MAX_IDEMPOTENCY_KEY_LENGTH = 255
# How far ahead a job may be scheduled.
MAX_SCHEDULE_AHEAD = timedelta(days=366)


def check_idempotency_key(key: str | None) -> str | None:
    """1-255 printable ASCII characters (space to tilde), or no key at all."""
    if key is None:
        return None
    if not 1 <= len(key) <= MAX_IDEMPOTENCY_KEY_LENGTH or not all(" " <= c <= "~" for c in key):
        raise InvalidIdempotencyKey()
    return key


def schedule(run_at: datetime | None, delay: float | None) -> datetime | None:
    """When a job may first run: ``run_at``, or now + ``delay`` seconds, or now (None)."""
    if run_at is not None and delay is not None:
        raise InvalidRequest(
            [
                {
                    "loc": ["query", "delay"],
                    "msg": "give run_at or delay, not both",
                    "type": "conflict",
                }
            ]
        )
    if delay is not None:
        return datetime.now(UTC) + timedelta(seconds=delay)
    if run_at is None:
        return None
    if run_at.tzinfo is None or run_at.utcoffset() is None:
        raise InvalidRequest(
            [{"loc": ["query", "run_at"], "msg": "needs a time zone offset", "type": "timezone"}]
        )
    try:
        when = run_at.astimezone(UTC)
    except OverflowError:
        when = None
    if when is None or when - datetime.now(UTC) > MAX_SCHEDULE_AHEAD:
        raise InvalidRequest(
            [
                {
                    "loc": ["query", "run_at"],
                    "msg": f"must be within {MAX_SCHEDULE_AHEAD.days} days from now",
                    "type": "range",
                }
            ]
        )
    return when


@dataclass(frozen=True, slots=True)
class Submission:
    idempotency_key: str | None = None
    entity_id: str | None = None
    max_attempts: int | None = None
    run_at: datetime | None = None
    ordering_key: str | None = None
    # Checked already (services.api.callbacks).
    callback_url: str | None = None
    # jobcore.enqueue.request_fingerprint of the request as sent.
    fingerprint: str | None = None
    # The request's own unique key (else the job type's unique payload field, if any).
    unique_key: str | None = None
    # None: the job type's default.
    priority: Priority | None = None


@dataclass(frozen=True, slots=True)
class ReceivedPayload:
    """The request body as parsed (what the idempotency fingerprint covers) and as the
    job type's model (what is stored and run)."""

    raw: Any
    model: BaseModel


async def submit(
    uow: Session,
    topology: Topology,
    *,
    tenant: str,
    job_type: JobType[Any],
    payload: BaseModel,
    submission: Submission,
    quotas: Quotas,
    key_id: uuid.UUID | None = None,
    wakeups: RelayWakeups | None = None,
    payload_store: ResultStore | None = None,
    inline_payload_max_bytes: int | None = None,
) -> EnqueueResult:
    """Write the job and its outbox message (one statement: committed on a session), if
    the API key ``key_id`` is still usable then (:class:`~jobcore.apikeys.InvalidApiKey`);
    ``wakeups``: see :func:`jobcore.enqueue.enqueue`.

    Inside the ``enqueue`` span, so the outbox row carries that span's trace context.
    """
    with enqueue_span(job_type.name) as span:
        result = await enqueue(
            uow,
            topology,
            tenant=tenant,
            job_type=job_type,
            payload=payload,
            idempotency_key=submission.idempotency_key,
            entity_id=submission.entity_id,
            max_attempts=submission.max_attempts,
            run_at=submission.run_at,
            callback_url=submission.callback_url,
            fingerprint=submission.fingerprint,
            quotas=quotas,
            unique_key=submission.unique_key,
            priority=submission.priority,
            ordering_key=submission.ordering_key,
            key_id=key_id,
            wakeups=wakeups,
            payload_store=payload_store,
            inline_payload_max_bytes=inline_payload_max_bytes,
        )
        if span is not None:
            span.set_attributes(
                {
                    "tenant": result.tenant,
                    "job.id": str(result.job_id),
                    "job.replayed": result.replayed,
                }
            )
    return result


async def tenant_max_long_polls(uow: Session, tenant: str, default: int) -> int:
    row = await fetch_one(
        uow, TENANT_MAX_LONG_POLLS({"tenant": tenant, "default_max_long_polls": default})
    )
    assert row is not None  # one row: the override or the default
    return int(row["max_long_polls"])


async def get_job(uow: Session, tenant: str, job_id: uuid.UUID) -> DictRow:
    row = await fetch_one(uow, JOB_GET({"id": job_id, "tenant": tenant}))
    if row is None:
        raise JobNotFound("no job with that id")
    return row


@dataclass(frozen=True, slots=True)
class JobFilter:
    entity_id: str | None = None
    status: JobStatus | None = None
    type: str | None = None


async def list_jobs(
    uow: Session, tenant: str, where: JobFilter, *, limit: int, cursor: str | None
) -> tuple[list[DictRow], str | None]:
    """One page, newest first, and the cursor of the next page (None on the last)."""
    after_created_at, after_id = decode_cursor(cursor) if cursor else (None, None)
    params: JobListParams = {
        "tenant": tenant,
        "entity_id": where.entity_id,
        "status": where.status.value if where.status else None,
        "type": where.type,
        "after_created_at": after_created_at,
        "after_id": after_id,
        # One more than the page tells whether another page follows.
        "limit": limit + 1,
    }
    query = JOB_LIST_FOR_ENTITY if where.entity_id is not None else JOB_LIST
    rows = await fetch_all(uow, query(params))
    if len(rows) <= limit:
        return rows, None
    page = rows[:limit]
    return page, encode_cursor(page[-1]["created_at"], page[-1]["id"])


async def job_result(uow: Session, tenant: str, job_id: uuid.UUID) -> DictRow:
    """The result columns of a succeeded job (``result`` inline or ``result_ref``)."""
    row = await fetch_one(uow, JOB_GET_RESULT({"id": job_id, "tenant": tenant}))
    if row is None:
        raise JobNotFound("no job with that id")
    if row["status"] != JobStatus.SUCCEEDED:
        raise ResultNotReady(row["status"])
    return row
