"""Writing many jobs of one type at once: one multi-row insert for every item (the
requests come checked from :func:`jobcore.usecases.enqueue.submit.enqueue_many`).

The items that are written are written together (their jobs and outbox rows commit in
one transaction, the caller's); each item has its own outcome: created, replayed (its
idempotency key's job, same request), a unique conflict (a live job holds its unique
key), refused by a quota (the rate limit counts items; the cap of unfinished jobs), or
invalid (its idempotency key was used with another request). Items the caller found
invalid before (a payload that does not validate) never get here.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

import orjson
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from jobcore.access.apikeys import InvalidApiKey
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Session
from jobcore.database.store import JobInsertManyParams, Statement, job_store, tenant_store
from jobcore.execution.registry import JobType
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.envelope import JobMessage
from jobcore.kernel.errors import (
    IdempotencyConflict,
    JobcoreError,
    ServiceStateError,
    UniqueJobExists,
)
from jobcore.kernel.quotas import UNLIMITED, Quotas, RateLimit, rate_headers
from jobcore.kernel.states import JobStatus
from jobcore.telemetry.traces import capture_trace_headers
from jobcore.usecases.enqueue.write_one import (
    UNIQUE_KEY_TRIES,
    job_gates,
    quota_refusal,
    seconds_of,
)

# The most items one batch may hold (the API's limit, and what one statement is sized for).
MAX_BATCH_ITEMS = 1000


@dataclass(frozen=True, slots=True)
class BatchItem:
    """The columns of one job of a batch, from its
    :class:`~jobcore.usecases.enqueue.submit.EnqueueRequest`: ``payload`` is the validated
    payload as JSON, ``fingerprint`` the request's, ``unique_key`` the key the job holds,
    ``run_at`` when it is due."""

    payload: Any
    fingerprint: str
    idempotency_key: str | None = None
    unique_key: str | None = None
    entity_id: str | None = None
    max_attempts: int | None = None
    run_at: datetime | None = None
    # What a coalesced single enqueue (jobcore.usecases.enqueue.submit.enqueue_coalesced) has of its
    # own; a batch's items take the defaults. ``priority``: the job type's when None;
    # ``trace``: the trace context the batch was written in when None; ``event_detail``:
    # what the `accepted` event says besides run_at; ``legacy_replay``: an idempotency
    # key's job from before request fingerprints answers a replay (as a single enqueue's).
    priority: int | None = None
    callback_url: str | None = None
    trace: dict[str, str] | None = None
    event_detail: dict[str, Any] = field(default_factory=lambda: {"batch": True})
    legacy_replay: bool = False


class ItemStatus(StrEnum):
    CREATED = "created"
    REPLAYED = "replayed"
    # The job open to the item's debounce or throttle key answered it; nothing was written.
    JOINED = "joined"
    UNIQUE_CONFLICT = "unique_conflict"
    REFUSED = "refused"
    INVALID = "invalid"


@dataclass(frozen=True, slots=True)
class ItemOutcome:
    status: ItemStatus
    # The job written or replayed, or the one holding the unique key.
    job_id: uuid.UUID | None = None
    job_status: JobStatus | None = None
    # When the job written or replayed was accepted.
    created_at: datetime | None = None
    # Why the item was not written (UniqueJobExists, a QuotaExceeded, IdempotencyConflict).
    error: JobcoreError | None = None


@dataclass(frozen=True, slots=True)
class BatchResult:
    tenant: str
    outcomes: list[ItemOutcome]
    # RateLimit and RateLimit-Policy after the batch's turn (none: unlimited).
    rate_headers: dict[str, str] = field(default_factory=dict)
    # The tenant's rate limit, its theoretical arrival time after the batch's turn (epoch
    # seconds) and the statement's clock: for headers of each item's own turn.
    limit: RateLimit | None = None
    rate_tat: float | None = None
    now: float = 0.0

    def count(self, status: ItemStatus) -> int:
        return sum(1 for outcome in self.outcomes if outcome.status is status)


async def write_batch(
    uow: Session,
    topology: Topology,
    *,
    tenant: str,
    job_type: JobType[Any],
    items: Sequence[BatchItem],
    callback_url: str | None = None,
    quotas: Quotas = UNLIMITED,
    key_id: uuid.UUID | None = None,
    notify: bool = True,
    batch_id: uuid.UUID | None = None,
    commit: bool = False,
) -> BatchResult:
    """Write the batch's jobs and outbox messages through ``uow``, a unit of work the
    caller commits, in two statements (the tenant's usage row is locked first, so
    admissions of one tenant take turns as single enqueues do) and, when some items found
    their keys taken, one more to read the jobs that hold them. Outcomes are in the
    items' order.

    ``callback_url``: of the items that name none. ``key_id``: the API key the items came
    with, checked usable by the insert (:class:`~jobcore.access.apikeys.InvalidApiKey`, nothing
    written, when it is not). ``notify``: False when the caller wakes the relays itself
    after the commit (:mod:`jobcore.usecases.enqueue.wakeups`). ``batch_id``: the open
    batch every written job joins (the caller holds its row, jobcore.usecases.batches).

    ``commit``: ``uow`` ends with the batch (the caller commits right after). When no item
    has an idempotency or unique key, nothing can follow the insert (no item's key can be
    taken, so there are no holders to read or items to try again), and its COMMIT goes out
    with it, in the same round trip: a round trip less between the jobs' insert and the
    relays' NOTIFY (docs/bench/measurements.md, "Pickup at a steady rate")."""
    if not 1 <= len(items) <= MAX_BATCH_ITEMS:
        raise ValueError(f"a batch holds 1 to {MAX_BATCH_ITEMS} items")
    trace = capture_trace_headers()
    outcomes: list[ItemOutcome | None] = [None] * len(items)
    headers: dict[str, str] = {}
    todo = list(range(len(items)))
    # The usage row is locked by a statement of its own, sent with the first insert.
    lock: Statement | None = tenant_store.lock_usage_statement({"tenant": tenant})
    commit_with_insert = commit and all(
        item.idempotency_key is None and item.unique_key is None for item in items
    )
    # An item whose unique key's holder ended between the insert and the read is tried
    # again (as a single enqueue is).
    for _ in range(UNIQUE_KEY_TRIES):
        params = _insert_params(
            topology, tenant, job_type, items, todo, callback_url, quotas, trace, batch_id
        )
        params["key_id"], params["notify"] = key_id, notify
        rows = await job_store.insert_many(uow, params, behind=lock, commit=commit_with_insert)
        lock = None
        if not rows:  # the API key was revoked or expired since it was verified
            raise InvalidApiKey()
        limit = RateLimit(float(rows[0]["rate"]), int(rows[0]["burst"]))
        tat, now = seconds_of(rows[0]["rate_tat"]), rows[0]["now"].timestamp()
        headers = rate_headers(limit, tat, now)
        taken: list[int] = []
        for row in rows:
            n = row["n"]
            if row["id"] is not None:
                outcomes[n] = ItemOutcome(
                    ItemStatus.CREATED, row["id"], JobStatus(row["status"]), row["created_at"]
                )
            elif row["refusal"] is not None:
                outcomes[n] = ItemOutcome(
                    ItemStatus.REFUSED, error=quota_refusal(row, limit, headers)
                )
            else:
                taken.append(n)
        todo = await _answer_taken(uow, tenant, job_type, items, taken, outcomes)
        if not todo:
            break
    if todo:  # pragma: no cover - a key freed three times over within one batch
        raise ServiceStateError("the unique keys' holders kept changing; retry")
    return BatchResult(tenant, [o for o in outcomes if o is not None], headers, limit, tat, now)


