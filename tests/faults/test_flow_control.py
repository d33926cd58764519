"""Flow control with real processes: a high job under a backlog of 10,000 low ones, and a
queue paused under load (a worker killed with SIGKILL while it is paused), then resumed.

Everything is asserted from the job rows (started_at, attempts, status) and the effect
ledger (``job_effects``), never from timings.
"""

from __future__ import annotations

import asyncio
import signal
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.priorities import Priority
from jobcore.kernel.settings import Settings
from jobcore.testing.jobtypes import EchoPayload
from jobcore.testing.processes import jobcore_process
from jobcore.testing.waiting import eventually
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue
from tests.e2e.stack import JOB_MODULES, E2EStack
from tests.integration.relay.helpers import relay_env, run_cli
from tests.integration.worker.support import log_has

# amqp_channel deletes the test's queues afterwards.
pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("amqp_channel")]

BACKLOG = 10_000
DEPTH_LIMIT = 20
PREFETCH = 8

# 10,000 low echo jobs with their outbox rows, as 10,000 enqueues would write them.
FILL_LOW_JOBS = """
WITH job AS (
    INSERT INTO jobcore.jobs (id, tenant, type, queue, priority, payload)
    SELECT gen_random_uuid(), 't', 'echo', 'testq', %(priority)s, '{"text": "low"}'::jsonb
    FROM generate_series(1, %(n)s)
    RETURNING id, tenant, priority
)
INSERT INTO jobcore.outbox (message_id, exchange, routing_key, message_type, headers, body, job_id,
                    tenant, priority)
SELECT gen_random_uuid(), %(exchange)s, 'testq', 'echo', '{}'::jsonb,
       convert_to(jsonb_build_object('v', 1, 'job_id', job.id, 'attempt', 1,
                                     'type', 'echo')::text, 'UTF8'),
       job.id, job.tenant, job.priority
FROM job
"""


async def one(db: Database, sql: str, *params: Any) -> dict[str, Any]:
    async with db.connection() as conn:
        cur = await conn.execute(sql, params)
        row = await cur.fetchone()
    assert row is not None
    return dict(row)


async def db_now(db: Database) -> datetime:
    return (await one(db, "SELECT clock_timestamp() AS now"))["now"]  # type: ignore[no-any-return]


async def test_a_high_job_starts_within_one_claim_batch_of_a_10k_low_backlog(
    settings: Settings, db: Database, topology: Topology, tmp_path: Path
) -> None:
    async with db.connection() as conn:
        await conn.execute(
            FILL_LOW_JOBS,
            {"n": BACKLOG, "priority": int(Priority.LOW), "exchange": topology.jobs_exchange},
        )
        await conn.execute("ANALYZE jobcore.jobs")
        await conn.execute("ANALYZE jobcore.outbox")
    env = {
        "JOBCORE_JOB_MODULES": JOB_MODULES,
        "JOBCORE_WORKER_HEALTH_PORT": "0",
        "JOBCORE_WORKER_CONCURRENCY": str(PREFETCH),
        "JOBCORE_RELAY_QUEUE_DEPTH_LIMIT": str(DEPTH_LIMIT),
        "OTEL_SDK_DISABLED": "true",
    }
    with (
        jobcore_process(settings, "relay", log_path=tmp_path / "relay.log", **relay_env(), **env),
        jobcore_process(settings, "worker", log_path=tmp_path / "worker.log", **env),
    ):

        async def backlog_flowing() -> bool:
            done = await one(
                db, "SELECT count(*) AS n FROM jobcore.jobs WHERE status = 'succeeded'"
            )
            return int(done["n"]) >= 200

        await eventually(backlog_flowing, timeout=120, interval=0.2, what="the low jobs to run")
        async with db.unit_of_work() as uow:
            high = await enqueue(
                uow,
                topology,
                EnqueueRequest(
                    tenant="t",
                    job_type=default_registry.get("echo"),
                    payload=EchoPayload(text="high"),
                    priority=Priority.HIGH,
                ),
            )
            await uow.commit()
        # The window opens once the high job is committed, not at its created_at (the
        # enqueue's transaction start): until the commit no relay can see it, and on a
        # loaded machine the low jobs that start meanwhile are not the flow control's.
        committed = await db_now(db)

        async def high_started() -> dict[str, Any] | None:
            row = await one(db, "SELECT * FROM jobcore.jobs WHERE id = %s", high.job_id)
            return row if row["started_at"] is not None else None

        started = await eventually(high_started, timeout=60, interval=0.1, what="the high job")
        assert started is not None

    overtaking = await one(
        db,
        """
        SELECT count(*) FILTER (WHERE started_at > %s AND started_at < %s) AS overtaking,
               count(*) FILTER (WHERE started_at IS NULL OR started_at > %s) AS behind
        FROM jobcore.jobs WHERE priority = 0
        """,
        committed,
        started["started_at"],
        started["started_at"],
    )
    print(f"\nlow jobs started between the high job's commit and its start: {overtaking}")
    # The backlog was really there: most of it still waited when the high job started ...
    assert overtaking["behind"] > BACKLOG // 2
    # ... and at most what the broker may hold (the relay's depth limit) plus what the
    # worker had prefetched started before it. Without priorities it would wait for all.
    assert overtaking["overtaking"] <= DEPTH_LIMIT + PREFETCH


