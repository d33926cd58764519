"""Batches: jobs (and child batches) grouped so that callbacks fire once when the group's
outcome is known (docs/how-to/batches.md).

Create a batch with its members and callbacks, add members while it is open, close it,
read it, cancel it. Members are written by the enqueue use case's own path
(:func:`jobcore.usecases.enqueue.submit.enqueue_many`: the same checks, quotas, columns and
outbox messages as ``POST /jobs/{type}/batch``), in the transaction that counts them into
the batch under its row lock. What happens when a member ends is not here: the
``batch_members_settled`` trigger counts it in the transaction of its outcome and fires the
callbacks (jobcore.database.sql.batches, migrations 0032 and 0037). An open batch left idle
is closed by the pruner (jobcore.maintenance.retention, ``JOBCORE_BATCH_OPEN_TIMEOUT``).

A callback is prepared at creation as the enqueue statement would write its job (type,
queue, priority, attempts, gates, outbox routing), so the trigger can write it without the
registry. Its payload is the one given, with the batch's outcome under ``"batch"``; the
job type's payload model must accept that field (checked at creation with a sample).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from psycopg.types.json import Jsonb

from jobcore.access.audit import AuditAction, Entry, Target, record_done
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, UnitOfWork
from jobcore.database.store import CANCEL_CHANNEL, batch_store
from jobcore.execution.completion_webhooks import completion_params
from jobcore.execution.payloads import validate_payload
from jobcore.execution.registry import InvalidPayloadError, JobType
from jobcore.kernel.batches import FAILED_IDS_LISTED, BatchOutcome
from jobcore.kernel.errors import (
    BatchClosed,
    BatchIdTaken,
    BatchJobKeyTaken,
    BatchNotFound,
    InvalidField,
    JobcoreError,
)
from jobcore.kernel.quotas import UNLIMITED, Quotas
from jobcore.kernel.settings import Settings
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue_many
from jobcore.usecases.enqueue.write_many import MAX_BATCH_ITEMS, ItemStatus
from jobcore.usecases.enqueue.write_one import job_gates

# The events a batch has callbacks for, by their names in the API.
CALLBACK_EVENTS = {"on_success": "success", "on_complete": "complete", "on_death": "death"}
# Pending members a cancel ends per transaction: each is counted into the batch's row,
# whose versions a transaction keeps until it commits.
CANCEL_CHUNK = 1000

# What a callback's payload carries under "batch", as a sample the job type must accept.
_SAMPLE_OUTCOME = BatchOutcome(
    id=uuid.UUID(int=0), event="complete", total=0, succeeded=0, failed=0, cancelled=0, pending=0
).model_dump(mode="json")


@dataclass(frozen=True, slots=True)
class Callback:
    """A callback's job: its type and the payload given (a JSON object, without "batch")."""

    job_type: JobType[Any]
    payload: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class BatchWritten:
    batch_id: uuid.UUID
    # The members' job ids, in the order given.
    job_ids: list[uuid.UUID]
    closed: bool
    # The batch existed already: this repeated an earlier request (its id and its
    # members' idempotency keys answered what that one wrote).
    replayed: bool = False


def prepared_callback(
    topology: Topology, tenant: str, event: str, callback: Callback
) -> dict[str, Any]:
    """The callback's job columns and outbox routing, as the trigger writes them; raises
    :class:`~jobcore.kernel.errors.InvalidField` when its payload is not one the type
    accepts with the batch's outcome in it."""
    if not isinstance(callback.payload, Mapping) or "batch" in callback.payload:
        raise InvalidField(
            event, "the payload is a JSON object without a 'batch' field", kind="value_error"
        )
    try:
        validate_payload(callback.job_type, {**callback.payload, "batch": _SAMPLE_OUTCOME})
    except (InvalidPayloadError, JobcoreError) as exc:
        raise InvalidField(
            event,
            f"the payload with the batch's outcome under 'batch' is invalid for "
            f"{callback.job_type.name}: {exc}",
            kind="value_error",
        ) from None
    job_type = callback.job_type
    gates = job_gates(job_type, tenant=tenant, payload=dict(callback.payload), ordering_key=None)
    return {
        "type": job_type.name,
        "queue": job_type.queue,
        "exchange": topology.jobs_exchange,
        "routing_key": topology.routing_key(job_type.queue),
        "priority": int(job_type.priority),
        "max_attempts": job_type.max_attempts,
        "payload": dict(callback.payload),
        "concurrency_key": gates["concurrency_key"],
        "concurrency_limit": gates["concurrency_limit"],
        "rate_key": gates["rate_key"],
        "rate_per_second": gates["rate_per_second"],
        "rate_burst": gates["rate_burst"],
        "ordering_blocks": gates["ordering_blocks"],
    }


