"""Cancellation: a pending job is cancelled by the API alone; a running one stops its handler."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import psycopg
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, execute, fetch_all
from jobcore.database.sql import Query
from jobcore.database.sql.jobs.cancel import CANCEL_CHANNEL
from jobcore.database.sql.jobs.run import JOB_RELEASE, JOB_RETRY
from jobcore.database.sql.webhook_deliveries import JOB_DONE_CHANNEL, WEBHOOK_MESSAGE_TYPE
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from services.worker.app import Worker
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import REQUEST_CANCEL, GatePayload, NoPayload
from tests.integration.worker.support import (
    OutboxPump,
    effects,
    job_row,
    outbox_rows,
    outcome_params,
    relayed,
    running_echo_job,
    status_is,
    submit,
)

# What the API does (its own statements live with the API; these mirror them).
CANCEL_PENDING = """
    UPDATE jobs SET status = 'cancelled', cancel_requested_at = now(), finished_at = now(),
                    updated_at = now()
    WHERE id = %s AND status = 'pending'
"""


async def test_a_cancelled_pending_jobs_message_is_acknowledged_with_no_effect(
    db: Database,
    topology: Topology,
    outbox_pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
) -> None:
    # Relayed: the message is a delivery, which the worker acknowledges as skipped.
    worker = await start_worker(relayed(wsettings))
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    async with db.connection() as conn:
        cur = await conn.execute(CANCEL_PENDING, (job_id,))
        assert cur.rowcount == 1

    await outbox_pump.drain()  # the message was already in the outbox
    await eventually(lambda: _skipped(worker), what="the message to be skipped")

    row = await job_row(db, job_id)
    assert row["status"] == "cancelled"
    assert row["attempts"] == 0
    assert row["started_at"] is None
    assert await effects(db, job_id) == []


async def test_cancelling_a_running_job_stops_its_handler(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    tmp_path: Path,
) -> None:
    worker = await start_worker()
    job_id = await submit(db, topology, "wt_gate", GatePayload(gate=str(tmp_path / "never")))
    await eventually(lambda: status_is(db, job_id, "running"), what="the job to run")

    async with db.connection() as conn:
        cur = await conn.execute(REQUEST_CANCEL, (job_id,))
        assert cur.rowcount == 1
        await conn.execute("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, str(job_id)))

    row = await eventually(lambda: status_is(db, job_id, "cancelled"), what="cancellation")
    assert row["attempts"] == 1
    assert row["finished_at"] is not None
    assert row["lease_expires_at"] is None
    assert await effects(db, job_id) == []
    assert await outbox_rows(db, job_id) == []  # no retry of a cancelled job
    await eventually(lambda: _no_handlers(worker), what="the handler to be gone")
    assert worker.metrics.counts["processed.cancelled"] == 1


async def test_a_cancel_request_without_notify_is_seen_by_the_heartbeat(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    tmp_path: Path,
) -> None:
    worker = await start_worker()
    job_id = await submit(db, topology, "wt_gate", GatePayload(gate=str(tmp_path / "never")))
    await eventually(lambda: status_is(db, job_id, "running"), what="the job to run")

    async with db.connection() as conn:
        await conn.execute(REQUEST_CANCEL, (job_id,))  # the NOTIFY was lost

    await eventually(lambda: status_is(db, job_id, "cancelled"), what="cancellation", timeout=5)
    assert worker.metrics.counts["processed.cancelled"] == 1


async def test_a_cancel_notify_for_an_unknown_job_is_ignored(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker
) -> None:
    worker = await start_worker()
    await eventually(lambda: _listening(worker), what="the cancel listener")
    async with db.connection() as conn:
        await conn.execute("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, str(uuid.uuid4())))
        await conn.execute("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, "not-a-job-id"))
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")
    assert worker.cancels.running


async def test_a_retryable_failure_after_a_cancel_request_ends_the_job_cancelled(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker
) -> None:
    worker = await start_worker()
    job_id = await submit(db, topology, "wt_cancel_then_fail", NoPayload())

    row = await eventually(lambda: _attempt_over(db, job_id), what="the attempt's outcome")
    assert row["status"] == "cancelled"
    assert row["attempts"] == 1  # attempts were left, but a cancelled job gets no retry
    assert row["finished_at"] is not None
    assert row["lease_expires_at"] is None  # no lease held (the token stays, as the outcome's)
    assert row["last_error"] == "RuntimeError: failed after its cancellation was requested"
    assert await outbox_rows(db, job_id) == []  # no message for another attempt
    await eventually(lambda: _no_handlers(worker), what="the handler to be gone")
    assert worker.metrics.counts["processed.cancelled"] == 1
    assert worker.metrics.counts["processed.retried"] == 0


CANCEL_REQUESTED = Query(
    "test_cancel_requested",
    "Request a running job's cancellation and give it a callback, as the API would; forget "
    "its first message (published long ago).",
    """
    WITH published AS (DELETE FROM outbox WHERE job_id = %(id)s)
    UPDATE jobs SET cancel_requested_at = now(), callback_url = %(url)s WHERE id = %(id)s
    """,
)


@pytest.mark.parametrize("statement", [JOB_RETRY, JOB_RELEASE], ids=lambda s: s.name)
async def test_a_retry_or_release_of_a_job_whose_cancel_was_requested_ends_it_cancelled(
    statement: Query, db: Database, topology: Topology, settings: Settings
) -> None:
    token = uuid.uuid4()
    job_id = await running_echo_job(db, topology, token)
    async with db.unit_of_work() as uow:
        await execute(uow, CANCEL_REQUESTED({"id": job_id, "url": "https://hooks.test/done"}))
        await uow.commit()

    listener = await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True)
    try:
        await listener.execute(f"LISTEN {JOB_DONE_CHANNEL}")
        async with db.unit_of_work() as uow:
            written = await fetch_all(
                uow, statement(outcome_params(statement, job_id, token, topology, settings))
            )
            await uow.commit()
        notify = await asyncio.wait_for(anext(listener.notifies()), timeout=5)
    finally:
        await listener.close()

    assert [(r["id"], r["status"]) for r in written] == [(job_id, "cancelled")]
    row = await job_row(db, job_id)
    assert row["status"] == "cancelled"
    assert row["attempts"] == 1  # a release does not give the attempt back to a cancelled job
    assert row["finished_at"] is not None
    assert row["lease_token"] == token  # left by the outcome (JOB_OUTCOME_WRITTEN reads it)
    assert row["lease_expires_at"] is None
    # Its completion webhook, and no message for another attempt.
    assert [m["message_type"] for m in await outbox_rows(db, job_id)] == [WEBHOOK_MESSAGE_TYPE]
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT event FROM webhook_deliveries WHERE job_id = %s", (job_id,)
        )
        assert [r["event"] for r in await cur.fetchall()] == ["job.cancelled"]
    assert (notify.channel, notify.payload) == (JOB_DONE_CHANNEL, str(job_id))


async def _attempt_over(db: Database, job_id: uuid.UUID) -> dict[str, object] | None:
    row = await job_row(db, job_id)
    return row if row["attempts"] >= 1 and row["status"] != "running" else None


async def _skipped(worker: Worker) -> bool:
    return worker.metrics.counts["skipped"] >= 1


async def _no_handlers(worker: Worker) -> bool:
    return not worker.executor.running


async def _listening(worker: Worker) -> bool:
    return worker.cancels.listening
