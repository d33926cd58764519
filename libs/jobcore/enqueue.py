"""Enqueueing a job: the job row and its outbox message, written together.

This is invariant 1 of docs/design.md in code: nothing here talks to the broker. The relay
publishes the outbox row later; the NOTIFY in the same statement wakes it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from psycopg.types.json import Jsonb
from pydantic import BaseModel

from jobcore.amqp.topology import Topology
from jobcore.apikeys import InvalidApiKey
from jobcore.channels import OUTBOX_CHANNEL
from jobcore.db import Session, UnitOfWork
from jobcore.envelope import JobMessage
from jobcore.errors import (
    EnqueueRateExceeded,
    IdempotencyConflict,
    InvalidPayload,
    QuotaExceeded,
    ServiceStateError,
    TooManyUnfinishedJobs,
    UniqueJobExists,
)
from jobcore.gates import gate_key
from jobcore.priorities import Priority
from jobcore.quotas import UNLIMITED, Quotas, RateLimit, Refusal, rate_headers
from jobcore.registry import JobType
from jobcore.results import ResultStore
from jobcore.sql import OutboxMessageParams
from jobcore.states import JobStatus
from jobcore.store import JobGateParams, JobInsertParams, job_store
from jobcore.telemetry import capture_trace_headers
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


def request_fingerprint(
    payload: Any,
    *,
    callback_url: str | None = None,
    run_at: datetime | None = None,
    delay: float | None = None,
    max_attempts: int | None = None,
    entity_id: str | None = None,
    unique_key: str | None = None,
    priority: Priority | None = None,
    ordering_key: str | None = None,
) -> str:
    """A stable hash of an enqueue request as the client sent it: the payload's JSON (key
    order and whitespace do not matter) and every parameter that changes the job.
    ``unique_key`` counts only when given, so requests without one hash as they did
    before unique keys existed (their retries still replay).

    ``payload`` is the parsed request body, not the validated model: a model that gains a
    defaulted field in a deploy would otherwise change the fingerprint of a request the
    client did not change, and its retry would be refused as a different request. ``delay``
    is kept as sent (the same delay is the same request, whenever it is retried);
    ``run_at`` as an instant in UTC. ``priority`` counts only when the request named one, so
    the fingerprints of requests made before priorities existed do not change.
    """
    request: dict[str, Any] = {
        "payload": payload,
        "callback_url": callback_url,
        "run_at": None if run_at is None else _instant(run_at),
        "delay": delay,
        "max_attempts": max_attempts,
        "entity_id": entity_id,
    }
    if unique_key is not None:
        request["unique_key"] = unique_key
    if priority is not None:
        request["priority"] = int(priority)
    # Only when given, so the fingerprints of requests without one did not change.
    if ordering_key is not None:
        request["ordering_key"] = ordering_key
    canonical = orjson.dumps(request, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


MAX_UNIQUE_KEY_LENGTH = 255


class InvalidUniqueKey(InvalidPayload):
    """A unique key is at most 255 characters."""

    def __init__(self, loc: list[str | int], message: str) -> None:
        self.errors: list[dict[str, Any]] = [{"loc": loc, "msg": message, "type": "unique_key"}]
        super().__init__(message)


def unique_key_of(job_type: JobType[Any], payload: Any, explicit: str | None) -> str | None:
    """The job's unique key: ``explicit`` (the request's ``unique_key``), else the value of
    the payload field the job type names (``unique_field``; a string as it is, anything
    else as canonical JSON), else none. ``payload`` is the validated payload as JSON."""
    if explicit is not None:
        if not 1 <= len(explicit) <= MAX_UNIQUE_KEY_LENGTH or "\x00" in explicit:
            raise InvalidUniqueKey(
                ["query", "unique_key"], "a unique key is 1 to 255 characters, without NUL"
            )
        return explicit
    if job_type.unique_field is None:
        return None
    value = payload.get(job_type.unique_field) if isinstance(payload, dict) else None
    if value is None:
        return None
    key = value if isinstance(value, str) else orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    if isinstance(key, bytes):
        key = key.decode()
    if len(key) > MAX_UNIQUE_KEY_LENGTH:
        raise InvalidUniqueKey(
            ["body", job_type.unique_field],
            f"the job type's unique key is this field, at most {MAX_UNIQUE_KEY_LENGTH} "
            "characters (as JSON unless a string)",
        )
    return key


def legacy_fingerprint(payload: BaseModel) -> str:
    """The fingerprint of jobs enqueued before :func:`request_fingerprint`: the validated
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


