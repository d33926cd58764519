"""timeline_e2e: what recording the job timeline (``job_events``) costs, through the whole
e2e pipeline; ``timeline`` measures the hot path's statements alone, more precisely.

The e2e pipeline twice, side by side: an API, a relay and a worker on a database of their
own with events on, and the same on another with ``JOBCORE_JOB_EVENTS=false``. Each run
POSTs ``jobs`` no-op jobs to one of them and waits until all have succeeded, the two
interleaved (on, off, on, off, ...). Per run: jobs/s (first created_at to last
finished_at, as e2e) and the CPU of the PostgreSQL backends connected to that run's
database (pg_stat_activity, read at both ends of the run), in ms per job: only its own,
where counting every ``postgres`` process would count other databases' work on a shared
server. Server-wide processes (WAL writer, checkpointer) are left out of both arms. Under
load from other work on the machine the pipeline's batching, and so its cost per job,
varies from run to run. The ratio on/off of the medians is the timeline's cost.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from services.bench.harness import Bench, Options, pids
from services.bench.http import http_load, post
from services.bench.measure import CpuMeter, cpu_seconds, merge_cpu
from services.bench.report import Figure, Section
from services.bench.scenarios.e2e import HTTP_CLIENTS, db_now, run_stats, smoke_check, wait_done
from services.bench.scenarios.timeline import ARMS

TITLE = "The job timeline's cost through the pipeline: e2e with events on vs off"
WARM_UP_JOBS = 200

BACKENDS = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND application_name NOT LIKE 'bench-%'
"""


def steps(options: Options) -> int:
    return 2 * options.runs


class BackendCpu:
    """CPU seconds used by the backends of one database between start() and stop(); the
    bench's own connections (its polls) are left out. A backend that started in between
    counts in full, one that ended in between is missed (pooled connections outlive a
    run)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def _pids(self) -> list[int]:
        async with self.db.connection() as conn:
            cur = await conn.execute(BACKENDS)
            return [row["pid"] for row in await cur.fetchall()]

    async def start(self) -> None:
        self._start = {pid: cpu_seconds(pid) for pid in await self._pids()}

    async def stop(self) -> float:
        end = {pid: cpu_seconds(pid) for pid in await self._pids()}
        return sum(max(0.0, cpu - self._start.get(pid, 0.0)) for pid, cpu in end.items())


@contextlib.asynccontextmanager
async def arm(bench: Bench, name: str) -> AsyncIterator[tuple[Settings, Any, Database]]:
    env = {} if name == "on" else {"JOBCORE_JOB_EVENTS": "false"}
    async with (
        bench.scratch(f"timeline-{name}") as config,
        bench.stack(config, f"timeline-{name}", relays=1, workers=1, env=env) as stack,
    ):
        db = Database(config, min_size=1, max_size=2, name=f"bench-timeline-{name}")
        await db.open(wait=True)
        try:
            yield config, stack, db
        finally:
            await db.close()


async def events_written(db: Database) -> int:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM jobcore.job_events")
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def run(bench: Bench) -> Section:
    options = bench.options
    n = options.jobs
    section = Section(
        "timeline_e2e",
        TITLE,
        f"Events on against JOBCORE_JOB_EVENTS=false (the baseline), {options.runs} runs of "
        f"each, interleaved on, off, on, off: {n:,} no-op jobs per run POSTed over "
        f"{HTTP_CLIENTS} keep-alive connections to one API, "
        f"published by one relay, run by one worker (separate processes), on two stacks "
        f"with databases of their own; PostgreSQL CPU of the backends connected to the "
        f"run's database, in ms per job.",
    )
    rates: dict[str, list[float]] = {a: [] for a in ARMS}
    pg_ms: dict[str, list[float]] = {a: [] for a in ARMS}
    done_p50: dict[str, list[float]] = {a: [] for a in ARMS}
    cpu: dict[str, list[dict[str, float]]] = {a: [] for a in ARMS}
    events: dict[str, int] = {}
    async with arm(bench, "on") as on, arm(bench, "off") as off:
        stacks = {"on": on, "off": off}
        for _, stack, db in stacks.values():
            request = post(
                stack.api_port, "/jobs/noop", b"{}", {"Authorization": f"Bearer {stack.api_key}"}
            )
            since = await db_now(db)
            # Untimed: a POST refused under load (a 503) is only one job fewer to wait for.
            _, _, refused = await http_load(stack.api_port, request, HTTP_CLIENTS, WARM_UP_JOBS)
            await wait_done(db, since, WARM_UP_JOBS - refused, stack.processes, 300)
            await smoke_check(stack.api_url, stack.api_key)
        for run_number in range(options.runs):
            for name in ARMS:
                bench.step(
                    f"timeline: pipeline, events {name}, run {run_number + 1} of {options.runs}"
                )
                _, stack, db = stacks[name]
                request = post(
                    stack.api_port,
                    "/jobs/noop",
                    b"{}",
                    {"Authorization": f"Bearer {stack.api_key}"},
                )
                since = await db_now(db)
                backends = BackendCpu(db)
                meter = CpuMeter(pids(stack))
                await backends.start()
                meter.start()
                _, _, errors = await http_load(stack.api_port, request, HTTP_CLIENTS, n)
                if errors:
                    raise RuntimeError(f"{errors} of {n} POSTs were not accepted")
                await wait_done(db, since, n, stack.processes, 600)
                cpu[name].append(meter.stop())
                pg_seconds = await backends.stop()
                stats = await run_stats(db, since)
                rates[name].append(round(stats["jobs"] / float(stats["seconds"]), 1))
                pg_ms[name].append(round(1000 * pg_seconds / stats["jobs"], 3))
                done_p50[name].append(round(1000 * float(stats["done_p50"]), 1))
        for name, (_, _, db) in stacks.items():
            events[name] = await events_written(db)
    if events["off"] != 0:
        raise RuntimeError(f"events off wrote {events['off']} events: the switch leaks")
    section.add(
        Figure(
            f"pipeline, {n:,} jobs, events on", "jobs/s", rates["on"], "events off", rates["off"]
        )
    )
    section.add(
        Figure(
            f"pipeline, {n:,} jobs, events on",
            "PostgreSQL CPU ms/job",
            pg_ms["on"],
            "events off",
            pg_ms["off"],
            better="lower",
        )
    )
    section.add(
        Figure(
            "pipeline, events on",
            "enqueue→done p50 ms",
            done_p50["on"],
            "events off",
            done_p50["off"],
            better="lower",
        )
    )
    section.cpu_pct = {f"events {name}": merge_cpu(cpu[name]) for name in ARMS}
    section.details["pipeline"] = {
        "pg_cpu_ms_per_job": pg_ms,
        "jobs_per_second": rates,
        "events_per_job_on": round(events["on"] / ((options.runs * n) + WARM_UP_JOBS + 1), 2),
    }
    return section