def _insert_params(
    topology: Topology,
    tenant: str,
    job_type: JobType[Any],
    items: Sequence[BatchItem],
    todo: list[int],
    callback_url: str | None,
    quotas: Quotas,
    trace: dict[str, str],
    batch_id: uuid.UUID | None,
) -> JobInsertManyParams:
    ids = [uuid.uuid4() for _ in todo]
    chosen = [items[n] for n in todo]
    gates = [
        job_gates(job_type, tenant=tenant, payload=item.payload, ordering_key=None)
        for item in chosen
    ]
    limit, rate = job_type.concurrency, job_type.rate
    traces = [trace if item.trace is None else item.trace for item in chosen]
    type_priority = int(job_type.priority)
    return {
        "ns": todo,
        "ids": ids,
        "idempotency_keys": [item.idempotency_key for item in chosen],
        "fingerprints": [item.fingerprint for item in chosen],
        "payloads": [Jsonb(item.payload) for item in chosen],
        "entity_ids": [item.entity_id for item in chosen],
        "max_attempts": [item.max_attempts or job_type.max_attempts for item in chosen],
        "run_ats": [item.run_at for item in chosen],
        "unique_keys": [item.unique_key for item in chosen],
        # Each job's first message has the job's id (execution.job_messages.job_message_row).
        "message_ids": list(ids),
        "bodies": [
            JobMessage(job_id=job_id, attempt=1, type=job_type.name).encode() for job_id in ids
        ],
        "tenant": tenant,
        "type": job_type.name,
        "queue": job_type.queue,
        "priorities": [
            type_priority if item.priority is None else item.priority for item in chosen
        ],
        "concurrency_keys": [gate["concurrency_key"] for gate in gates],
        "concurrency_limit": None if limit is None else limit.n,
        "rate_keys": [gate["rate_key"] for gate in gates],
        "rate_per_second": None if rate is None else rate.per_second,
        "rate_burst": None if rate is None else rate.burst,
        "ordering_blocks": job_type.ordering == "block",
        "callback_urls": [item.callback_url or callback_url for item in chosen],
        "traceparents": [t.get("traceparent") for t in traces],
        "tracestates": [t.get("tracestate") for t in traces],
        "event_details": [Jsonb(item.event_detail) for item in chosen],
        "exchange": topology.jobs_exchange,
        "routing_key": topology.routing_key(job_type.queue),
        "headers": [Jsonb(t) for t in traces],
        "channel": OUTBOX_CHANNEL,
        "default_rate": quotas.enqueue_rate,
        "default_burst": quotas.enqueue_burst,
        "default_max_unfinished": quotas.max_unfinished,
        "default_max_long_polls": quotas.max_long_polls,
        "batch_id": batch_id,
        # The call's own (write_batch sets them).
        "key_id": None,
        "notify": True,
    }


