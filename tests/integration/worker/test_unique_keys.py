"""A unique key is held while its job is pending or running and freed by every statement
that ends the job: the worker's outcomes (success, failure, cancellation, a retry or a
release of a job whose cancellation was requested), the reaper and the rescuer. A retry
or a release back to pending keeps it."""

from __future__ import annotations

import uuid

import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, execute, fetch_all
from jobcore.database.sql import Query
from jobcore.database.sql.jobs.run import JOB_END_RUNNING, JOB_RELEASE, JOB_RETRY, JOB_SUCCEED_MANY
from jobcore.execution.registry import default_registry
from jobcore.kernel.errors import UniqueJobExists
from jobcore.kernel.settings import Settings
from jobcore.kernel.states import TERMINAL, JobStatus
from jobcore.maintenance import Maintainer, Reaper, Rescuer
from jobcore.testing.jobtypes import EchoPayload, SyncPayload
from jobcore.testing.waiting import eventually
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue, enqueue_many
from jobcore.usecases.enqueue.write_many import ItemStatus
from services.worker.metrics import WorkerMetrics
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.support import (
    TAKE_OVER,
    OutboxPump,
    job_status,
    outcome_params,
    status_is,
)

KEY = "the-key"
# The lease token of the claim the running jobs are under.
TOKEN = uuid.uuid4()

CANCEL_REQUESTED = Query(
    "test_cancel_requested",
    "Note a cancel request on a running job, as POST /jobs/{id}/cancel would.",
    "UPDATE jobs SET cancel_requested_at = now() WHERE id = %(id)s",
)
EXPIRE = Query(
    "test_expire_lease",
    "Make a running job's lease expired, after `attempts` attempts.",
    """
    UPDATE jobs SET lease_expires_at = now() - interval '1 second', attempts = %(attempts)s
    WHERE id = %(id)s
    """,
)
QUARANTINE = Query(
    "test_quarantine_messages",
    "Quarantine a job's outbox rows as the relay would on an unpublishable message.",
    "UPDATE outbox SET quarantined_at = now(), last_error = 'malformed' WHERE job_id = %(id)s",
)


async def keyed_job(db: Database, topology: Topology, *, running: bool) -> uuid.UUID:
    """An echo job holding KEY, running under a lease (or still pending)."""
    async with db.unit_of_work() as uow:
        job = await enqueue(
            uow,
            topology,
            EnqueueRequest(
                tenant="t",
                job_type=default_registry.get("echo"),
                payload=EchoPayload(text="x"),
                unique_key=KEY,
            ),
        )
        if running:
            await execute(uow, TAKE_OVER({"id": job.job_id, "token": TOKEN}))
        await uow.commit()
    return job.job_id


async def key_is_free(db: Database, topology: Topology) -> bool:
    """Whether a new job may take KEY (it does, when it may)."""
    try:
        await keyed_job(db, topology, running=False)
    except UniqueJobExists:
        return False
    return True


@pytest.mark.parametrize(
    ("statement", "ends", "cancel_requested", "status"),
    [
        (JOB_SUCCEED_MANY, None, False, "succeeded"),
        (JOB_END_RUNNING, "failed", False, "failed"),
        (JOB_END_RUNNING, "cancelled", False, "cancelled"),
        (JOB_RETRY, None, True, "cancelled"),
        (JOB_RELEASE, None, True, "cancelled"),
        (JOB_RETRY, None, False, "pending"),
        (JOB_RELEASE, None, False, "pending"),
    ],
    ids=["succeed", "fail", "cancel", "retry-cancelled", "release-cancelled", "retry", "release"],
)
async def test_each_worker_outcome_frees_the_key_exactly_when_the_job_ends(
    db: Database,
    topology: Topology,
    settings: Settings,
    statement: Query,
    ends: str | None,
    cancel_requested: bool,
    status: str,
) -> None:
    job_id = await keyed_job(db, topology, running=True)
    assert not await key_is_free(db, topology)
    async with db.unit_of_work() as uow:
        if cancel_requested:
            await execute(uow, CANCEL_REQUESTED({"id": job_id}))
        params = outcome_params(statement, job_id, TOKEN, topology, settings, ends=ends or "failed")
        assert len(await fetch_all(uow, statement(params))) == 1
        await uow.commit()
    assert await job_status(db, job_id) == status
    assert await key_is_free(db, topology) is (JobStatus(status) in TERMINAL)


@pytest.mark.parametrize(
    ("attempts", "cancel_requested", "status"),
    [(3, False, "failed"), (1, True, "cancelled"), (1, False, "pending")],
)
async def test_the_reaper_frees_the_key_of_a_job_it_ends_and_keeps_a_retried_ones(
    db: Database,
    topology: Topology,
    settings: Settings,
    attempts: int,
    cancel_requested: bool,
    status: str,
) -> None:
    job_id = await keyed_job(db, topology, running=True)
    async with db.unit_of_work() as uow:
        await execute(uow, EXPIRE({"id": job_id, "attempts": attempts}))
        if cancel_requested:
            await execute(uow, CANCEL_REQUESTED({"id": job_id}))
        await uow.commit()
    reaper = Reaper.from_settings(settings, registry=default_registry, metrics=WorkerMetrics())
    assert (await Maintainer(db, [reaper], owner="a").tick())["reaper"] == 1
    assert await job_status(db, job_id) == status
    assert await key_is_free(db, topology) is (status != "pending")


async def test_the_rescuer_frees_the_key_of_a_job_whose_message_was_quarantined(
    db: Database, topology: Topology, settings: Settings
) -> None:
    job_id = await keyed_job(db, topology, running=False)
    async with db.unit_of_work() as uow:
        await execute(uow, QUARANTINE({"id": job_id}))
        await uow.commit()
    assert not await key_is_free(db, topology)
    rescuer = Rescuer.from_settings(settings, metrics=WorkerMetrics())
    assert (await Maintainer(db, [rescuer], owner="a").tick())["rescuer"] == 1
    assert await job_status(db, job_id) == "failed"
    assert await key_is_free(db, topology)


def test_the_index_holds_keys_in_every_status_but_the_terminal_ones() -> None:
    """A terminal status added to jobcore.kernel.states frees keys with no change here."""
    from jobcore.database.schema import jobs

    [index] = [i for i in jobs.indexes if i.name == "jobs_unique_uidx"]
    where = str(index.dialect_options["postgresql"]["where"])
    for status in JobStatus:
        assert (f"'{status.value}'" in where) is (status not in TERMINAL), (status, where)


async def test_a_batchs_jobs_run_like_any_and_their_keys_are_free_once_they_succeed(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker
) -> None:
    await start_worker()
    sync = default_registry.get("sync_account")
    items = [
        EnqueueRequest(tenant="t", job_type=sync, payload=SyncPayload(account=f"acct-{n}"))
        for n in range(40)
    ]
    async with db.unit_of_work() as uow:
        result = await enqueue_many(uow, topology, items)
        await uow.commit()
    assert result.count(ItemStatus.CREATED) == 40
    for outcome in result.outcomes:
        assert outcome.job_id is not None
        await eventually(
            lambda job_id=outcome.job_id: status_is(db, job_id, "succeeded"), what="success"
        )
    async with db.unit_of_work() as uow:
        again = await enqueue_many(uow, topology, items)
        await uow.commit()
    assert again.count(ItemStatus.CREATED) == 40