async def create_batch(
    db: Database,
    topology: Topology,
    *,
    tenant: str,
    members: Sequence[EnqueueRequest] = (),
    callbacks: Mapping[str, Callback] | None = None,
    parent_id: uuid.UUID | None = None,
    description: str | None = None,
    close: bool = True,
    quotas: Quotas = UNLIMITED,
    batch_id: uuid.UUID | None = None,
) -> BatchWritten:
    """Create a batch with ``members`` (requests of ``tenant``) and ``callbacks`` (by
    :data:`CALLBACK_EVENTS` name), in one transaction: all of it or nothing. ``close``:
    sealed at once (its callbacks may fire), else open for :func:`add_members` until
    :func:`close_batch`. ``parent_id``: an open batch of the tenant this one joins as a
    member.

    ``batch_id`` (a new one unless given) makes a retry safe: when the tenant has a batch
    with that id already, the request is answered from it (``replayed``), its members
    matched by their idempotency keys, so a retry after an answer that was lost writes
    nothing twice. An id another tenant's batch holds is
    :class:`~jobcore.kernel.errors.BatchIdTaken`."""
    prepared: dict[str, Any] = {}
    for name, callback in (callbacks or {}).items():
        event = CALLBACK_EVENTS.get(name)
        if event is None:
            raise InvalidField(name, "not a batch callback", kind="value_error")
        prepared[event] = prepared_callback(topology, tenant, name, callback)
    batch_id = batch_id or uuid.uuid4()
    async with db.unit_of_work() as uow:
        if parent_id is not None:
            await _lock_open(uow, tenant, parent_id)
        created = await batch_store.insert(
            uow,
            {
                "id": batch_id,
                "tenant": tenant,
                "parent_id": parent_id,
                "description": description,
                "events": list(prepared),
                "specs": [Jsonb(spec) for spec in prepared.values()],
            },
        )
        if created:
            if parent_id is not None:
                await batch_store.grow(uow, {"id": parent_id, "members": 1})
        elif await batch_store.lock(uow, {"id": batch_id, "tenant": tenant}) is None:
            raise BatchIdTaken(f"batch id {batch_id} is taken")
        job_ids = await _write_members(uow, topology, tenant, batch_id, members, quotas)
        if close:
            await batch_store.close(uow, {"id": batch_id})
        await uow.commit()
    return BatchWritten(batch_id, job_ids, close, replayed=not created)


async def add_members(
    db: Database,
    topology: Topology,
    *,
    tenant: str,
    batch_id: uuid.UUID,
    members: Sequence[EnqueueRequest],
    close: bool = False,
    quotas: Quotas = UNLIMITED,
) -> BatchWritten:
    """Add ``members`` to an open batch of ``tenant`` (all of them or none), closing it
    after them if asked. :class:`~jobcore.kernel.errors.BatchClosed` once it is closed,
    unless every member is one it has already (matched by idempotency key: a retry)."""
    async with db.unit_of_work() as uow:
        if await batch_store.lock(uow, {"id": batch_id, "tenant": tenant}) is None:
            raise BatchNotFound(f"no batch {batch_id}")
        job_ids = await _write_members(uow, topology, tenant, batch_id, members, quotas)
        if close:
            await batch_store.close(uow, {"id": batch_id})
        await uow.commit()
    return BatchWritten(batch_id, job_ids, close)


async def close_batch(db: Database, *, tenant: str | None, batch_id: uuid.UUID) -> dict[str, Any]:
    """Close a batch (again: no change); its state after. ``tenant`` None: any batch."""
    async with db.unit_of_work() as uow:
        if await batch_store.lock(uow, {"id": batch_id, "tenant": tenant}) is None:
            raise BatchNotFound(f"no batch {batch_id}")
        await batch_store.close(uow, {"id": batch_id})
        await uow.commit()
    return await get_batch(db, tenant=tenant, batch_id=batch_id)


