"""The sweeper: a pending job whose message vanished is published again, and runs once.

Jobs are made stale by moving their timestamps back in the test database (the staleness
stays at its default, an hour), never by waiting.
"""

from __future__ import annotations

import subprocess
import uuid
from typing import Any

import aio_pika
import httpx
import orjson

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, execute
from jobcore.database.sql import Query
from jobcore.kernel.settings import Settings
from jobcore.maintenance import Sweeper
from jobcore.testing.jobtypes import EffectPayload
from jobcore.testing.processes import jobcore_command, settings_env
from jobcore.testing.waiting import eventually
from services.worker.metrics import WorkerMetrics
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.support import (
    HOUR,
    TAKE_OVER,
    Maintenance,
    OutboxPump,
    backdate,
    effects,
    job_row,
    outbox_rows,
    status_is,
    submit,
)

SET_JOB = Query(
    "test_set_job",
    "Put a job in a given state directly.",
    """
    UPDATE jobs
    SET status = coalesce(%(status)s, status),
        attempts = coalesce(%(attempts)s, attempts),
        republish_count = coalesce(%(republish_count)s, republish_count),
        next_attempt_at = CASE WHEN %(due_in)s::float8 IS NULL THEN next_attempt_at
                               ELSE now() + make_interval(secs => %(due_in)s) END,
        finished_at = CASE WHEN %(status)s IN ('succeeded', 'failed', 'cancelled')
                           THEN now() ELSE finished_at END
    WHERE id = %(id)s
    """,
)
FORGET_MESSAGES = Query(
    "test_forget_messages",
    "Remove a job's outbox rows, as the relay does once the broker confirmed them.",
    "DELETE FROM outbox WHERE job_id = %(id)s",
)
SET_OUTBOX = Query(
    "test_set_outbox",
    "Schedule or quarantine a job's outbox rows.",
    """
    UPDATE outbox
    SET available_at = now() + make_interval(secs => coalesce(%(due_in)s, 0)),
        quarantined_at = CASE WHEN %(quarantined)s THEN now() END
    WHERE job_id = %(id)s
    """,
)


def sweeper(settings: Settings, db: Database, owner: str) -> Maintenance:
    """A maintainer running only a sweeper."""
    metrics = WorkerMetrics()
    return Maintenance(db, owner, Sweeper.from_settings(settings, metrics=metrics), metrics=metrics)


async def run(db: Database, query: Query, **params: Any) -> None:
    async with db.unit_of_work() as uow:
        await execute(uow, query(params))
        await uow.commit()


async def set_job(
    db: Database,
    job_id: uuid.UUID,
    *,
    status: str | None = None,
    attempts: int | None = None,
    republish_count: int | None = None,
    due_in: float | None = None,
) -> None:
    await run(
        db,
        SET_JOB,
        id=job_id,
        status=status,
        attempts=attempts,
        republish_count=republish_count,
        due_in=due_in,
    )


async def queue_depth(settings: Settings, name: str) -> int:
    connection = await aio_pika.connect(settings.amqp_url, timeout=5)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(name, passive=True)
        return int(queue.declaration_result.message_count or 0)


async def test_a_job_whose_queue_was_purged_is_published_again_once_stale_and_runs_once(
    db: Database,
    topology: Topology,
    wsettings: Settings,
    pump: OutboxPump,
    start_worker: StartWorker,
) -> None:
    job_id = await submit(db, topology, "effect", EffectPayload(n=1))
    await eventually(lambda: _published(db, job_id), what="the message to be published")
    connection = await aio_pika.connect(wsettings.amqp_url, timeout=5)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(topology.queue_name("testq"), passive=True)
        purged = await queue.purge()
    assert purged.message_count == 1

    # Not stale yet: a sweeper leaves it alone (the message may only be slow).
    early = sweeper(wsettings, db, "early")
    assert await early.round() == 0
    worker = await start_worker()
    await backdate(db, job_id)

    row = await eventually(lambda: status_is(db, job_id, "succeeded"), what="the job to run")
    assert [e["kind"] for e in await effects(db, job_id)] == ["effect"]
    assert row["attempts"] == 1
    assert row["republish_count"] == 1
    assert row["last_error"] is None
    note = row["message_note"]
    assert (note["event"], note["attempt"], note["reason"], note["count"]) == (
        "republished",
        1,
        "stale",
        1,
    )
    assert note["silent_seconds"] >= 2 * HOUR - 60
    assert worker.metrics.counts["republished.stale"] == 1
    assert worker.maintainer.is_leader

    # The worker shows its sweeper's leadership and the counter.
    assert worker.health is not None
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{worker.health.port}", timeout=5
    ) as client:
        health = (await client.get("/healthz")).json()
        metrics = (await client.get("/metrics")).text
    assert health["sweeper_leader"] is True
    assert health["dead_letter_notes_consuming"] is True
    assert health["counters"]["republished.stale"] == 1
    assert 'jobcore_worker_republished_jobs_total{reason="stale"} 1.0' in metrics