def _instant(when: datetime) -> str:
    return (when.astimezone(UTC) if when.tzinfo is not None else when).isoformat()


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
    fingerprint: str | None = None,
    quotas: Quotas = UNLIMITED,
    unique_key: str | None = None,
    priority: Priority | None = None,
    origin: Mapping[str, str] | None = None,
    ordering_key: str | None = None,
    ordering_seq: int | None = None,
    key_id: uuid.UUID | None = None,
    wakeups: RelayWakeups | None = None,
    payload_store: ResultStore | None = None,
    inline_payload_max_bytes: int | None = None,
) -> EnqueueResult:
    """Write a pending job and its outbox message through ``uow``.

    The job and its message are one statement, so on a :class:`~jobcore.db.Session` they
    commit together on their own; in a unit of work, the caller commits.

    With an idempotency key already used for this tenant and type, returns the existing
    job (``replayed``) when the request's ``fingerprint`` is the same, and raises
    :class:`IdempotencyConflict` when it differs. The API passes the
    :func:`request_fingerprint` of the request as sent; without one, it is taken from
    the validated payload and these arguments. ``callback_url`` (checked by the caller)
    receives the completion webhook; without one, the tenant's default endpoint does.
    ``quotas``: the defaults for a tenant without overrides (``tenant_quotas``); over its
    rate limit or its cap of unfinished jobs the job is not written and
    :class:`EnqueueRateExceeded` or :class:`TooManyUnfinishedJobs` is raised, except for a
    replay, which answers its job whatever the quotas. ``priority``: the job type's default
    unless given (:mod:`jobcore.priorities`). ``origin`` goes into the job's ``accepted``
    event (the schedule that enqueued it, the job it retries): a few short strings, never
    payload data. Jobs of the tenant with the same ``ordering_key`` start one after
    another in enqueue order (:mod:`jobcore.gates`); ``ordering_seq`` puts the job at a
    given place in its key (the retry of a failed job that still blocks its key takes
    that job's place, :func:`jobcore.usecases.jobs.retry_job`) instead of the next one.
    ``key_id``: the API key the request came with, checked usable in the statement that
    writes (:class:`~jobcore.apikeys.InvalidApiKey` if it is revoked or
    expired by then, and nothing is written).

    ``wakeups``: on a session, while other enqueues of the process are in flight, the
    statement does not NOTIFY the relays; they are woken through it once the job
    committed (why: :mod:`jobcore.wakeups`). Alone, in a unit of work, or without it, the
    statement NOTIFYs, and the relays hear it when it commits.

    ``unique_key`` (else the job type's ``unique_field`` of the payload,
    :func:`unique_key_of`): while a pending or running job of this tenant and type holds
    the same key, no job is written and :class:`UniqueJobExists` names that job (checked
    after the idempotency key: a replay is answered as a replay). Neither uses quota.

    ``payload_store``: a payload whose JSON is larger than ``inline_payload_max_bytes``
    is stored there first (``payloads/<job id>.json``) and the row keeps its key in
    ``payload_ref``; :class:`~jobcore.results.StoreUnavailable` (nothing written) when the
    store cannot take it. An upload whose job is not written (refused, replayed, the
    statement failed) is deleted at once when possible, else by the pruner's sweep.
    """
    trace = capture_trace_headers()
    document = payload.model_dump(mode="json")
    key = unique_key_of(job_type, document, unique_key)
    if fingerprint is None:
        fingerprint = request_fingerprint(
            document,
            callback_url=callback_url,
            run_at=run_at,
            max_attempts=max_attempts,
            entity_id=entity_id,
            unique_key=unique_key,
            priority=priority,
            ordering_key=ordering_key,
        )
    job_id = uuid.uuid4()
    payload_ref: str | None = None
    if payload_store is not None and inline_payload_max_bytes is not None:
        encoded = orjson.dumps(document)
        if len(encoded) > inline_payload_max_bytes:
            payload_ref = await asyncio.to_thread(payload_store.put_payload, job_id, encoded)
    params: JobInsertParams = {
        "id": job_id,
        "tenant": tenant,
        "type": job_type.name,
        "queue": job_type.queue,
        "idempotency_key": idempotency_key,
        "key_id": key_id,
        "payload_fingerprint": fingerprint,
        "payload": Jsonb({} if payload_ref is not None else document),
        "payload_ref": payload_ref,
        "entity_id": entity_id,
        "max_attempts": max_attempts or job_type.max_attempts,
        "priority": int(job_type.priority if priority is None else priority),
        "run_at": run_at,
        "callback_url": callback_url,
        "event_detail": Jsonb(dict(origin or {})),
        "traceparent": trace.get("traceparent"),
        "tracestate": trace.get("tracestate"),
        "channel": OUTBOX_CHANNEL,
        "notify": True,
        "default_rate": quotas.enqueue_rate,
        "default_burst": quotas.enqueue_burst,
        "default_max_unfinished": quotas.max_unfinished,
        "default_max_long_polls": quotas.max_long_polls,
        "unique_key": key,
        **job_gates(job_type, tenant=tenant, payload=document, ordering_key=ordering_key),
        "ordering_seq": ordering_seq,
        **job_message_row(
            topology, job_id=job_id, job_type=job_type, attempt=1, trace_headers=trace
        ),
    }
    if payload_ref is None or payload_store is None:
        return await _write(uow, params, legacy=payload, wakeups=wakeups)
    try:
        outcome = await _write(uow, params, legacy=payload, wakeups=wakeups)
    except (InvalidApiKey, QuotaExceeded, IdempotencyConflict, UniqueJobExists):
        # Refused: no job was written. After any other error (a lost connection, a
        # cancellation) the job may have committed: the sweep decides, by its row.
        await _forget_upload(payload_store, payload_ref)
        raise
    if outcome.job_id != job_id:  # a replay answered with the earlier job
        await _forget_upload(payload_store, payload_ref)
    return outcome


