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

Many workflows at once (``--workflows``, e.g. 1,000 and 10,000): that many small diamonds
of 4 no-op jobs (a; b and c after a; d after both), each its own ``POST /workflows`` from
:data:`MANY_CLIENTS` keep-alive connections, against as many jobs sent by single
``POST /jobs/noop`` requests from the same connections, in the same run. Both are sent
while the ``noop`` type is paused (so creation is measured alone), then resumed and drained
by the relay and the worker: the workflows' drain includes readiness (each dependent
released by the trigger in its dependency's settle, then published), the single jobs'
has none, so the difference per job is what readiness costs. Each is reported in µs per
job, with each process group's CPU (the bench itself, the load generator, as ``bench``)
in % and in CPU-ms per job; the largest count's per-job costs against the smallest's show
whether they stay flat as the count grows.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections import defaultdict
from typing import Any

import orjson
import psycopg

from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.usecases.pauses import set_paused
from services.bench.harness import Bench, Options, pids
from services.bench.http import Connection, http_load, post
from services.bench.measure import CpuMeter, merge_cpu, ms_per_job
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
# Connections sending the many workflows (and the single jobs they are compared with).
MANY_CLIENTS = 16
# The small workflow sent many times: a diamond of four no-op jobs.
DIAMOND: list[dict[str, object]] = [
    {"name": "a", "type": "noop"},
    {"name": "b", "type": "noop", "depends_on": ["a"]},
    {"name": "c", "type": "noop", "depends_on": ["a"]},
    {"name": "d", "type": "noop", "depends_on": ["b", "c"]},
]
# Every job of the scenario's database has ended (nothing else runs there meanwhile).
ALL_DONE_SQL = (
    "SELECT NOT EXISTS (SELECT 1 FROM jobcore.jobs WHERE status IN ('pending', 'running')) AS done"
)
# How often a drain looks whether every job has ended: each look (an index probe) is
# PostgreSQL CPU that counts in the drain's figures, and the wait past the end is its time.
MANY_POLL = 0.05
ACTOR = "bench:workflow"


def steps(options: Options) -> int:
    return options.runs * (1 + len(options.workflow_counts))


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


async def _drained(conn: psycopg.AsyncConnection[dict[str, object]], stack: Any) -> None:
    """Until every job of the database has ended; fail if a process of the stack died."""
    deadline = time.monotonic() + DONE_TIMEOUT
    while True:
        cursor = await conn.execute(ALL_DONE_SQL)
        row = await cursor.fetchone()
        if row is not None and row["done"]:
            return
        dead = [p.name for p in stack.processes if not p.alive]
        if dead:
            raise RuntimeError(f"{', '.join(dead)} exited during the run; see the logs")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the jobs did not finish within {DONE_TIMEOUT:g}s")
        await asyncio.sleep(MANY_POLL)


class ManyRun:
    """One phase of the many-workflows case (creation, then the drain from the resume):
    its µs per job, and each process group's CPU % and CPU-ms per job."""

    def __init__(self) -> None:
        self.us_per_job: dict[str, float] = {}
        self.cpu_pct: dict[str, dict[str, float]] = {}
        self.cpu_ms: dict[str, dict[str, float]] = {}


async def _many_phase(
    config: Settings,
    stack: Any,
    db: psycopg.AsyncConnection[dict[str, object]],
    request: bytes,
    count: int,
    jobs_per_request: int,
    expect: int,
) -> ManyRun:
    """``count`` requests of ``request`` over :data:`MANY_CLIENTS` connections while the
    ``noop`` type is paused, then its resume and the drain of every job they made."""
    jobs = count * jobs_per_request
    result = ManyRun()
    meter = CpuMeter(pids(stack))
    pauses = Database(config, min_size=1, max_size=1, name="bench-workflow")
    await pauses.open(wait=True)
    try:
        await set_paused(pauses, "type", "noop", paused=True, actor=ACTOR)
        meter.start()
        # Bounded in time as the drain is: an API that stopped answering fails the run.
        _, seconds, errors = await asyncio.wait_for(
            http_load(stack.api_port, request, min(MANY_CLIENTS, count), count, expect=expect),
            DONE_TIMEOUT,
        )
        result.cpu_pct["create"] = meter.stop()
        result.cpu_ms["create"] = ms_per_job(meter.seconds, jobs)
        if errors:
            raise RuntimeError(f"{errors} of {count} requests failed")
        result.us_per_job["create"] = round(1e6 * seconds / jobs, 1)
        meter.start()
        await set_paused(pauses, "type", "noop", paused=False, actor=ACTOR)
        await _drained(db, stack)
        result.cpu_pct["drain"] = meter.stop()
        result.cpu_ms["drain"] = ms_per_job(meter.seconds, jobs)
        result.us_per_job["drain"] = round(1e6 * meter.wall / jobs, 1)
    finally:
        await pauses.close()
    return result


