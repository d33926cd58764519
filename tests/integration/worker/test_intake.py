"""Intake (services.worker.intake): the workers' consumer priorities send a trickle of jobs
to one worker, and a worker whose every slot has run a handler for a moment (0.1 s) takes
no more deliveries, so new jobs go to a worker that can start them instead of waiting
behind long ones."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import GatePayload
from tests.integration.worker.support import OutboxPump, job_row, relayed, status_is, submit


@pytest.fixture
def wsettings(wsettings: Settings) -> Settings:
    """Deliveries only: consumer priorities and intake are the broker's path."""
    return relayed(wsettings)


TRICKLE = 12


async def _succeeded_on(db: Database, job_id: uuid.UUID) -> str:
    row = await eventually(lambda: status_is(db, job_id, "succeeded"), what="the job to succeed")
    return str(row["worker_id"])


async def test_a_trickle_of_jobs_goes_to_the_worker_of_highest_priority(
    db: Database,
    topology: Topology,
    wsettings: Settings,
    pump: OutboxPump,
    start_worker: StartWorker,
) -> None:
    low = await start_worker(
        wsettings.model_copy(update={"worker_consumer_priority": 10}), queues=["testq"]
    )
    high = await start_worker(
        wsettings.model_copy(update={"worker_consumer_priority": 20}), queues=["testq"]
    )
    ran_on = set()
    for _ in range(TRICKLE):  # one at a time: each is the queue's only message
        job_id = await submit(db, topology, "wt_gate", GatePayload())
        ran_on.add(await _succeeded_on(db, job_id))
    assert ran_on == {high.consumer.worker_id}, (low.consumer.worker_id, ran_on)


async def test_a_worker_whose_every_slot_runs_a_handler_leaves_new_jobs_to_another(
    db: Database,
    topology: Topology,
    wsettings: Settings,
    pump: OutboxPump,
    start_worker: StartWorker,
    tmp_path: Path,
) -> None:
    high = await start_worker(
        wsettings.model_copy(update={"worker_consumer_priority": 20}),
        queues=["testq"],
        concurrency=1,
    )
    low = await start_worker(
        wsettings.model_copy(update={"worker_consumer_priority": 10}), queues=["testq"]
    )
    gate = tmp_path / "gate"
    blocked = await submit(db, topology, "wt_gate", GatePayload(gate=str(gate)))
    row = await eventually(lambda: status_is(db, blocked, "running"), what="the blocker to run")
    assert row["worker_id"] == high.consumer.worker_id
    await eventually(lambda: _paused(high.consumer.intake.pauses), what="the worker to pause")

    # The high worker's one slot is busy: each of these runs on the other, at once.
    for _ in range(3):
        job_id = await submit(db, topology, "wt_gate", GatePayload())
        assert await _succeeded_on(db, job_id) == low.consumer.worker_id
    assert (await job_row(db, blocked))["status"] == "running"

    gate.touch()
    assert await _succeeded_on(db, blocked) == high.consumer.worker_id
    # Its slot free again, it consumes again and takes the trickle back.
    await eventually(lambda: _consuming(high.consumer.broker.consuming), what="a resume")
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    assert await _succeeded_on(db, job_id) == high.consumer.worker_id


async def _paused(pauses: int) -> bool:
    return pauses >= 1


async def _consuming(consuming: bool) -> bool:
    return consuming