async def _write(
    uow: Session, params: JobInsertParams, *, legacy: BaseModel, wakeups: RelayWakeups | None
) -> EnqueueResult:
    if wakeups is None or isinstance(uow, UnitOfWork):
        return await _insert_until_answered(uow, params, legacy=legacy)
    with wakeups.enqueuing() as alone:
        params["notify"] = alone
        outcome = await _insert_until_answered(uow, params, legacy=legacy)
    if not alone and not outcome.replayed:
        wakeups.wake()
    return outcome


async def _forget_upload(store: ResultStore, key: str) -> None:
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
    uow: Session, params: JobInsertParams, *, legacy: BaseModel
) -> EnqueueResult:
    # A holder of the unique key that ends between the insert and the read of it has
    # freed it: the insert is tried again (its ids were not used).
    for _ in range(UNIQUE_KEY_TRIES):
        outcome = await _insert(uow, params, legacy=legacy)
        if outcome is not None:
            return outcome
    raise ServiceStateError("the unique key's holder kept changing; retry")


# Tries of an enqueue whose unique key was freed while it was being refused.
UNIQUE_KEY_TRIES = 3


async def _insert(
    uow: Session, params: JobInsertParams, *, legacy: BaseModel
) -> EnqueueResult | None:
    """One try of :func:`enqueue`: its answer, or None when the unique key it found taken
    is free again. ``legacy``: the payload, for a replay of a job from before
    :func:`request_fingerprint`."""
    tenant, job_type = params["tenant"], params["type"]
    idempotency_key, unique_key = params["idempotency_key"], params["unique_key"]
    fingerprint = params["payload_fingerprint"]
    row = await job_store.insert(uow, params)
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
