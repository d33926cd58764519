"""The rescuer: a pending job whose message the relay quarantined fails, with its reason.

Without it such a job would stay ``pending`` forever: no worker ever receives its
message. It ends like any terminal status (completion webhook, long-poll wake-up), and
requeueing the quarantined row is refused once the job has ended.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid

import psycopg

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, execute
from jobcore.database.sql import Query
from jobcore.database.sql.webhook_deliveries import JOB_DONE_CHANNEL, WEBHOOK_MESSAGE_TYPE
from jobcore.kernel.settings import Settings
from jobcore.maintenance import Rescuer
from jobcore.testing.processes import jobcore_command, settings_env
from jobcore.testing.waiting import eventually
from services.worker.metrics import WorkerMetrics
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import GatePayload
from tests.integration.worker.support import (
    TAKE_OVER,
    Maintenance,
    job_row,
    outbox_rows,
    status_is,
    submit,
)

# Only a message that can never be published is quarantined (a refusal for now, such as
# a return for no route, is retried until the broker takes it).
RELAY_ERROR = "malformed: cannot encode: n error: Unsupported numeric value: 1180591620717411303424"

# What the relay does to a row whose message can never be published (jobcore.database.sql.outbox).
QUARANTINE = Query(
    "test_quarantine",
    "Quarantine a job's outbox rows as the relay would on an unpublishable message.",
    """
    UPDATE outbox SET quarantined_at = now(), attempts = 1, failing_since = now(),
                      last_error = %(error)s
    WHERE job_id = %(id)s
    """,
)
# Another live message for the job (as an operator's requeue or a reaper would leave).
SECOND_MESSAGE = Query(
    "test_second_message",
    "Copy a job's message into a new, unquarantined outbox row.",
    """
    INSERT INTO outbox (message_id, exchange, routing_key, message_type, headers, body, job_id)
    SELECT gen_random_uuid(), exchange, routing_key, message_type, headers, body, job_id
    FROM outbox WHERE job_id = %(id)s
    LIMIT 1
    """,
)


async def test_a_pending_job_whose_message_was_quarantined_fails_with_its_webhook(
    db: Database, topology: Topology, wsettings: Settings
) -> None:
    stuck = await submit(db, topology, "wt_gate", GatePayload(), callback_url="https://h.test/")
    with_live_message = await submit(db, topology, "wt_gate", GatePayload())
    running = await submit(db, topology, "wt_gate", GatePayload())
    async with db.unit_of_work() as uow:
        for job_id in (stuck, with_live_message, running):
            await execute(uow, QUARANTINE({"id": job_id, "error": RELAY_ERROR}))
        await execute(uow, SECOND_MESSAGE({"id": with_live_message}))
        await execute(uow, TAKE_OVER({"id": running, "token": uuid.uuid4()}))
        await uow.commit()

    rescuer = Maintenance(db, "a", Rescuer.from_settings(wsettings, metrics=WorkerMetrics()))
    other = Maintenance(db, "b", Rescuer.from_settings(wsettings, metrics=WorkerMetrics()))
    listener = await psycopg.AsyncConnection.connect(wsettings.database_url, autocommit=True)
    try:
        await listener.execute(f"LISTEN {JOB_DONE_CHANNEL}")
        assert await rescuer.round() == 1
        notify = await asyncio.wait_for(anext(listener.notifies()), timeout=5)
    finally:
        await listener.close()
    assert await other.round() == 0  # one leader at a time
    assert not other.is_leader
    assert await rescuer.round() == 0  # nothing left

    row = await job_row(db, stuck)
    assert row["status"] == "failed"
    assert row["last_error"] == f"outbox row quarantined: {RELAY_ERROR}"
    assert row["finished_at"] is not None
    assert (notify.channel, notify.payload) == (JOB_DONE_CHANNEL, str(stuck))
    async with db.connection() as conn:
        cur = await conn.execute("SELECT event FROM webhook_deliveries WHERE job_id = %s", (stuck,))
        assert [r["event"] for r in await cur.fetchall()] == ["job.failed"]
    messages = await outbox_rows(db, stuck)
    assert sorted(m["message_type"] for m in messages) == sorted(["wt_gate", WEBHOOK_MESSAGE_TYPE])
    [service] = rescuer.services
    assert service.metrics.counts["rescued.quarantined"] == 1  # type: ignore[attr-defined]

    # A job that still has a live message, or that some worker already runs, is left alone.
    assert (await job_row(db, with_live_message))["status"] == "pending"
    assert (await job_row(db, running))["status"] == "running"

    # Requeueing the quarantined message of the failed job is refused, saying what to do.
    [quarantined] = [m for m in messages if m["message_type"] == "wt_gate"]
    refused = _outbox_cli(wsettings, "requeue", str(quarantined["id"]))
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1
    assert f"is the message of job {stuck}, which is failed" in refused.stderr
    assert f"jobcore jobs retry {stuck}" in refused.stderr
    assert [m["quarantined_at"] is not None for m in await outbox_rows(db, stuck)].count(True) == 1


async def test_a_quarantined_pending_jobs_message_is_requeued_while_the_job_waits(
    db: Database, topology: Topology, wsettings: Settings
) -> None:
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    async with db.unit_of_work() as uow:
        await execute(uow, QUARANTINE({"id": job_id, "error": RELAY_ERROR}))
        await uow.commit()
    [row] = await outbox_rows(db, job_id)

    requeued = _outbox_cli(wsettings, "requeue", str(row["id"]))
    assert requeued.returncode == 0, requeued.stderr
    [row] = await outbox_rows(db, job_id)
    assert row["quarantined_at"] is None
    rescuer = Maintenance(db, "a", Rescuer.from_settings(wsettings, metrics=WorkerMetrics()))
    assert await rescuer.round() == 0
    assert (await job_row(db, job_id))["status"] == "pending"


async def test_every_worker_runs_a_rescuer(
    db: Database, topology: Topology, start_worker: StartWorker
) -> None:
    worker = await start_worker()
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    async with db.unit_of_work() as uow:
        await execute(uow, QUARANTINE({"id": job_id, "error": RELAY_ERROR}))
        await uow.commit()

    row = await eventually(lambda: status_is(db, job_id, "failed"), what="the rescue")
    assert row["last_error"] == f"outbox row quarantined: {RELAY_ERROR}"
    assert worker.maintainer.is_leader


def _outbox_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobcore_command("outbox", *args),
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