def _median_ms(samples: list[dict[str, float]]) -> dict[str, float]:
    names = sorted({name for sample in samples for name in sample})
    return {name: round(statistics.median(s.get(name, 0.0) for s in samples), 3) for name in names}


async def many_workflows(bench: Bench, config: Settings, stack: Any, section: Section) -> None:
    """The many-workflows case at each of ``--workflows``' counts, ``--runs`` times,
    interleaved with its baseline (see the module)."""
    options = bench.options
    counts = options.workflow_counts
    if not counts:
        return
    port = stack.api_port
    auth = {"Authorization": f"Bearer {stack.api_key}"}
    requests = {
        "workflows": (post(port, "/workflows", orjson.dumps({"jobs": DIAMOND}), auth), 4, 201),
        "single": (post(port, "/jobs/noop", b"{}", auth), 1, 202),
    }
    figures: dict[str, list[float]] = defaultdict(list)
    cpu_pct: dict[str, list[dict[str, float]]] = defaultdict(list)
    cpu_ms: dict[str, list[dict[str, float]]] = defaultdict(list)
    async with await psycopg.AsyncConnection.connect(
        config.database_url, autocommit=True, row_factory=psycopg.rows.dict_row
    ) as db:
        for run_number in range(options.runs):
            for count in counts:
                bench.step(f"workflow: {count:,} workflows at once, run {run_number + 1}")
                for case, (request, per_request, expect) in requests.items():
                    # The single jobs are as many as the workflows' jobs.
                    sent = count if case == "workflows" else 4 * count
                    measured = await _many_phase(
                        config, stack, db, request, sent, per_request, expect
                    )
                    label = (
                        f"{count:,} workflows" if case == "workflows" else f"{sent:,} single jobs"
                    )
                    for phase, value in measured.us_per_job.items():
                        figures[f"{count} {case} {phase}"].append(value)
                        cpu_pct[f"{label}: {phase}"].append(measured.cpu_pct[phase])
                        cpu_ms[f"{label}: {phase}"].append(measured.cpu_ms[phase])
    for count in counts:
        for phase, metric in (
            ("create", "µs to create, per job"),
            ("drain", "µs to drain from the resume, per job (readiness included)"),
        ):
            baseline = (
                f"{4 * count:,} single POST /jobs/noop, {MANY_CLIENTS} clients"
                if phase == "create"
                else f"{4 * count:,} single jobs (no readiness)"
            )
            section.add(
                Figure(
                    f"{count:,} workflows of 4 jobs at once, {MANY_CLIENTS} clients",
                    metric,
                    figures[f"{count} workflows {phase}"],
                    baseline,
                    figures[f"{count} single {phase}"],
                    better="lower",
                )
            )
    if len(counts) > 1:
        # Flat: the largest count's per-job cost against the smallest's (a ratio near 1).
        low, high = counts[0], counts[-1]
        for phase, metric in (
            ("create", "µs to create, per job (flatness)"),
            ("drain", "µs to drain, per job (flatness)"),
        ):
            section.add(
                Figure(
                    f"{high:,} workflows at once",
                    metric,
                    figures[f"{high} workflows {phase}"],
                    f"{low:,} workflows at once",
                    figures[f"{low} workflows {phase}"],
                    better="lower",
                )
            )
    for case, samples in cpu_pct.items():
        section.cpu_pct[case] = merge_cpu(samples)
    for case, samples in cpu_ms.items():
        section.cpu_ms_per_job[case] = _median_ms(samples)


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
        f"Creation cost per job is also measured for a workflow of {small} jobs."
        + (
            f" Many workflows at once: {', '.join(f'{c:,}' for c in options.workflow_counts)} "
            f"diamonds of 4 no-op jobs, one POST /workflows each from {MANY_CLIENTS} "
            "connections, against as many jobs by single POST /jobs/noop requests, both sent "
            "while the type is paused (creation alone), then resumed and drained by the relay "
            "and the worker (the workflows' drain includes the release of each dependent); "
            "µs per job, and CPU per process group (`bench` is the load generator)."
            if options.workflow_counts
            else ""
        ),
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
        await many_workflows(bench, config, stack, section)
    return section
