"""Job use cases: cancel (a tenant's job, or any job for operators), retry, list and show.

Cancel is the same function for `POST /jobs/{id}/cancel` and `jobcore jobs cancel`. Retry
never revives a finished job (terminal states are final, docs/design.md): it enqueues a copy
with the same type, payload and entity. What operators do (cancel any job, retry,
republish) is audited (:mod:`jobcore.access.audit`); a tenant cancelling its own job is not an
admin action.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from jobcore.access.audit import AuditAction, Entry, Target, audited, check_actor, record
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, Session, UnitOfWork
from jobcore.database.store import (
    CANCEL_CHANNEL,
    CompletionParams,
    JobListAllTenantsParams,
    job_store,
)
from jobcore.execution.completion_webhooks import completion_params
from jobcore.execution.registry import Registry
from jobcore.kernel.errors import JobNotBlocking, JobNotCancellable, JobNotFound, JobNotRetryable
from jobcore.kernel.settings import Settings
from jobcore.kernel.states import JobStatus, check_transition, is_terminal
from jobcore.maintenance.stranded import Republished, republish_stale
from jobcore.storage.objectstore import open_result_store
from jobcore.usecases.batches import retried_member
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue
from jobcore.usecases.whereabouts import with_where


@dataclass(frozen=True, slots=True)
class CancelOutcome:
    job_id: uuid.UUID
    status: JobStatus
    cancel_requested_at: datetime | None

    @property
    def requested(self) -> bool:
        """The worker was asked to stop the job (it was running)."""
        return self.status is JobStatus.RUNNING


async def cancel_job(
    uow: UnitOfWork, tenant: str, job_id: uuid.UUID, *, completion: CompletionParams
) -> CancelOutcome:
    """Pending → cancelled now; running → cancel requested (and the workers told).

    The row is locked first, so the status decided on is the status changed; the caller
    commits (the NOTIFY is delivered on commit). ``completion``: the parameters of the
    completion webhook a cancelled job records
    (:func:`jobcore.execution.completion_webhooks.completion_params`).
    """
    locked = await job_store.lock_for_cancel(uow, {"id": job_id, "tenant": tenant})
    if locked is None:
        raise JobNotFound("no job with that id")
    status = JobStatus(locked["status"])
    if is_terminal(status):
        raise JobNotCancellable(status.value)
    check_transition(status, JobStatus.CANCELLED)
    if status is JobStatus.PENDING:
        row = await job_store.cancel_pending(uow, {**completion, "id": job_id})
    else:
        row = await job_store.request_cancel(uow, {"id": job_id, "channel": CANCEL_CHANNEL})
    # The lock held the status still, so the fenced UPDATE found the row.
    assert row is not None, f"job {job_id} changed status under its row lock"
    return CancelOutcome(row["id"], JobStatus(row["status"]), row["cancel_requested_at"])


async def find_job(session: Session, job_id: uuid.UUID) -> dict[str, Any]:
    """Everything the database knows about one job, whatever its tenant (operators)."""
    row = await job_store.get_any_tenant(session, {"id": job_id})
    if row is None:
        raise JobNotFound(f"no job {job_id}")
    return dict(row)


async def show_job(db: Database, job_id: uuid.UUID) -> dict[str, Any]:
    """The job and, as ``where``, where it is now
    (:func:`jobcore.usecases.whereabouts.whereabouts`)."""
    async with db.unit_of_work() as uow:
        return with_where(await find_job(uow, job_id))


@dataclass(frozen=True, slots=True)
class AdminJobFilter:
    tenant: str | None = None
    status: JobStatus | None = None
    type: str | None = None


async def list_jobs(db: Database, where: AdminJobFilter, *, limit: int) -> list[dict[str, Any]]:
    """The newest jobs of every tenant, newest first (operators)."""
    params: JobListAllTenantsParams = {
        "tenant": where.tenant,
        "status": where.status.value if where.status else None,
        "type": where.type,
        "limit": limit,
    }
    async with db.unit_of_work() as uow:
        return [dict(r) for r in await job_store.list_all_tenants(uow, params)]


async def cancel_any_job(
    db: Database, settings: Settings, job_id: uuid.UUID, *, actor: str
) -> CancelOutcome:
    """:func:`cancel_job` for operators: whatever the job's tenant, committed and audited."""
    topology = Topology.from_settings(settings)
    target = Target("job", str(job_id))
    async with audited(db, actor=actor, action=AuditAction.JOB_CANCEL, target=target) as work:
        tenant = (await find_job(work.uow, job_id))["tenant"]
        work.entry.tenant = tenant
        outcome = await cancel_job(
            work.uow, tenant, job_id, completion=completion_params(topology, settings)
        )
        work.entry.details = {"status": outcome.status.value}
        await work.commit()
    return outcome


@dataclass(frozen=True, slots=True)
class RetryOutcome:
    retried: uuid.UUID
    job_id: uuid.UUID
    status: JobStatus