async def test_a_spare_copy_of_a_message_still_in_the_queue_is_harmless(
    db: Database,
    topology: Topology,
    wsettings: Settings,
    outbox_pump: OutboxPump,
    start_worker: StartWorker,
) -> None:
    job_id = await submit(db, topology, "effect", EffectPayload(n=2))
    assert await outbox_pump.drain() == 1  # the original waits in the queue: no worker yet
    await backdate(db, job_id)

    sweeping = sweeper(wsettings, db, "a")
    assert await sweeping.round() == 1
    [copy] = await outbox_rows(db, job_id)
    assert await outbox_pump.drain() == 1
    assert await queue_depth(wsettings, topology.queue_name("testq")) == 2
    original, spare = outbox_pump.published
    assert original.body == spare.body  # the same attempt (1): the fence lets one run it
    assert spare.message_id == copy["message_id"] != original.message_id

    worker = await start_worker()
    await eventually(lambda: status_is(db, job_id, "succeeded"), what="the job to run")

    async def copy_acknowledged() -> bool:
        return worker.metrics.counts["skipped"] == 1

    await eventually(copy_acknowledged, what="the spare copy to be acknowledged")
    assert len(await effects(db, job_id)) == 1
    assert (await job_row(db, job_id))["attempts"] == 1
    assert worker.metrics.counts["processed.succeeded"] == 1


async def test_only_stranded_jobs_are_published_again_and_each_less_often(
    db: Database, topology: Topology, wsettings: Settings
) -> None:
    async def job(**kwargs: Any) -> uuid.UUID:
        return await submit(db, topology, "effect", EffectPayload(), **kwargs)

    stranded = await job()
    await run(db, FORGET_MESSAGES, id=stranded)
    await backdate(db, stranded)

    untouched: dict[str, uuid.UUID] = {}
    # Scheduled for later: its outbox row waits for run_at.
    untouched["scheduled"] = await job(run_at=await _in_an_hour(db))
    await backdate(db, untouched["scheduled"])
    # Its backoff (or run_at) ended half an hour ago: its message went out then.
    untouched["due_recently"] = await job()
    await run(db, FORGET_MESSAGES, id=untouched["due_recently"])
    await backdate(db, untouched["due_recently"])
    await set_job(db, untouched["due_recently"], due_in=-HOUR / 2)
    # In a retry's backoff: its next message waits in the outbox.
    untouched["backoff"] = await job()
    await backdate(db, untouched["backoff"])
    await set_job(db, untouched["backoff"], attempts=1, due_in=600)
    await run(db, SET_OUTBOX, id=untouched["backoff"], due_in=600, quarantined=False)
    # Its outbox row is due and waits for a relay.
    untouched["row_waiting"] = await job()
    await backdate(db, untouched["row_waiting"])
    # Its outbox row is quarantined: the rescuer's business.
    untouched["quarantined"] = await job()
    await backdate(db, untouched["quarantined"])
    await run(db, SET_OUTBOX, id=untouched["quarantined"], due_in=None, quarantined=True)
    # Running, and finished.
    untouched["running"] = await job()
    await run(db, FORGET_MESSAGES, id=untouched["running"])
    async with db.unit_of_work() as uow:
        await execute(uow, TAKE_OVER({"id": untouched["running"], "token": uuid.uuid4()}))
        await uow.commit()
    await backdate(db, untouched["running"])
    for status in ("succeeded", "failed", "cancelled"):
        untouched[status] = await job()
        await run(db, FORGET_MESSAGES, id=untouched[status])
        await set_job(db, untouched[status], status=status, attempts=1)
        await backdate(db, untouched[status])
    # Published again 90 minutes ago already: its next republish waits twice as long.
    untouched["republished"] = await job()
    await run(db, FORGET_MESSAGES, id=untouched["republished"])
    await set_job(db, untouched["republished"], republish_count=1)
    await backdate(db, untouched["republished"], 1.5 * HOUR)

    before = {name: await _state(db, job_id) for name, job_id in untouched.items()}
    sweeping = sweeper(wsettings, db, "a")
    assert await sweeping.round() == 1
    assert await sweeping.round() == 0  # it has an outbox row now
    assert {name: await _state(db, job_id) for name, job_id in untouched.items()} == before
    [message] = await outbox_rows(db, stranded)
    assert message["available_at"] <= message["created_at"]  # due at once
    assert message["tenant"] == "t"
    assert (await job_row(db, stranded))["republish_count"] == 1
    assert sweeping.metrics.counts["republished.stale"] == 1

    # Published, and silent again: the second republish waits two stalenesses.
    await run(db, FORGET_MESSAGES, id=stranded)
    await backdate(db, stranded, 1.5 * HOUR)
    assert await sweeping.round() == 0
    await backdate(db, stranded, HOUR)
    assert await sweeping.round() == 1
    row = await job_row(db, stranded)
    assert row["republish_count"] == 2
    assert row["message_note"]["count"] == 2
    assert sweeping.metrics.counts["republished.stale"] == 2