async def _answer_taken(
    uow: Session,
    tenant: str,
    job_type: JobType[Any],
    items: Sequence[BatchItem],
    taken: list[int],
    outcomes: list[ItemOutcome | None],
) -> list[int]:
    """Answer the items whose keys were taken, from the jobs holding them (this
    statement's snapshot also sees jobs this batch wrote); the items whose unique key is
    free again, to try again."""
    if not taken:
        return []
    rows = await job_store.batch_holders(
        uow,
        {
            "ns": taken,
            "idempotency_keys": [items[n].idempotency_key for n in taken],
            "unique_keys": [items[n].unique_key for n in taken],
            "tenant": tenant,
            "type": job_type.name,
        },
    )
    again = []
    for row in rows:
        n = row["n"]
        outcome = _holder_outcome(row, items[n])
        if outcome is None:
            again.append(n)
        outcomes[n] = outcome
    return sorted(again)


def _holder_outcome(row: DictRow, item: BatchItem) -> ItemOutcome | None:
    # The idempotency key first: a replay is answered as a replay, as a single enqueue is.
    if row["keyed_id"] is not None:
        if row["payload_fingerprint"] != item.fingerprint and not (
            item.legacy_replay and row["payload_fingerprint"] == _legacy_fingerprint(item)
        ):
            error = IdempotencyConflict(
                f"idempotency key already used for job {row['keyed_id']} with a different request"
            )
            return ItemOutcome(ItemStatus.INVALID, error=error)
        return ItemOutcome(
            ItemStatus.REPLAYED,
            row["keyed_id"],
            JobStatus(row["keyed_status"]),
            row["keyed_created_at"],
        )
    if row["live_id"] is not None:
        held = UniqueJobExists(row["live_id"], row["live_status"])
        return ItemOutcome(
            ItemStatus.UNIQUE_CONFLICT, row["live_id"], JobStatus(row["live_status"]), error=held
        )
    return None


def _legacy_fingerprint(item: BatchItem) -> str:
    """:func:`jobcore.usecases.enqueue.write_one.legacy_fingerprint` of the item's payload (its
    JSON)."""
    canonical = orjson.dumps(item.payload, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()