async def retry_job(
    db: Database, settings: Settings, registry: Registry, job_id: uuid.UUID, *, actor: str
) -> RetryOutcome:
    """Enqueue a copy of a failed or cancelled job (same type, payload, entity and unique
    key)."""
    topology = Topology.from_settings(settings)
    target = Target("job", str(job_id))
    async with audited(db, actor=actor, action=AuditAction.JOB_RETRY, target=target) as work:
        job = await find_job(work.uow, job_id)
        work.entry.tenant = job["tenant"]
        if job["status"] not in (JobStatus.FAILED, JobStatus.CANCELLED):
            raise JobNotRetryable(f"job {job_id} is {job['status']}; only failed or cancelled jobs")
        if job.get("workflow_id") is not None:
            # A copy would stand outside the workflow, and its dependents would never see it.
            raise JobNotRetryable(
                f"job {job_id} is a job of workflow {job['workflow_id']}: retry it through the "
                "workflow (`jobcore workflows retry`, POST /workflows/{id}/jobs/{name}/retry)"
            )
        job_type = registry.get(job["type"])
        # In an ordering key the copy takes the job's place while the job still blocks the
        # key (the jobs after it then wait for the copy), else it goes to the back of the
        # key as if newly enqueued: a later job of the key may be running, and the copy
        # must not run beside it.
        place = None
        if job["ordering_key"] is not None:
            place = await job_store.ordering_take_place(work.uow, {"id": job_id})
        raw_payload = job["payload"]
        store = None
        if job.get("payload_ref"):
            # Stored by reference: read back, and stored again under the copy's own id
            # (the original's object goes when the original is pruned).
            store = open_result_store(settings)
            raw_payload = orjson.loads(await asyncio.to_thread(store.get, job["payload_ref"]))
        # A member of a batch: the copy takes its place there (the batch counts the
        # place unsettled again, so its on_success can still fire).
        batch_id = await retried_member(work.uow, job_id)
        request = EnqueueRequest(
            tenant=job["tenant"],
            job_type=job_type,
            # By the model's own rules, not an enqueue's strict ones: the payload was
            # accepted once, maybe before payloads were strict, and a copy must not fail it.
            payload=job_type.validate_payload(raw_payload),
            entity_id=job["entity_id"],
            max_attempts=job["max_attempts"],
            # The copy takes the original's key: while another live job holds it, the
            # retry is refused (UniqueJobExists) like any duplicate. An empty key came from
            # the payload's unique field (which the request check never sees as given), and
            # comes from it again.
            unique_key=job["unique_key"] or None,
            origin={"retry_of": str(job_id)},
            ordering_key=job["ordering_key"],
            ordering_seq=None if place is None else place["ordering_seq"],
            batch_id=batch_id,
        )
        result = await enqueue(
            work.uow,
            topology,
            request,
            payload_store=store,
            inline_payload_max_bytes=settings.inline_payload_max_bytes,
        )
        work.entry.details = {"new_job_id": result.job_id, "type": job["type"]}
        if job["ordering_key"] is not None:
            work.entry.details["ordering"] = "in its place" if place else "at the back"
        await work.commit()
    return RetryOutcome(job_id, result.job_id, result.status)


async def unblock_job(db: Database, job_id: uuid.UUID, *, actor: str) -> dict[str, Any]:
    """Let the later jobs of a failed job's ordering key go on without running it again
    (a retry runs it again in its place instead)."""
    target = Target("job", str(job_id))
    async with audited(db, actor=actor, action=AuditAction.JOB_UNBLOCK, target=target) as work:
        job = await find_job(work.uow, job_id)
        work.entry.tenant = job["tenant"]
        row = await job_store.ordering_unblock(work.uow, {"id": job_id})
        if row is None:
            raise JobNotBlocking(
                f"job {job_id} is {job['status']}"
                + ("" if job["ordering_key"] else " and has no ordering key")
                + "; only a failed job of an ordering key blocks it"
            )
        work.entry.details = {"ordering_key": row["ordering_key"]}
        await work.commit()
    return {"job_id": job_id, "ordering_key": row["ordering_key"], "blocks": False}


async def held_jobs(db: Database) -> list[dict[str, Any]]:
    """How many pending jobs wait on a gate, per reason and type."""
    async with db.session() as session:
        return [dict(row) for row in await job_store.held_count(session)]


# Job ids an audit entry of a republish lists; the count covers the rest.
AUDITED_JOB_IDS = 100


async def republish_stale_jobs(
    db: Database, topology: Topology, *, stale_after: float, actor: str, batch_size: int = 500
) -> list[Republished]:
    """Republish every stale pending job now
    (:func:`jobcore.maintenance.stranded.republish_stale`), a batch per transaction, for
    operators who need not wait for the sweeper's next round (no lease: locked rows are
    skipped). Each batch that republished jobs is audited in
    its own transaction; a run that found none records one entry saying so."""
    check_actor(actor)
    republished: list[Republished] = []
    while True:
        async with db.unit_of_work() as uow:
            taken, batch = await republish_stale(
                uow, topology, stale_after=stale_after, limit=batch_size
            )
            last = taken < batch_size
            if batch or (last and not republished):
                entry = Entry(actor, AuditAction.JOBS_REPUBLISH_STALE, Target("jobs"))
                entry.details = {
                    "stale_after_seconds": stale_after,
                    "jobs": len(batch),
                    "job_ids": [r.job_id for r in batch[:AUDITED_JOB_IDS]],
                }
                await record(uow, entry)
            await uow.commit()
        republished.extend(batch)
        if last:
            return republished