async def test_one_sweeper_at_a_time(db: Database, topology: Topology, wsettings: Settings) -> None:
    job_id = await submit(db, topology, "effect", EffectPayload())
    await run(db, FORGET_MESSAGES, id=job_id)
    await backdate(db, job_id)

    first = sweeper(wsettings, db, "a")
    second = sweeper(wsettings, db, "b")
    assert await first.round() == 1
    await run(db, FORGET_MESSAGES, id=job_id)
    await backdate(db, job_id, 10 * HOUR)  # stale again, but not the second sweeper's to take
    assert await second.round() == 0
    assert not second.is_leader
    assert first.is_leader
    assert second.metrics.counts["republished.stale"] == 0
    assert (await job_row(db, job_id))["republish_count"] == 1


async def test_operators_publish_stale_jobs_again_at_once(
    db: Database, topology: Topology, wsettings: Settings
) -> None:
    job_id = await submit(db, topology, "effect", EffectPayload())
    await run(db, FORGET_MESSAGES, id=job_id)

    def republish(*args: str) -> list[dict[str, Any]]:
        result = subprocess.run(
            jobcore_command("jobs", "republish-stale", "--json", *args),
            env=settings_env(wsettings),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        rows: list[dict[str, Any]] = orjson.loads(result.stdout)
        return rows

    assert republish() == []  # not stale for JOBCORE_SWEEPER_STALE_AFTER (an hour)
    [row] = republish("--stale-after", "0")
    assert (row["job_id"], row["attempt"], row["reason"], row["count"]) == (
        str(job_id),
        1,
        "stale",
        1,
    )
    assert len(await outbox_rows(db, job_id)) == 1
    assert republish("--stale-after", "0") == []  # its message waits in the outbox


async def _published(db: Database, job_id: uuid.UUID) -> bool:
    return not await outbox_rows(db, job_id)


async def _in_an_hour(db: Database) -> Any:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT now() + interval '1 hour' AS t")
        row = await cur.fetchone()
    assert row is not None
    return row["t"]


async def _state(db: Database, job_id: uuid.UUID) -> tuple[Any, ...]:
    row = await job_row(db, job_id)
    messages = await outbox_rows(db, job_id)
    return (
        row["status"],
        row["republish_count"],
        row["message_note"],
        row["updated_at"],
        [m["message_id"] for m in messages],
    )


def overdue(metrics: WorkerMetrics, queue: str = "testq") -> float | None:
    return metrics.registry.get_sample_value("jobcore_jobs_overdue_seconds", {"queue": queue})


async def test_the_lease_holder_reports_how_long_due_jobs_have_waited(
    db: Database, topology: Topology, wsettings: Settings
) -> None:
    """jobcore_jobs_overdue_seconds (the JobcoreJobsOverdue alert): due pending jobs count
    from when they became due; scheduled ones, held ones and finished ones do not."""
    later = await submit(db, topology, "effect", EffectPayload(n=1))
    await set_job(db, later, due_in=HOUR)
    await backdate(db, later, 2 * HOUR)  # created long ago, but due in an hour
    holder = sweeper(wsettings, db, "a")
    standby = sweeper(wsettings, db, "b")
    await holder.round()
    assert overdue(holder.metrics) is None  # no due job in any queue

    due = await submit(db, topology, "effect", EffectPayload(n=2))
    await backdate(db, due, HOUR)
    await holder.round()
    await standby.round()
    assert holder.is_leader
    assert not standby.is_leader
    waited = overdue(holder.metrics)
    assert waited is not None
    assert HOUR <= waited < HOUR + 60
    assert overdue(standby.metrics) is None  # only the holder measures

    await set_job(db, due, status="succeeded")
    await holder.round()
    assert overdue(holder.metrics) == 0  # the queue no longer has one: back to 0
