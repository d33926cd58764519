"""Failed attempts: retries through the outbox with backoff and full jitter, then failure."""

from __future__ import annotations

from datetime import timedelta

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.kernel.envelope import decode
from jobcore.kernel.retry import backoff_ceiling
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import GatePayload, SlowPayload
from tests.integration.worker.support import (
    OutboxPump,
    effects,
    outbox_rows,
    relayed,
    status_is,
    submit,
)

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_retries_back_off_with_jitter_and_stop_at_max_attempts(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
) -> None:
    pump.paused.set()  # publish nothing until the job's trace context is in place
    job_id = await submit(db, topology, "wt_gate", GatePayload(fail_times=100), max_attempts=4)
    async with db.connection() as conn:
        await conn.execute("UPDATE jobs SET traceparent = %s WHERE id = %s", (TRACEPARENT, job_id))
    # Relayed: a retry drawn a delay near 0 is due at once, and would not reach the pump.
    worker = await start_worker(relayed(wsettings))
    pump.paused.clear()

    row = await eventually(lambda: status_is(db, job_id, "failed"), what="failure", timeout=20)

    assert row["attempts"] == 4
    assert row["last_error"] == "RuntimeError: planned failure on attempt 4"
    assert row["finished_at"] is not None
    assert await effects(db, job_id) == []
    assert await outbox_rows(db, job_id) == []  # no fifth message

    messages = [m for m in pump.published if m.job_id == job_id]
    assert [decode(m.body).attempt for m in messages] == [1, 2, 3, 4]
    delays = [m.available_at - m.created_at for m in messages[1:]]
    for failed_attempt, delay in enumerate(delays, start=1):
        ceiling = backoff_ceiling(
            failed_attempt, base=wsettings.retry_backoff_base, cap=wsettings.retry_backoff_cap
        )
        assert timedelta(0) <= delay <= timedelta(seconds=ceiling), (failed_attempt, delay)
    # Full jitter: the delays are drawn, not the ceilings themselves.
    assert delays != [timedelta(seconds=c) for c in (0.2, 0.4, 0.8)]
    assert len(set(delays)) == 3
    assert worker.metrics.counts["retries"] == 3
    assert worker.metrics.counts["processed.failed"] == 1


async def test_a_retry_carries_the_jobs_trace_context_and_then_succeeds(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker
) -> None:
    pump.paused.set()
    job_id = await submit(db, topology, "wt_gate", GatePayload(fail_times=1))
    async with db.connection() as conn:
        await conn.execute("UPDATE jobs SET traceparent = %s WHERE id = %s", (TRACEPARENT, job_id))
    await pump.drain()
    await start_worker()

    async def retry_row() -> dict[str, object] | None:
        rows = await outbox_rows(db, job_id)
        return rows[0] if rows else None

    retry = await eventually(retry_row, what="the retry's outbox row")
    assert retry["headers"] == {"traceparent": TRACEPARENT}
    assert retry["tenant"] == "t"  # the relay shares publishing between tenants
    pending = await status_is(db, job_id, "pending")
    assert pending is not None
    assert pending["next_attempt_at"] == retry["available_at"]
    assert pending["last_error"] == "RuntimeError: planned failure on attempt 1"

    pump.paused.clear()
    row = await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")
    assert row["attempts"] == 2
    assert [e["attempt"] for e in await effects(db, job_id)] == [2]


async def test_a_permanent_error_fails_the_job_at_once(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker
) -> None:
    await start_worker()
    job_id = await submit(db, topology, "wt_gate", GatePayload(permanent=True))

    row = await eventually(lambda: status_is(db, job_id, "failed"), what="failure")

    assert row["attempts"] == 1
    assert row["max_attempts"] == 3
    assert row["last_error"] == "PermanentError: this job can never work"
    assert await outbox_rows(db, job_id) == []


async def test_a_handler_past_its_timeout_is_a_failed_attempt(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker
) -> None:
    worker = await start_worker()
    job_id = await submit(db, topology, "wt_slow", SlowPayload(seconds=30))

    row = await eventually(lambda: status_is(db, job_id, "failed"), what="failure")

    assert row["attempts"] == 2  # wt_slow allows two
    assert row["last_error"] == "JobTimedOut: timed out after 0.3s"
    assert worker.metrics.counts["retries"] == 1
