"""SIGTERM: stop consuming, let handlers finish within the grace period, else give leases back."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.kernel.envelope import decode
from jobcore.kernel.settings import Settings
from jobcore.testing.processes import jobcore_process
from jobcore.testing.waiting import eventually
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import GatePayload
from tests.integration.worker.support import (
    PROCESS_START,
    OutboxPump,
    PublishedRow,
    effects,
    exited,
    job_row,
    log_has,
    relayed,
    status_is,
    submit,
    worker_env,
)


async def test_sigterm_lets_a_running_handler_finish_within_the_grace_period(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    wsettings: Settings,
    tmp_path: Path,
) -> None:
    settings = wsettings.model_copy(update={"shutdown_grace": 20.0})
    gate, log = tmp_path / "gate", tmp_path / "worker.log"
    args = ("worker", "--queue", "testq", "--concurrency", "2")
    with jobcore_process(settings, *args, log_path=log, **worker_env(settings)) as proc:
        await eventually(
            log_has(log, "worker consuming"), what="the worker to consume", timeout=PROCESS_START
        )
        assert '"queues":["testq"]' in log.read_text()
        job_id = await submit(db, topology, "wt_gate", GatePayload(gate=str(gate)))
        await eventually(lambda: status_is(db, job_id, "running"), what="the job to run")

        proc.send_signal(signal.SIGTERM)
        await eventually(log_has(log, "worker stopping"), what="the worker to stop consuming")
        assert proc.poll() is None  # still waiting for the handler
        gate.touch()
        await eventually(exited(proc), what="the worker to exit", timeout=20)

    assert proc.returncode == 0, log.read_text()
    row = await job_row(db, job_id)
    assert (row["status"], row["attempts"]) == ("succeeded", 1)
    assert len(await effects(db, job_id)) == 1


async def test_sigterm_gives_back_the_lease_of_a_handler_that_outlives_the_grace_period(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    wsettings: Settings,
    start_worker: StartWorker,
    tmp_path: Path,
) -> None:
    # Relayed: the test reads both of the job's messages from its pump.
    settings = relayed(wsettings).model_copy(update={"shutdown_grace": 0.5})
    gate, log = tmp_path / "gate", tmp_path / "worker.log"
    with jobcore_process(settings, "worker", log_path=log, **worker_env(settings)) as proc:
        await eventually(
            log_has(log, "worker consuming"), what="the worker to consume", timeout=PROCESS_START
        )
        job_id = await submit(db, topology, "wt_gate", GatePayload(gate=str(gate)))
        await eventually(lambda: status_is(db, job_id, "running"), what="the job to run")

        proc.send_signal(signal.SIGTERM)
        await eventually(exited(proc), what="the worker to exit", timeout=20)

    assert proc.returncode == 0, log.read_text()
    assert "gave the job's lease back at shutdown" in log.read_text()
    row = await job_row(db, job_id)
    # The interrupted attempt does not count; a new message for it is on its way.
    assert (row["status"], row["attempts"], row["lease_expires_at"]) == ("pending", 0, None)
    messages = await eventually(
        lambda: _messages_for(pump, job_id, 2), what="the released job's new message"
    )
    assert [decode(m.body).attempt for m in messages] == [1, 1]
    assert messages[0].message_id != messages[1].message_id
    assert await effects(db, job_id) == []

    # Another worker resumes it at once (no lease to wait out).
    await start_worker()
    gate.touch()
    row = await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")
    assert row["attempts"] == 1
    assert len(await effects(db, job_id)) == 1


async def _messages_for(
    pump: OutboxPump, job_id: uuid.UUID, count: int
) -> list[PublishedRow] | None:
    found = [m for m in pump.published if m.job_id == job_id]
    return found if len(found) >= count else None
