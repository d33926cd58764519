"""200 long-poll waiters on a real `jobcore api` process: each answers within 100 ms of its
job finishing, while the API's pool (4 connections here) is never exceeded.

Serial: it measures latency, so it runs alone (the issue's functional requirement is the
100 ms bound, and the check allows nothing more). On a machine whose cores other work
keeps saturated, the API process can wait longer than that for a core: run it quiet.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import time
import uuid
from pathlib import Path

import httpx
import orjson
import psycopg
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.database.sql.jobs.run import JOB_SUCCEED_MANY
from jobcore.execution.completion_webhooks import completion_params
from jobcore.kernel.settings import Settings
from jobcore.testing.chaos import disruption_lock
from jobcore.testing.processes import jobcore_process
from jobcore.testing.waiting import eventually
from jobcore.usecases import keys as key_usecases
from services.api.waiters import APPLICATION_NAME
from tests.integration.webhooks.support import free_port

WAITERS = 200
POOL_MAX = 4
MAX_LATENCY = 0.100
API_POOL_NAME = "jobcore-api"

START_ALL = """
UPDATE jobs SET status = 'running', attempts = 1, lease_token = id,
    lease_expires_at = now() + interval '10 minutes', started_at = now()
WHERE id = ANY(%(ids)s)
"""

CONNECTIONS = """
SELECT count(*) FILTER (WHERE application_name = %(pool)s) AS pool,
       count(*) FILTER (WHERE application_name = %(listener)s) AS listener
FROM pg_stat_activity WHERE datname = current_database()
"""


class PoolWatch:
    """Samples how many connections the API process has open to the test's database."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.max_pool = 0
        self.listener_counts: set[int] = set()
        self.samples = 0

    async def sample(self) -> int:
        async with self.db.connection() as conn:
            cur = await conn.execute(
                CONNECTIONS, {"pool": API_POOL_NAME, "listener": APPLICATION_NAME}
            )
            row = await cur.fetchone()
        assert row is not None
        self.max_pool = max(self.max_pool, int(row["pool"]))
        self.listener_counts.add(int(row["listener"]))
        self.samples += 1
        return int(row["pool"])

    async def run(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(0.025)  # the sampling interval


async def raw_get(port: int, path: str, headers: dict[str, str]) -> tuple[int, bytes, float]:
    """One GET on its own connection with a minimal HTTP/1.1 client (cheaper than httpx with
    200 requests in flight, so the client adds little to what is measured); the status,
    the body and the monotonic time the whole answer was in."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        found = re.search(rb"content-length: *(\d+)", head, re.I)
        assert found is not None, head
        body = await reader.readexactly(int(found.group(1)))
        returned = time.monotonic()
        return int(head.split(b" ", 2)[1]), body, returned
    finally:
        writer.close()


def finish_jobs(settings: Settings, ids: list[uuid.UUID]) -> dict[str, tuple[float, float]]:
    """Succeed the jobs one statement each, with the worker's own success statement (and
    its NOTIFY), in a thread of its own so the times around each commit are taken at once;
    each job's (sent, committed) monotonic times."""
    completion = completion_params(Topology.from_settings(settings), settings)
    times: dict[str, tuple[float, float]] = {}
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        for job_id in ids:
            sent = time.monotonic()
            conn.execute(
                JOB_SUCCEED_MANY.sql,
                {
                    **completion,
                    "ids": [job_id],
                    "lease_tokens": [job_id],
                    "results": [None],
                    "result_refs": [None],
                    "effects": "[]",
                },
            )
            times[str(job_id)] = (sent, time.monotonic())
    return times


@pytest.mark.serial
@pytest.mark.timeout(300)
async def test_200_waiters_return_within_100ms_of_their_job_finishing_within_the_pool(
    settings: Settings, db: Database, tmp_path: Path
) -> None:
    port = free_port()
    key = (await key_usecases.create_key(db, "acme", "long-poll load", actor="tests")).key
    auth = {"Authorization": f"Bearer {key}"}
    # One tenant parks all 200: its long-poll cap (100 per process by default) is raised
    # for this measurement of the waiters themselves.
    env = {
        "JOBCORE_DB_POOL_MAX": str(POOL_MAX),
        "JOBCORE_DB_POOL_MIN": "1",
        "JOBCORE_QUOTA_MAX_LONG_POLLS": "1000",
    }
    log_path = tmp_path / "api.log"
    # No other developer's outage (a stopped database or broker) during the measurement.
    with (
        disruption_lock(),
        jobcore_process(settings, "api", "--port", str(port), log_path=log_path, **env) as api,
    ):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:

            async def ready() -> bool:
                assert api.poll() is None, log_path.read_text()
                try:
                    return (await client.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(ready, timeout=60, interval=0.1, what="jobcore api")

            job_ids: list[str] = []
            for _ in range(WAITERS):
                response = await client.post("/jobs/echo", json={"text": "x"}, headers=auth)
                assert response.status_code == 202
                job_ids.append(response.json()["job_id"])

            watch = PoolWatch(db)
            watcher = asyncio.create_task(watch.run())
            try:
                waits = {
                    job_id: asyncio.create_task(raw_get(port, f"/jobs/{job_id}?wait=30", auth))
                    for job_id in job_ids
                }

                async def all_parked() -> bool:
                    text = (await client.get("/metrics")).text
                    found = re.search(r"^jobcore_api_long_poll_waiters (\S+)$", text, re.M)
                    return found is not None and float(found.group(1)) == WAITERS

                await eventually(all_parked, timeout=60, interval=0.05, what="200 parked waiters")
                # All 200 wait now, and they hold no connection: the pool is far smaller.
                assert await watch.sample() <= POOL_MAX
                assert not any(task.done() for task in waits.values())

                ids = [uuid.UUID(j) for j in job_ids]
                async with db.connection() as conn:
                    await conn.execute(START_ALL, {"ids": ids})
                finished = await asyncio.to_thread(finish_jobs, settings, ids)
                answers = {job_id: await task for job_id, task in waits.items()}
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)

    assert {status for status, _, _ in answers.values()} == {200}
    assert {orjson.loads(body)["status"] for _, body, _ in answers.values()} == {"succeeded"}
    # From the moment the statement that finished the job returned (committed).
    latencies = sorted(answers[j][2] - finished[j][1] for j in job_ids)
    early = [j for j in job_ids if answers[j][2] <= finished[j][0]]
    span = max(t for _, t in finished.values()) - min(t for t, _ in finished.values())
    summary = {
        "waiters": WAITERS,
        "p50_ms": round(statistics.median(latencies) * 1000, 1),
        "p95_ms": round(latencies[int(0.95 * len(latencies)) - 1] * 1000, 1),
        "max_ms": round(latencies[-1] * 1000, 1),
        "finish_span_ms": round(span * 1000, 1),
        "max_pool_connections": watch.max_pool,
        "pool_samples": watch.samples,
    }
    print(f"long-poll: {summary}")

    assert not early, "a waiter answered before its job finished"
    assert latencies[-1] <= MAX_LATENCY, summary
    assert watch.max_pool <= POOL_MAX, summary
    assert watch.listener_counts == {1}, watch.listener_counts
    assert watch.samples > 5
