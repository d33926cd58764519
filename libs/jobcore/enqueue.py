"""Writing an enqueue: the job row and its outbox message, in one statement, and what its
answer means (created, a replay, a unique key taken, a quota refused).

This is invariant 1 of docs/design.md in code: nothing here talks to the broker. The relay
publishes the outbox row later; the NOTIFY in the same statement wakes it. What is written
comes from an :class:`~jobcore.submit.EnqueueRequest`, checked when it was built
(:func:`jobcore.submit.enqueue` is the entry); the rows of a job message are
built here for the retries, the reaper and the sweeper too.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from jobcore.amqp.topology import Topology
from jobcore.apikeys import InvalidApiKey
from jobcore.db import Session, UnitOfWork
from jobcore.envelope import JobMessage
from jobcore.errors import (
    EnqueueRateExceeded,
    IdempotencyConflict,
    QuotaExceeded,
    ServiceStateError,
    TooManyUnfinishedJobs,
    UniqueJobExists,
)
from jobcore.gates import gate_key
from jobcore.quotas import Admission, RateLimit, Refusal, rate_headers
from jobcore.registry import JobType
from jobcore.results import ResultStore
from jobcore.states import JobStatus
from jobcore.store import (
    JobGateParams,
    JobInsertParams,
    OutboxMessageParams,
    OutboxMessagesParams,
    job_store,
)
from jobcore.wakeups import RelayWakeups

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    tenant: str
    job_id: uuid.UUID
    status: JobStatus
    created_at: datetime
    # True when an idempotency key matched an existing job with the same payload.
    replayed: bool
    # RateLimit and RateLimit-Policy of the tenant's enqueue rate limit (none: unlimited).
    rate_headers: dict[str, str] = field(default_factory=dict)


def legacy_fingerprint(payload: BaseModel) -> str:
    """The fingerprint of jobs enqueued before
    :func:`~jobcore.submit.request_fingerprint`: the validated
    payload alone. A retry of such a job after the upgrade still finds it (the two hash
    different inputs, so a newer job never matches this one). Can go once every job from
    before the upgrade has been pruned."""
    canonical = orjson.dumps(payload.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def job_gates(
    job_type: JobType[Any], *, tenant: str, payload: Any, ordering_key: str | None
) -> JobGateParams:
    """The gates a job of this type passes before it starts (:mod:`jobcore.gates`)."""
    limit, rate = job_type.concurrency, job_type.rate
    where = {"type_name": job_type.name, "tenant": tenant, "payload": payload}
    return {
        "concurrency_key": None if limit is None else gate_key("concurrency", limit.per, **where),
        "concurrency_limit": None if limit is None else limit.n,
        "rate_key": None if rate is None else gate_key("rate", rate.per, **where),
        "rate_per_second": None if rate is None else rate.per_second,
        "rate_burst": None if rate is None else rate.burst,
        "ordering_key": ordering_key,
        "ordering_seq": None,
        "ordering_blocks": job_type.ordering == "block",
    }


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


def trace_headers_of(row: Mapping[str, Any]) -> dict[str, str]:
    """The trace context a job row keeps, as message headers."""
    return {k: row[k] for k in ("traceparent", "tracestate") if row[k] is not None}


def next_attempt_message(topology: Topology, row: Mapping[str, Any]) -> OutboxMessageParams:
    """The message for the next attempt of a locked job row (id, type, queue, attempts and
    its trace context): what the gate releaser and the anti-entropy sweeper publish."""
    return message_row(
        topology,
        job_id=row["id"],
        type_name=row["type"],
        queue=row["queue"],
        attempt=row["attempts"] + 1,
        trace_headers=trace_headers_of(row),
    )


def message_columns(messages: Sequence[OutboxMessageParams]) -> OutboxMessagesParams:
    """Messages as the parallel arrays a many-row statement unnests."""
    return {
        "message_ids": [m["message_id"] for m in messages],
        "exchanges": [m["exchange"] for m in messages],
        "routing_keys": [m["routing_key"] for m in messages],
        "message_types": [m["message_type"] for m in messages],
        "headers": [m["headers"] for m in messages],
        "bodies": [m["body"] for m in messages],
    }


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


async def write_job(
    uow: Session,
    params: JobInsertParams,
    *,
    legacy: BaseModel,
    wakeups: RelayWakeups | None,
    admission: Admission = Admission.EXACT,
) -> EnqueueResult:
    """Insert the job ``params`` describe, with its outbox message, and answer for it:
    created, or the job its idempotency key names (``replayed``; ``legacy``: the
    validated payload, for a job from before request fingerprints), or
    :class:`~jobcore.errors.IdempotencyConflict`, :class:`~jobcore.errors.UniqueJobExists`,
    a :class:`~jobcore.errors.QuotaExceeded`, :class:`~jobcore.apikeys.InvalidApiKey`.
    ``wakeups``, ``admission``: see :func:`jobcore.submit.enqueue`."""
    if wakeups is None or isinstance(uow, UnitOfWork):
        return await _insert_until_answered(uow, params, legacy=legacy, admission=admission)
    with wakeups.enqueuing() as alone:
        params["notify"] = alone
        outcome = await _insert_until_answered(uow, params, legacy=legacy, admission=admission)
    if not alone and not outcome.replayed:
        wakeups.wake()
    return outcome


async def answer_before_upload(
    uow: Session, params: JobInsertParams, *, legacy: BaseModel
) -> EnqueueResult | None:
    """What :func:`write_job` would answer for ``params`` without writing a job, read
    before a payload is uploaded for it, so that a replay, a taken key or a refusal costs
    the object store nothing: the replay of the job holding the idempotency key, or
    :class:`~jobcore.errors.IdempotencyConflict`, :class:`~jobcore.errors.UniqueJobExists`,
    a :class:`~jobcore.errors.QuotaExceeded`, :class:`~jobcore.apikeys.InvalidApiKey`, in
    the order the insert checks them. None: the insert would write the job as things
    stand, and remains the judge (what changes meanwhile is decided there, under the lock
    of the tenant's usage row). A read, as early as a request that came a moment sooner:
    nothing is locked or changed."""
    row = await job_store.preview_insert(
        uow,
        {
            "tenant": params["tenant"],
            "type": params["type"],
            "idempotency_key": params["idempotency_key"],
            "unique_key": params["unique_key"],
            "key_id": params["key_id"],
            "default_rate": params["default_rate"],
            "default_burst": params["default_burst"],
            "default_max_unfinished": params["default_max_unfinished"],
            "default_max_long_polls": params["default_max_long_polls"],
        },
    )
    if row is None:
        raise InvalidApiKey()
    limit = RateLimit(float(row["rate"]), int(row["burst"]))
    headers = rate_headers(limit, seconds_of(row["rate_tat"]), row["now"].timestamp())
    if row["keyed_id"] is not None:
        fingerprint = params["payload_fingerprint"]
        if row["payload_fingerprint"] not in (fingerprint, legacy_fingerprint(legacy)):
            raise IdempotencyConflict(
                f"idempotency key already used for job {row['keyed_id']} with a different request"
            )
        return EnqueueResult(
            params["tenant"],
            row["keyed_id"],
            JobStatus(row["keyed_status"]),
            row["keyed_created_at"],
            True,
            headers,
        )
    if row["live_id"] is not None:
        raise UniqueJobExists(row["live_id"], row["live_status"])
    if row["refusal"] is not None:
        raise quota_refusal(row, limit, headers)
    return None


async def forget_upload(store: ResultStore, key: str) -> None:
    """Delete a payload upload whose job was not written; on failure the pruner's sweep
    deletes it (jobcore.maintenance.retention)."""
    try:
        await asyncio.to_thread(store.delete, key)
    except OSError as exc:
        log.info(
            "could not delete an unused payload upload; the pruner's sweep will",
            extra={"key": key, "error": str(exc)},
        )


async def _insert_until_answered(
    uow: Session, params: JobInsertParams, *, legacy: BaseModel, admission: Admission
) -> EnqueueResult:
    # A holder of the unique key that ends between the insert and the read of it has
    # freed it: the insert is tried again (its ids were not used).
    for _ in range(UNIQUE_KEY_TRIES):
        outcome = await _insert(uow, params, legacy=legacy, admission=admission)
        if outcome is not None:
            return outcome
    raise ServiceStateError("the unique key's holder kept changing; retry")


# Tries of an enqueue whose unique key was freed while it was being refused.
UNIQUE_KEY_TRIES = 3


async def _insert(
    uow: Session, params: JobInsertParams, *, legacy: BaseModel, admission: Admission
) -> EnqueueResult | None:
    """One try of :func:`write_job`: its answer, or None when the unique key it found
    taken is free again."""
    tenant, job_type = params["tenant"], params["type"]
    idempotency_key, unique_key = params["idempotency_key"], params["unique_key"]
    fingerprint = params["payload_fingerprint"]
    row = await job_store.insert(uow, params, admission=admission)
    if row is None:  # one row for any tenant name, none for a key revoked or expired since
        raise InvalidApiKey()
    limit = RateLimit(float(row["rate"]), int(row["burst"]))
    headers = rate_headers(limit, seconds_of(row["rate_tat"]), row["now"].timestamp())
    if row["id"] is not None:
        # A new job is pending (the column's default): the statement does not return it.
        return EnqueueResult(
            tenant, row["id"], JobStatus.PENDING, row["created_at"], False, headers
        )
    if row["refusal"] is not None and idempotency_key is None and unique_key is None:
        raise quota_refusal(row, limit, headers)

    # A key is taken: ON CONFLICT waited for the other transaction to commit. Or the
    # quotas refused a request whose key was taken after the statement's snapshot: by its
    # own first attempt, still in flight when the client retried, whose admission the
    # refused one then queued behind. A new statement (a new snapshot under READ
    # COMMITTED) sees that job either way, and a retry of accepted work is not refused.
    if idempotency_key is not None:
        existing = await job_store.get_by_idempotency_key(
            uow, {"tenant": tenant, "type": job_type, "idempotency_key": idempotency_key}
        )
        if existing is not None:
            if existing["payload_fingerprint"] not in (fingerprint, legacy_fingerprint(legacy)):
                raise IdempotencyConflict(
                    f"idempotency key already used for job {existing['id']} with a different "
                    "request"
                )
            return EnqueueResult(
                tenant,
                existing["id"],
                JobStatus(existing["status"]),
                existing["created_at"],
                True,
                headers,
            )
    if unique_key is not None:
        holder = await job_store.get_unique_holder(
            uow, {"tenant": tenant, "type": job_type, "unique_key": unique_key}
        )
        if holder is not None:
            raise UniqueJobExists(holder["id"], holder["status"])
    if row["refusal"] is not None:
        raise quota_refusal(row, limit, headers)
    if unique_key is None:  # pragma: no cover - an idempotency key's job is never deleted
        raise IdempotencyConflict("the idempotency key's job disappeared; retry")
    return None


# Seconds a caller at its cap of unfinished jobs is told to wait: when its jobs end is
# not known here, and a retry costs one cheap refused statement.
UNFINISHED_RETRY_AFTER = 5


def seconds_of(when: datetime | None) -> float | None:
    return None if when is None else when.timestamp()


def quota_refusal(row: Any, limit: RateLimit, headers: dict[str, str]) -> QuotaExceeded:
    """The error for an enqueue statement's answer ``row`` that names a ``refusal`` (with
    the tenant's ``max_unfinished``, ``rate_tat`` and ``now``)."""
    if row["refusal"] == Refusal.MAX_UNFINISHED:
        cap = int(row["max_unfinished"])
        return TooManyUnfinishedJobs(
            f"the tenant has {cap} unfinished jobs, its limit; retry when some have finished",
            retry_after=UNFINISHED_RETRY_AFTER,
            headers=headers,
            limit=cap,
        )
    state = limit.state(seconds_of(row["rate_tat"]), row["now"].timestamp())
    return EnqueueRateExceeded(
        f"the tenant's enqueue rate limit ({limit.rate:g}/s, bursts of {limit.burst}) is used up",
        retry_after=max(1, state.retry_after),
        headers=headers,
        limit=limit.rate,
    )