async def get_batch(db: Database, *, tenant: str | None, batch_id: uuid.UUID) -> dict[str, Any]:
    """A batch with its counts, callbacks fired and (up to :data:`FAILED_IDS_LISTED`) its
    failed members' ids."""
    async with db.session() as session:
        row = await batch_store.get(session, {"id": batch_id, "tenant": tenant})
        if row is None:
            raise BatchNotFound(f"no batch {batch_id}")
        failed = await batch_store.failed_jobs(
            session, {"id": batch_id, "limit": FAILED_IDS_LISTED}
        )
    return batch_view(row, [r["id"] for r in failed])


def batch_view(row: Mapping[str, Any], failed_job_ids: list[uuid.UUID]) -> dict[str, Any]:
    """A batch as its readers see it: the callbacks by their API names, what fired."""
    events = {event: name for name, event in CALLBACK_EVENTS.items()}
    callbacks = {events[event]: callback for event, callback in row["callbacks"].items()}
    if row["cancelled_at"] is not None:
        status = "cancelled"
    elif row["closed_at"] is None:
        status = "open"
    elif row["settled_at"] is None:
        status = "closed"
    else:
        status = "succeeded" if row["succeeded"] == row["total"] else "settled"
    return {
        "id": row["id"],
        "tenant": row["tenant"],
        "parent_id": row["parent_id"],
        "description": row["description"],
        "status": status,
        "total": row["total"],
        "pending": row["pending"],
        "succeeded": row["succeeded"],
        "failed": row["failed"],
        "cancelled": row["cancelled"],
        "failed_job_ids": failed_job_ids,
        "first_death_job_id": row["first_death_job_id"],
        "callbacks": callbacks,
        "created_at": row["created_at"],
        "closed_at": row["closed_at"],
        "settled_at": row["settled_at"],
        "cancelled_at": row["cancelled_at"],
    }


async def list_batches(db: Database, *, tenant: str | None, limit: int) -> list[dict[str, Any]]:
    """The newest batches (of a tenant, or of all), without their failed ids."""
    async with db.session() as session:
        if tenant is None:
            rows = await batch_store.list_newest_all(session, {"limit": limit})
        else:
            rows = await batch_store.list_newest(session, {"tenant": tenant, "limit": limit})
    return [batch_view(row, []) for row in rows]


async def cancel_batch(
    db: Database, *, tenant: str | None, batch_id: uuid.UUID, completion: Mapping[str, Any]
) -> dict[str, Any]:
    """Close and cancel a batch and its descendants: their pending members are cancelled,
    their running ones asked to stop (they end as their workers decide). ``completion``:
    the completion webhook's parameters
    (:func:`jobcore.execution.completion_webhooks.completion_params`).

    The batches are locked and closed first, in one transaction, deepest first (each before
    its parent, as members' outcomes lock them: the batch itself is read, not locked,
    before its descendants are), so nothing joins them after; the pending members are then
    cancelled :data:`CANCEL_CHUNK` at a time, each chunk its own transaction (every one is
    counted into its batch's row)."""
    async with db.unit_of_work() as uow:
        if await batch_store.get(uow, {"id": batch_id, "tenant": tenant}) is None:
            raise BatchNotFound(f"no batch {batch_id}")
        tree = [row["id"] for row in await batch_store.tree(uow, {"id": batch_id})]
        for member in tree:
            await batch_store.lock(uow, {"id": member, "tenant": None})
        await batch_store.mark_cancelled(uow, {"ids": tree})
        for member in tree:
            await batch_store.close(uow, {"id": member})
        await batch_store.request_cancel(uow, {"ids": tree, "channel": CANCEL_CHANNEL})
        await uow.commit()
    while True:
        async with db.unit_of_work() as uow:
            done = await batch_store.cancel_pending(
                uow,
                {
                    "ids": tree,
                    "limit": CANCEL_CHUNK,
                    "webhook_exchange": completion["webhook_exchange"],
                    "webhook_routing_key": completion["webhook_routing_key"],
                    "webhook_max_attempts": completion["webhook_max_attempts"],
                    "webhook_outbox_channel": completion["webhook_outbox_channel"],
                },
            )
            await uow.commit()
        if done < CANCEL_CHUNK:
            break
    return await get_batch(db, tenant=tenant, batch_id=batch_id)


async def close_any_batch(db: Database, batch_id: uuid.UUID, *, actor: str) -> dict[str, Any]:
    """:func:`close_batch` for operators: whatever its tenant, audited."""
    batch = await close_batch(db, tenant=None, batch_id=batch_id)
    target = Target("batch", str(batch_id))
    await record_done(db, Entry(actor, AuditAction.BATCH_CLOSE, target, tenant=batch["tenant"]))
    return batch


