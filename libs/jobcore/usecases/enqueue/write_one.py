"""Writing an enqueue: the job row and its outbox message, in one statement, and what its
answer means (created, a replay, a unique key taken, a quota refused).

This is invariant 1 of docs/design.md in code: nothing here talks to the broker. The relay
publishes the outbox row later; the NOTIFY in the same statement wakes it. What is written
comes from an :class:`~jobcore.usecases.enqueue.submit.EnqueueRequest`, checked when it was built
(:func:`jobcore.usecases.enqueue.submit.enqueue` is the entry); a job message's outbox row
is built by :mod:`jobcore.execution.job_messages`, as for retries, the reaper and the sweeper.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
from pydantic import BaseModel

from jobcore.access.apikeys import InvalidApiKey
from jobcore.database.gateway import Session, UnitOfWork
from jobcore.database.store import (
    CANCEL_CHANNEL,
    JobGateParams,
    JobInsertParams,
    JobKeyParams,
    job_store,
)
from jobcore.execution.registry import JobType
from jobcore.kernel.errors import (
    EnqueueRateExceeded,
    IdempotencyConflict,
    QuotaExceeded,
    ServiceStateError,
    TooManyUnfinishedJobs,
    UniqueJobExists,
)
from jobcore.kernel.gates import Limit, gate_key
from jobcore.kernel.keyed import KeyKind, job_key
from jobcore.kernel.quotas import Admission, RateLimit, Refusal, rate_headers
from jobcore.kernel.states import JobStatus
from jobcore.storage.results import ResultStore
from jobcore.usecases.enqueue.wakeups import RelayWakeups

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
    # True when a debounce or throttle key's open job answered the enqueue (job_id is that
    # job's; nothing was written): jobcore.kernel.keyed.
    joined: bool = False


def legacy_fingerprint(payload: BaseModel) -> str:
    """The fingerprint of jobs enqueued before
    :func:`~jobcore.usecases.enqueue.submit.request_fingerprint`: the validated
    payload alone. A retry of such a job after the upgrade still finds it (the two hash
    different inputs, so a newer job never matches this one). Can go once every job from
    before the upgrade has been pruned."""
    canonical = orjson.dumps(payload.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def job_gates(
    job_type: JobType[Any], *, tenant: str, payload: Any, ordering_key: str | None
) -> JobGateParams:
    """The gates a job of this type passes before it starts (:mod:`jobcore.kernel.gates`)."""
    limit, rate = job_type.concurrency, job_type.rate
    where = {"type_name": job_type.name, "tenant": tenant, "payload": payload}
    concurrency_key = None if limit is None else gate_key("concurrency", limit.per, **where)
    if limit is None and job_type.debounce is not None:
        # A debounce key's jobs run one at a time: the run an event during a run schedules
        # starts after that run.
        limit = Limit(1)
        concurrency_key = job_key(
            KeyKind.DEBOUNCE,
            job_type.debounce.per,
            type_name=job_type.name,
            tenant=tenant,
            payload=payload,
        )
    return {
        "concurrency_key": concurrency_key,
        "concurrency_limit": None if limit is None else limit.n,
        "rate_key": None if rate is None else gate_key("rate", rate.per, **where),
        "rate_per_second": None if rate is None else rate.per_second,
        "rate_burst": None if rate is None else rate.burst,
        "ordering_key": ordering_key,
        "ordering_seq": None,
        "ordering_blocks": job_type.ordering == "block",
    }


def job_key_params(job_type: JobType[Any], *, tenant: str, payload: Any) -> JobKeyParams | None:
    """The debounce or throttle key an enqueue of this type joins, with the type's
    declaration (:mod:`jobcore.kernel.keyed`); None for a type that declares neither."""
    where = {"type_name": job_type.name, "tenant": tenant, "payload": payload}
    if job_type.debounce is not None:
        debounce = job_type.debounce
        return {
            "key_kind": KeyKind.DEBOUNCE.value,
            "job_key": job_key(KeyKind.DEBOUNCE, debounce.per, **where),
            "key_period": debounce.period,
            "key_max_wait": debounce.wait_cap,
            "key_keep": debounce.payloads,
            "key_max_payloads": debounce.max_payloads,
        }
    if job_type.throttle is not None:
        throttle = job_type.throttle
        return {
            "key_kind": KeyKind.THROTTLE.value,
            "job_key": job_key(KeyKind.THROTTLE, throttle.per, **where),
            "key_period": throttle.period,
            "key_max_wait": throttle.period,
            "key_keep": "last",
            "key_max_payloads": 1,
        }
    return None


async def write_job(
    uow: Session,
    params: JobInsertParams,
    *,
    legacy: BaseModel,
    wakeups: RelayWakeups | None,
    admission: Admission = Admission.EXACT,
    key: JobKeyParams | None = None,
    cancel_running: bool = False,
) -> EnqueueResult:
    """Insert the job ``params`` describe, with its outbox message, and answer for it:
    created, or the job its idempotency key names (``replayed``; ``legacy``: the
    validated payload, for a job from before request fingerprints), or
    :class:`~jobcore.kernel.errors.IdempotencyConflict`,
    :class:`~jobcore.kernel.errors.UniqueJobExists`, a
    :class:`~jobcore.kernel.errors.QuotaExceeded`, :class:`~jobcore.access.apikeys.InvalidApiKey`.
    ``wakeups``, ``admission``: see :func:`jobcore.usecases.enqueue.submit.enqueue`.

    ``key``: the debounce or throttle key of the job's type (:func:`job_key_params`): the
    job open to it answers instead, when there is one (``joined``). ``cancel_running``: a
    debounced enqueue that opened a new trailing job while the previous one runs asks
    that run to stop, as ``POST /jobs/{id}/cancel`` does."""
    if wakeups is None or isinstance(uow, UnitOfWork):
        return await _insert_until_answered(
            uow, params, legacy=legacy, admission=admission, key=key, cancel=cancel_running
        )
    with wakeups.enqueuing() as alone:
        params["notify"] = alone
        outcome = await _insert_until_answered(
            uow, params, legacy=legacy, admission=admission, key=key, cancel=cancel_running
        )
    if not alone and not outcome.replayed and not outcome.joined:
        wakeups.wake()
    return outcome


async def answer_before_upload(
    uow: Session, params: JobInsertParams, *, legacy: BaseModel
) -> EnqueueResult | None:
    """What :func:`write_job` would answer for ``params`` without writing a job, read
    before a payload is uploaded for it, so that a replay, a taken key or a refusal costs
    the object store nothing: the replay of the job holding the idempotency key, or
    :class:`~jobcore.kernel.errors.IdempotencyConflict`,
    :class:`~jobcore.kernel.errors.UniqueJobExists`, a
    :class:`~jobcore.kernel.errors.QuotaExceeded`, :class:`~jobcore.access.apikeys.InvalidApiKey`,
    in the order the insert checks them. None: the insert would write the job as things stand, and
    remains the judge (what changes meanwhile is decided there, under the lock of the tenant's usage
    row). A read, as early as a request that came a moment sooner: nothing is locked or changed."""
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
    uow: Session,
    params: JobInsertParams,
    *,
    legacy: BaseModel,
    admission: Admission,
    key: JobKeyParams | None = None,
    cancel: bool = False,
) -> EnqueueResult:
    # A holder of the unique key that ends between the insert and the read of it has
    # freed it: the insert is tried again (its ids were not used).
    for _ in range(UNIQUE_KEY_TRIES):
        outcome = await _insert(
            uow, params, legacy=legacy, admission=admission, key=key, cancel=cancel
        )
        if outcome is not None:
            return outcome
    raise ServiceStateError("the unique key's holder kept changing; retry")


# Tries of an enqueue whose unique key was freed while it was being refused.
UNIQUE_KEY_TRIES = 3


async def _insert(
    uow: Session,
    params: JobInsertParams,
    *,
    legacy: BaseModel,
    admission: Admission,
    key: JobKeyParams | None = None,
    cancel: bool = False,
) -> EnqueueResult | None:
    """One try of :func:`write_job`: its answer, or None when the unique key it found
    taken is free again."""
    tenant, job_type = params["tenant"], params["type"]
    idempotency_key, unique_key = params["idempotency_key"], params["unique_key"]
    fingerprint = params["payload_fingerprint"]
    row = await job_store.insert(uow, params, admission=admission, key=key)
    if row is None:  # one row for any tenant name, none for a key revoked or expired since
        raise InvalidApiKey()
    limit = RateLimit(float(row["rate"]), int(row["burst"]))
    headers = rate_headers(limit, seconds_of(row["rate_tat"]), row["now"].timestamp())
    if row["id"] is not None:
        joined = bool(row.get("joined"))
        replayed = row.get("replayed_fingerprint")
        if replayed is not None:
            # A retry of a request that joined this job: answered as it was, or refused
            # when the key came with another request.
            if replayed not in (fingerprint, legacy_fingerprint(legacy)):
                raise IdempotencyConflict(
                    f"idempotency key already used for job {row['id']} with a different request"
                )
            return EnqueueResult(
                tenant,
                row["id"],
                JobStatus(row["joined_status"]),
                row["created_at"],
                True,
                headers,
                joined=True,
            )
        running = row.get("running_job_id")
        if cancel and running is not None:
            # The existing cancel path's request to a running job: fenced on its status,
            # with its event and the workers' NOTIFY.
            await job_store.request_cancel(uow, {"id": running, "channel": CANCEL_CHANNEL})
        # A new job is pending (the column's default): the statement does not return it.
        status = JobStatus(row["joined_status"]) if joined else JobStatus.PENDING
        return EnqueueResult(
            tenant, row["id"], status, row["created_at"], False, headers, joined=joined
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