async def submit(client: httpx.AsyncClient, job_type: str, payload: dict[str, Any]) -> str:
    response = await client.post(f"/jobs/{job_type}", json=payload)
    assert response.status_code == 202, response.text
    return str(response.json()["job_id"])


async def all_succeeded(db: Database, ids: list[str]) -> bool:
    row = await one(
        db,
        "SELECT count(*) AS n FROM jobcore.jobs"
        " WHERE id = ANY(%s::uuid[]) AND status = 'succeeded'",
        ids,
    )
    return int(row["n"]) == len(ids)


async def started_between(db: Database, queue: str, since: datetime, until: datetime) -> int:
    row = await one(
        db,
        "SELECT count(*) AS n FROM jobcore.jobs"
        " WHERE queue = %s AND started_at > %s AND started_at < %s",
        queue,
        since,
        until,
    )
    return int(row["n"])


def cli_json(settings: Settings, *args: str) -> Any:
    result = run_cli(settings, *args, "--json")
    assert result.returncode == 0, result.stderr
    return orjson.loads(result.stdout)


async def test_a_paused_queue_starts_nothing_keeps_enqueueing_and_runs_everything_once_resumed(
    settings: Settings, db: Database, tmp_path: Path
) -> None:
    stack = E2EStack(settings, tmp_path, env={"OTEL_SDK_DISABLED": "true"})
    await stack.start()
    try:
        async with stack.client() as client:
            effect_ids: list[str] = []
            stop_load = asyncio.Event()

            async def load() -> None:  # testq under load while it is paused
                n = 0
                while not stop_load.is_set():
                    effect_ids.append(await submit(client, "effect", {"n": n, "seconds": 0.02}))
                    n += 1

            loader = asyncio.create_task(load())

            async def some_ran() -> bool:
                return await all_succeeded(db, effect_ids[:20]) if len(effect_ids) > 20 else False

            await eventually(some_ran, timeout=60, interval=0.1, what="effect jobs to run")
            assert cli_json(settings, "queues", "pause", "testq")["paused"] is True
            paused_from = await db_now(db)
            noop_ids = [await submit(client, "noop", {}) for _ in range(20)]
            for n in range(20):
                effect_ids.append(await submit(client, "effect", {"n": 10_000 + n}))
            stop_load.set()
            await loader

            # Other queues keep running.
            await eventually(
                lambda: all_succeeded(db, noop_ids), timeout=60, interval=0.1, what="noop jobs"
            )
            view = (await client.get(f"/jobs/{effect_ids[-1]}")).json()
            assert (view["status"], view["waiting_for"]) == ("pending", "queue paused")
            queues = {q["queue"]: q for q in cli_json(settings, "queues", "list")}
            assert queues["testq"]["paused"] is True
            assert queues["testq"]["pending"] >= 20

            async def gauge_shows_the_pause() -> bool:
                scraped = await stack.scrape("relay")
                return scraped.get(("jobcore_paused", (("kind", "queue"), ("name", "testq")))) == 1

            await eventually(gauge_shows_the_pause, timeout=20, interval=0.2, what="the gauge")

            # A worker killed while the queue is paused loses nothing.
            worker = stack.processes["worker"]
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=10)
            second_log = tmp_path / "worker-2.log"
            with jobcore_process(
                settings,
                "worker",
                log_path=second_log,
                JOBCORE_JOB_MODULES=JOB_MODULES,
                JOBCORE_WORKER_HEALTH_PORT="0",
                OTEL_SDK_DISABLED="true",
            ):
                await eventually(
                    log_has(second_log, "worker consuming"), timeout=60, what="worker 2"
                )
                resumed_at = await db_now(db)
                # Nothing of the paused queue started while it was paused.
                assert await started_between(db, "testq", paused_from, resumed_at) == 0
                assert cli_json(settings, "queues", "resume", "testq")["was_paused"] is True

                await eventually(
                    lambda: all_succeeded(db, effect_ids),
                    timeout=120,
                    interval=0.2,
                    what="every effect job after the resume",
                )
    finally:
        await stack.stop()

    # Each job ran exactly once: one attempt, one effect in the ledger.
    row = await one(
        db,
        """
        SELECT count(*) AS jobs,
               count(*) FILTER (WHERE attempts = 1) AS one_attempt,
               (SELECT count(*) FROM jobcore.job_effects WHERE job_id = ANY(%s::uuid[])) AS effects,
               (SELECT count(DISTINCT job_id) FROM jobcore.job_effects
                WHERE job_id = ANY(%s::uuid[])) AS jobs_with_effects
        FROM jobcore.jobs WHERE id = ANY(%s::uuid[])
        """,
        effect_ids,
        effect_ids,
        effect_ids,
    )
    n = len(effect_ids)
    assert row == {"jobs": n, "one_attempt": n, "effects": n, "jobs_with_effects": n}
    audit = await one(
        db,
        "SELECT array_agg(action ORDER BY id) AS actions FROM jobcore.audit_log"
        " WHERE target_id = 'testq'",
    )
    assert audit["actions"] == ["queue.pause", "queue.resume"]
