"""JOB_RELEASE, the statement that gives a running job back without spending its attempt:
at shutdown (due at once, last_error kept) and after an object store outage (due after a
delay, last_error and the timeline say why)."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, fetch_all
from jobcore.database.sql.jobs.run import JOB_RELEASE
from jobcore.kernel.settings import Settings
from tests.integration.worker.support import outcome_params, running_echo_job

OUTAGE = "storing the result failed: object store unavailable: StoreUnavailable: refused"


async def release(
    db: Database, topology: Topology, settings: Settings, *, delay: float, error: str | None
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Release a running echo job whose last_error was 'earlier'; its row (with the
    database's now()), the message written for it and its released event."""
    token = uuid.uuid4()
    job_id = await running_echo_job(db, topology, token)
    params = {
        **outcome_params(JOB_RELEASE, job_id, token, topology, settings),
        "delay": delay,
        "error": error,
    }
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET last_error = 'earlier', worker_id = 'w1' WHERE id = %s", (job_id,)
        )
        assert len(await fetch_all(conn, JOB_RELEASE(params))) == 1
    async with db.connection() as conn:
        cur = await conn.execute("SELECT *, now() AS db_now FROM jobs WHERE id = %s", (job_id,))
        row = await cur.fetchone()
        cur = await conn.execute(
            "SELECT available_at FROM outbox WHERE message_id = %s", (params["message_id"],)
        )
        message = await cur.fetchone()
        cur = await conn.execute(
            "SELECT at, attempt, detail FROM job_events WHERE job_id = %s AND kind = 'released'",
            (job_id,),
        )
        [event] = await cur.fetchall()
    assert row is not None
    assert message is not None
    return dict(row), dict(message), dict(event)


async def test_a_shutdown_release_is_due_at_once_and_keeps_the_last_error(
    db: Database, topology: Topology, settings: Settings
) -> None:
    """The shutdown release as it was before store outages used the statement."""
    row, message, event = await release(db, topology, settings, delay=0.0, error=None)
    assert (row["status"], row["attempts"], row["last_error"]) == ("pending", 0, "earlier")
    assert row["next_attempt_at"] is None
    assert message["available_at"] <= row["db_now"]
    assert (event["attempt"], event["detail"]) == (1, {"worker": "w1"})


async def test_a_store_outage_release_is_due_after_its_delay_and_says_why(
    db: Database, topology: Topology, settings: Settings
) -> None:
    row, message, event = await release(db, topology, settings, delay=60.0, error=OUTAGE)
    assert (row["status"], row["attempts"], row["last_error"]) == ("pending", 0, OUTAGE)
    assert row["next_attempt_at"] > row["db_now"]
    assert message["available_at"] == row["next_attempt_at"]
    assert event["attempt"] == 1
    assert event["detail"]["worker"] == "w1"
    assert event["detail"]["error"] == OUTAGE
    assert event["detail"]["until"] is not None


async def test_a_release_after_the_shortest_delay_is_due_at_its_event_not_before(
    db: Database, topology: Topology, settings: Settings
) -> None:
    # One microsecond, the least a due time can differ by: the event's `until` is its own
    # time plus the delay, read from one clock, never a moment before the event.
    row, message, event = await release(db, topology, settings, delay=1e-6, error=OUTAGE)
    until = datetime.fromisoformat(event["detail"]["until"])
    assert until == row["next_attempt_at"] == message["available_at"]
    assert until - event["at"] == timedelta(microseconds=1)
