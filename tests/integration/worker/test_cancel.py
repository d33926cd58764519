"""Cancellation: a pending job is cancelled by the API alone; a running one stops its handler."""

from __future__ import annotations

import uuid
from pathlib import Path

from jobcore.amqp.topology import Topology
from jobcore.db import Database
from jobcore.sql.worker import CANCEL_CHANNEL
from services.worker.app import Worker
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import GatePayload
from tests.integration.worker.support import (
    OutboxPump,
    effects,
    job_row,
    outbox_rows,
    status_is,
    submit,
)
from tests.support.waiting import eventually

# What the API does (its own statements live with the API; these mirror them).
CANCEL_PENDING = """
    UPDATE jobs SET status = 'cancelled', cancel_requested_at = now(), finished_at = now(),
                    updated_at = now()
    WHERE id = %s AND status = 'pending'
"""
REQUEST_CANCEL = """
    UPDATE jobs SET cancel_requested_at = now(), updated_at = now()
    WHERE id = %s AND status = 'running'
"""


async def test_a_cancelled_pending_jobs_message_is_acknowledged_with_no_effect(
    db: Database,
    topology: Topology,
    outbox_pump: OutboxPump,
    start_worker: StartWorker,
) -> None:
    worker = await start_worker()
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


async def _skipped(worker: Worker) -> bool:
    return worker.metrics.counts["skipped"] >= 1


async def _no_handlers(worker: Worker) -> bool:
    return not worker.runner.running


async def _listening(worker: Worker) -> bool:
    return worker.cancels.listening
