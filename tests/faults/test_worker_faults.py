"""Worker faults with real processes: a worker killed mid-handler, a broker restart between
retries. The side-effect ledger (``job_effects``, written in the success transaction)
must show each job's effect exactly once."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aio_pika
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.chaos import broker_stopped, postgres_stopped
from jobcore.testing.processes import jobcore_process
from jobcore.testing.waiting import eventually
from tests.integration.worker.jobtypes import GatePayload
from tests.integration.worker.support import (
    PROCESS_START,
    OutboxPump,
    effects,
    job_row,
    log_has,
    outbox_rows,
    running_pump,
    status_is,
    submit,
    worker_env,
    worker_settings,
)


@pytest.fixture
def wsettings(settings: Settings) -> Settings:
    return worker_settings(settings)


@pytest.fixture
async def outbox_pump(
    wsettings: Settings, db: Database, topology: Topology
) -> AsyncIterator[OutboxPump]:
    pump = OutboxPump(wsettings, db)
    try:
        yield pump
    finally:
        await pump.close()
        with contextlib.suppress(Exception):
            connection = await aio_pika.connect(wsettings.amqp_url, timeout=5)
            async with connection:
                await topology.delete(await connection.channel(), default_registry.queues())


async def test_a_job_whose_worker_was_killed_is_reaped_and_succeeds_once(
    db: Database,
    topology: Topology,
    outbox_pump: OutboxPump,
    wsettings: Settings,
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    env = worker_env(wsettings)
    async with running_pump(outbox_pump):
        with jobcore_process(wsettings, "worker", log_path=tmp_path / "a.log", **env) as first:
            await eventually(
                log_has(tmp_path / "a.log", "worker consuming"),
                what="worker a",
                timeout=PROCESS_START,
            )
            job_id = await submit(db, topology, "wt_gate", GatePayload(gate=str(gate)))
            running = await eventually(lambda: status_is(db, job_id, "running"), what="a claim")
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
        gate.touch()  # whoever runs the job next finds its gate open

        with jobcore_process(wsettings, "worker", log_path=tmp_path / "b.log", **env):
            row = await eventually(
                lambda: status_is(db, job_id, "succeeded"), what="reaped job to succeed", timeout=30
            )

    assert row["attempts"] == 2
    assert row["last_error"] == "lease expired"
    assert row["worker_id"] != running["worker_id"]
    ledger = await effects(db, job_id)
    assert [(e["kind"], e["attempt"]) for e in ledger] == [("completed", 2)]
    assert "lease expired; job returned to pending" in (tmp_path / "b.log").read_text()


@pytest.mark.serial
async def test_a_retry_waits_in_the_outbox_while_the_broker_is_down(
    db: Database,
    topology: Topology,
    outbox_pump: OutboxPump,
    wsettings: Settings,
    tmp_path: Path,
) -> None:
    log = tmp_path / "worker.log"
    with jobcore_process(wsettings, "worker", log_path=log, **worker_env(wsettings)) as proc:
        await eventually(
            log_has(log, "worker consuming"), what="the worker to consume", timeout=PROCESS_START
        )
        job_id = await submit(db, topology, "wt_gate", GatePayload(fail_times=1))
        await outbox_pump.drain()  # attempt 1, which fails

        async def retry_waiting() -> bool:
            row = await job_row(db, job_id)
            return row["status"] == "pending" and len(await outbox_rows(db, job_id)) == 1

        await eventually(retry_waiting, what="the retry to be written to the outbox")
        await outbox_pump.close()

        with broker_stopped():
            with pytest.raises(Exception):  # noqa: B017, PT011 - whatever the client raises
                await outbox_pump.drain()
            # The retry is still in the outbox, and the job still pending, not lost.
            [retry] = await outbox_rows(db, job_id)
            assert (await job_row(db, job_id))["status"] == "pending"
            assert proc.poll() is None

        async with running_pump(outbox_pump):
            row = await eventually(
                lambda: status_is(db, job_id, "succeeded"),
                what="the retry to run after the broker came back",
                timeout=60,
            )
        assert proc.poll() is None

    assert row["attempts"] == 2
    assert [m.message_id for m in outbox_pump.published][-1] == retry["message_id"]
    assert [(e["kind"], e["attempt"]) for e in await effects(db, job_id)] == [("completed", 2)]


@pytest.mark.serial
async def test_a_delivery_that_arrives_while_postgresql_is_down_runs_once_it_is_back(
    db: Database,
    topology: Topology,
    outbox_pump: OutboxPump,
    wsettings: Settings,
    tmp_path: Path,
) -> None:
    log = tmp_path / "worker.log"
    with jobcore_process(wsettings, "worker", log_path=log, **worker_env(wsettings)) as proc:
        await eventually(
            log_has(log, "worker consuming"), what="the worker to consume", timeout=PROCESS_START
        )
        before = await submit(db, topology, "wt_gate", GatePayload())
        await outbox_pump.drain()
        await eventually(lambda: status_is(db, before, "succeeded"), what="a job before")
        during = await submit(db, topology, "wt_gate", GatePayload())
        [message] = await outbox_rows(db, during)

        with postgres_stopped():
            # The relay could not read the outbox now; publish the row it read before.
            await outbox_pump.publish(message)
            # The claim first waits db_connect_timeout for the pool to find a connection.
            await eventually(
                log_has(log, "holding the delivery until it is back"),
                what="the worker to hold the delivery",
                timeout=3 * wsettings.db_connect_timeout + 10,
            )
            assert proc.poll() is None

        row = await eventually(
            lambda: status_is(db, during, "succeeded"),
            what="the held delivery to run",
            timeout=30,
        )
        after = await submit(db, topology, "wt_gate", GatePayload())
        await outbox_pump.drain()  # publishes the rows of `during` (again) and `after`
        await eventually(lambda: status_is(db, after, "succeeded"), what="a job after")
        assert proc.poll() is None

    assert row["attempts"] == 1
    for job_id in (before, during, after):
        assert len(await effects(db, job_id)) == 1
