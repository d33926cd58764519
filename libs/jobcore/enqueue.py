"""Enqueueing a job: the job row and its outbox message, written together.

This is invariant 1 of DESIGN.md in code: nothing here talks to the broker. The relay
publishes the outbox row later; the NOTIFY in the same statement wakes it.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from jobcore.amqp.topology import Topology
from jobcore.channels import OUTBOX_CHANNEL
from jobcore.db import Session, fetch_one
from jobcore.envelope import JobMessage
from jobcore.errors import IdempotencyConflict
from jobcore.registry import JobType
from jobcore.sql import OutboxMessageParams
from jobcore.sql.jobs import JOB_GET_BY_IDEMPOTENCY_KEY, JOB_INSERT, JobInsertParams
from jobcore.states import JobStatus
from jobcore.telemetry import capture_trace_headers


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    tenant: str
    job_id: uuid.UUID
    status: JobStatus
    created_at: datetime
    # True when an idempotency key matched an existing job with the same payload.
    replayed: bool


def payload_fingerprint(payload: BaseModel) -> str:
    """A stable hash of the validated payload (key order and whitespace do not matter)."""
    canonical = orjson.dumps(payload.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def job_message_row(
    topology: Topology,
    *,
    job_id: uuid.UUID,
    job_type: JobType[Any],
    attempt: int,
    trace_headers: dict[str, str],
) -> OutboxMessageParams:
    """The outbox columns for one job message (used by enqueue, retries and the reaper)."""
    return message_row(
        topology,
        job_id=job_id,
        type_name=job_type.name,
        queue=job_type.queue,
        attempt=attempt,
        trace_headers=trace_headers,
    )


def message_row(
    topology: Topology,
    *,
    job_id: uuid.UUID,
    type_name: str,
    queue: str,
    attempt: int,
    trace_headers: dict[str, str],
) -> OutboxMessageParams:
    """The same from a job row's type and queue, for callers that may not have the job
    type registered (the sweeper publishes whatever is stranded)."""
    return {
        "message_id": uuid.uuid4(),
        "exchange": topology.jobs_exchange,
        "routing_key": topology.routing_key(queue),
        "message_type": type_name,
        "headers": Jsonb(trace_headers),
        "body": JobMessage(job_id=job_id, attempt=attempt, type=type_name).encode(),
    }


async def enqueue(
    uow: Session,
    topology: Topology,
    *,
    tenant: str,
    job_type: JobType[Any],
    payload: BaseModel,
    idempotency_key: str | None = None,
    entity_id: str | None = None,
    max_attempts: int | None = None,
    run_at: datetime | None = None,
    callback_url: str | None = None,
) -> EnqueueResult:
    """Write a pending job and its outbox message through ``uow``.

    The job and its message are one statement, so on a :class:`~jobcore.db.Session` they
    commit together on their own; in a unit of work, the caller commits.

    With an idempotency key already used for this tenant and type, returns the existing
    job (``replayed``) when the payload is the same, and raises
    :class:`IdempotencyConflict` when it differs. ``callback_url`` (checked by the caller)
    receives the completion webhook; without one, the tenant's default endpoint does.
    """
    job_id = uuid.uuid4()
    trace = capture_trace_headers()
    fingerprint = payload_fingerprint(payload)
    params: JobInsertParams = {
        "id": job_id,
        "tenant": tenant,
        "type": job_type.name,
        "queue": job_type.queue,
        "idempotency_key": idempotency_key,
        "payload_fingerprint": fingerprint,
        "payload": Jsonb(payload.model_dump(mode="json")),
        "entity_id": entity_id,
        "max_attempts": max_attempts or job_type.max_attempts,
        "run_at": run_at,
        "callback_url": callback_url,
        "traceparent": trace.get("traceparent"),
        "tracestate": trace.get("tracestate"),
        "channel": OUTBOX_CHANNEL,
        **job_message_row(
            topology, job_id=job_id, job_type=job_type, attempt=1, trace_headers=trace
        ),
    }
    row = await fetch_one(uow, JOB_INSERT(params))
    if row is not None:
        return EnqueueResult(tenant, row["id"], JobStatus(row["status"]), row["created_at"], False)

    # The key is taken. ON CONFLICT waited for the other transaction to commit, so a new
    # statement (a new snapshot under READ COMMITTED) sees its job.
    existing = await fetch_one(
        uow,
        JOB_GET_BY_IDEMPOTENCY_KEY(
            {"tenant": tenant, "type": job_type.name, "idempotency_key": idempotency_key}
        ),
    )
    if existing is None:  # pragma: no cover - the conflicting row cannot vanish: no deletes
        raise IdempotencyConflict("the idempotency key's job disappeared; retry")
    if existing["payload_fingerprint"] != fingerprint:
        raise IdempotencyConflict(
            f"idempotency key already used for job {existing['id']} with a different payload"
        )
    return EnqueueResult(
        tenant, existing["id"], JobStatus(existing["status"]), existing["created_at"], True
    )