async def cancel_any_batch(
    db: Database, settings: Settings, batch_id: uuid.UUID, *, actor: str
) -> dict[str, Any]:
    """:func:`cancel_batch` for operators: whatever its tenant, audited."""
    completion = completion_params(Topology.from_settings(settings), settings)
    batch = await cancel_batch(db, tenant=None, batch_id=batch_id, completion=dict(completion))
    target = Target("batch", str(batch_id))
    entry = Entry(actor, AuditAction.BATCH_CANCEL, target, tenant=batch["tenant"])
    entry.details = {"cancelled": batch["cancelled"]}
    await record_done(db, entry)
    return batch


async def retried_member(uow: UnitOfWork, job_id: uuid.UUID) -> uuid.UUID | None:
    """Take a finished job out of its batch, for its retry to take its place: the batch's
    slot for it is unsettled again (the batch's on_success may still fire; a callback
    that fired never fires again). The batch, or None if the job is in none."""
    row = await batch_store.detach_member(uow, {"id": job_id})
    if row is None or row["batch_id"] is None:
        return None
    await batch_store.reopen_member(uow, {"batch_id": row["batch_id"], "status": row["status"]})
    batch_id: uuid.UUID = row["batch_id"]
    return batch_id


async def _lock_open(uow: UnitOfWork, tenant: str, batch_id: uuid.UUID) -> None:
    row = await batch_store.lock(uow, {"id": batch_id, "tenant": tenant})
    if row is None:
        raise BatchNotFound(f"no batch {batch_id}")
    if row["closed_at"] is not None:
        raise BatchClosed(f"batch {batch_id} is closed; no job may join it")


class MemberRefused(JobcoreError):
    """A member of the batch could not be enqueued; nothing was written."""

    def __init__(self, index: int, error: JobcoreError) -> None:
        self.index = index
        self.error = error
        super().__init__(f"member {index}: {error}")


async def _write_members(
    uow: UnitOfWork,
    topology: Topology,
    tenant: str,
    batch_id: uuid.UUID,
    members: Sequence[EnqueueRequest],
    quotas: Quotas,
) -> list[uuid.UUID]:
    """Enqueue ``members`` into the locked batch, by job type and callback URL, up to
    :data:`MAX_BATCH_ITEMS` per statement, and count the new ones into it (refused with
    :class:`~jobcore.kernel.errors.BatchClosed` if there are new ones and it is closed).
    A member whose idempotency key answers a job of this batch is that job (a retry of an
    earlier request); any other member not created (a key of a job outside the batch, a
    unique key taken, a quota) refuses the whole batch (:class:`MemberRefused`, naming
    it), the caller's transaction rolling back."""
    groups: dict[tuple[str, str | None], list[int]] = {}
    for n, request in enumerate(members):
        if request.tenant != tenant:
            raise ValueError("a batch's members are of its tenant")
        groups.setdefault((request.job_type.name, request.callback_url), []).append(n)
    job_ids: list[uuid.UUID | None] = [None] * len(members)
    created = 0
    replayed: dict[uuid.UUID, int] = {}
    for indexes in groups.values():
        for start in range(0, len(indexes), MAX_BATCH_ITEMS):
            chunk = indexes[start : start + MAX_BATCH_ITEMS]
            result = await enqueue_many(
                uow,
                topology,
                [replace(members[n], batch_id=batch_id) for n in chunk],
                quotas=quotas,
            )
            for n, outcome in zip(chunk, result.outcomes, strict=True):
                if outcome.status is ItemStatus.CREATED and outcome.job_id is not None:
                    created += 1
                elif outcome.status is ItemStatus.REPLAYED and outcome.job_id is not None:
                    replayed[outcome.job_id] = n
                else:
                    raise MemberRefused(
                        n,
                        outcome.error
                        or InvalidField("jobs", f"job {n} was not created", kind="value_error"),
                    )
                job_ids[n] = outcome.job_id
    if replayed:
        batches = await batch_store.jobs_of(uow, {"ids": list(replayed)})
        for job_id, n in replayed.items():
            if batches.get(job_id) != batch_id:
                raise MemberRefused(
                    n,
                    BatchJobKeyTaken(
                        f"idempotency key already used for job {job_id}, which is not a "
                        "member of this batch"
                    ),
                )
    if created and await batch_store.grow(uow, {"id": batch_id, "members": created}) is None:
        raise BatchClosed(f"batch {batch_id} is closed; no job may join it")
    return [job_id for job_id in job_ids if job_id is not None]
