"""workflow: a fan-out/fan-in of no-op jobs created as one workflow (``POST /workflows``)
and run, against the same jobs enqueued one request at a time by a client that waits for
each dependency itself.

The shape: one root job, ``--jobs`` minus two jobs that depend on it, one job that
depends on all of those. Workflow: one request creates them all; the database publishes
the middle jobs when the root settles and the last one when the last middle job settles.
One at a time: the root by ``POST /jobs/noop``, then (once it succeeded) the middle jobs by
``POST /jobs/noop`` from a few clients, then (once they all succeeded) the last one.

Figures, per run: jobs created per second (one request against single requests), jobs
run per second from the first request to the last job's end (the workflow against the
client's orchestration), and the creation cost per job of a workflow ten times smaller,
against this one's (flat: the ratio stays near 1).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict

import orjson
import psycopg

from services.bench.harness import Bench, Options
from services.bench.http import Connection, http_load, post
from services.bench.report import Figure, Section

TITLE = "Workflow (one request, readiness in the database) vs one-at-a-time enqueue"
# Single requests in flight at once for the one-at-a-time enqueue of the middle jobs.
SINGLE_CLIENTS = 16
# How long a run may take to finish its jobs.
DONE_TIMEOUT = 600.0
POLL = 0.05

DONE_SQL = """
SELECT count(*) FILTER (WHERE status NOT IN ('succeeded', 'failed', 'cancelled')) AS open,
       count(*) FILTER (WHERE status <> 'succeeded' AND status IN ('failed', 'cancelled'))
           AS bad
FROM jobcore.jobs WHERE id = ANY(%(ids)s)
"""
WORKFLOW_DONE_SQL = "SELECT status FROM jobcore.workflows WHERE id = %(id)s"
SINCE_SQL = "SELECT id FROM jobcore.jobs WHERE created_at >= %(since)s AND type = 'noop'"


def steps(options: Options) -> int:
    return options.runs


def shape(size: int) -> list[dict[str, object]]:
    """The fan-out/fan-in workflow of ``size`` no-op jobs, as ``POST /workflows`` takes it."""
    middle = [f"m{n}" for n in range(size - 2)]
    jobs: list[dict[str, object]] = [{"name": "root", "type": "noop"}]
    jobs += [{"name": name, "type": "noop", "depends_on": ["root"]} for name in middle]
    jobs.append({"name": "join", "type": "noop", "depends_on": middle})
    return jobs


async def _wait(
    conn: psycopg.AsyncConnection[dict[str, object]],
    sql: str,
    params: dict[str, object],
    done: object,
) -> None:
    deadline = time.monotonic() + DONE_TIMEOUT
    while True:
        cursor = await conn.execute(sql, params)
        row = await cursor.fetchone()
        if row is not None and done(row):  # type: ignore[operator]
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the jobs did not finish within {DONE_TIMEOUT:g}s: {row}")
        await asyncio.sleep(POLL)


async def _create_workflow(port: int, auth: dict[str, str], size: int) -> tuple[uuid.UUID, float]:
    body = orjson.dumps({"jobs": shape(size)})
    conn = await Connection.open(port)
    try:
        started = time.perf_counter()
        status, answer = await conn.send(post(port, "/workflows", body, auth))
        seconds = time.perf_counter() - started
    finally:
        conn.close()
    if status != 201:
        raise RuntimeError(f"POST /workflows answered {status}: {answer[:300]!r}")
    return uuid.UUID(orjson.loads(answer)["id"]), seconds


async def run(bench: Bench) -> Section:
    options = bench.options
    size = max(4, options.jobs)
    small = max(4, size // 10)
    section = Section(
        "workflow",
        TITLE,
        f"A root, {size - 2} jobs depending on it and one depending on all of those, "
        f"{size} no-op jobs: created by one `POST /workflows` and run (readiness counted by "
        "the database in each settle's transaction), against the same jobs sent by single "
        f"`POST /jobs/noop` requests ({SINGLE_CLIENTS} clients) by a client that waits for "
        f"each stage; one relay and one worker process; {options.runs} interleaved runs. "
        f"Creation cost per job is also measured for a workflow of {small} jobs.",
    )
    async with (
        bench.scratch("workflow") as config,
        bench.stack(config, "workflow", relays=1, workers=1) as stack,
    ):
        port = stack.api_port
        auth = {"Authorization": f"Bearer {stack.api_key}"}
        single = post(port, "/jobs/noop", b"{}", auth)
        figures: dict[str, list[float]] = defaultdict(list)
        async with await psycopg.AsyncConnection.connect(
            config.database_url, autocommit=True, row_factory=psycopg.rows.dict_row
        ) as db:
            # Warm-up: connections, plans, the worker's first jobs.
            await http_load(port, single, SINGLE_CLIENTS, 50)
            warm, _ = await _create_workflow(port, auth, 10)
            await _wait(db, WORKFLOW_DONE_SQL, {"id": warm}, lambda r: r["status"] != "running")
            for run_number in range(options.runs):
                bench.step(f"workflow: run {run_number + 1}")
                # The workflow: one request, then the database releases each stage.
                started = time.perf_counter()
                workflow_id, create_seconds = await _create_workflow(port, auth, size)
                await _wait(
                    db, WORKFLOW_DONE_SQL, {"id": workflow_id}, lambda r: r["status"] != "running"
                )
                total = time.perf_counter() - started
                figures["create"].append(round(size / create_seconds, 1))
                figures["run"].append(round(size / total, 1))
                figures["create_us"].append(round(1e6 * create_seconds / size, 1))
                # A ten times smaller workflow: its creation cost per job.
                small_id, small_seconds = await _create_workflow(port, auth, small)
                figures["create_us_small"].append(round(1e6 * small_seconds / small, 1))
                await _wait(
                    db, WORKFLOW_DONE_SQL, {"id": small_id}, lambda r: r["status"] != "running"
                )
                # One at a time: the client waits for each stage before sending the next.
                cursor = await db.execute("SELECT now() AS now")
                since = (await cursor.fetchone() or {})["now"]
                started = time.perf_counter()
                sent_seconds = 0.0
                for count in (1, size - 2, 1):
                    _, seconds, errors = await http_load(
                        port, single, min(SINGLE_CLIENTS, count), count
                    )
                    if errors:
                        raise RuntimeError(f"one at a time: {errors} requests failed")
                    sent_seconds += seconds
                    cursor = await db.execute(SINCE_SQL, {"since": since})
                    ids = [row["id"] for row in await cursor.fetchall()]
                    await _wait(db, DONE_SQL, {"ids": ids}, lambda r: r["open"] == 0)
                total = time.perf_counter() - started
                figures["single_create"].append(round(size / sent_seconds, 1))
                figures["single_run"].append(round(size / total, 1))
        section.add(
            Figure(
                f"{size} jobs, one POST /workflows",
                "jobs created/s",
                figures["create"],
                f"single POST /jobs/noop, {SINGLE_CLIENTS} clients",
                figures["single_create"],
            )
        )
        section.add(
            Figure(
                f"{size} jobs, workflow",
                "jobs run/s (first request to last job)",
                figures["run"],
                "one at a time, the client waiting for each stage",
                figures["single_run"],
            )
        )
        section.add(
            Figure(
                f"{size} jobs",
                "µs to create, per job",
                figures["create_us"],
                f"{small} jobs",
                figures["create_us_small"],
                better="lower",
            )
        )
    return section
