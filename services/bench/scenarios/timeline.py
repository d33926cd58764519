"""timeline: what recording the job timeline (``job_events``) costs the hot path.

Two measurements, each with events on against events off, interleaved on, off, on, off:

- **statements**: the hot path's own statements on one connection of one database, no
  HTTP, no broker: ``jobs`` no-op jobs enqueued as the API does and drained 100 at a time
  by :class:`jobcore.testing.draining.InlineWorker` (the relay's claim and its
  delete-when-confirmed, the worker's claim and its success), events switched off by
  ``JOBCORE_JOB_EVENTS=false`` on the other arm's pool. PostgreSQL CPU is that
  connection's backend's, so other databases on a shared server do not count, and both
  arms run against the same tables. This is the precise figure.
- **pipeline**: the e2e pipeline twice, side by side: an API, a relay and a worker on a
  database of their own with events on, and the same on another with
  ``JOBCORE_JOB_EVENTS=false``. Each run POSTs ``jobs`` no-op jobs to one of them and waits
  until all have succeeded. Per run: jobs/s (first created_at to last finished_at, as
  e2e) and the CPU of the PostgreSQL backends connected to that run's database
  (pg_stat_activity, read at both ends of the run), in ms per job: only its own, where
  counting every ``postgres`` process would count other databases' work on a shared
  server. Server-wide processes (WAL writer, checkpointer) are left out of both arms.
  Under load from other work on the machine the pipeline's batching, and so its cost per
  job, varies from run to run.

The ratio on/off of the medians is the timeline's cost.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from jobcore.db import Database
from jobcore.registry import load_job_modules
from jobcore.settings import Settings
from jobcore.testing.draining import InlineWorker
from services.bench.harness import Bench, Options, pids
from services.bench.http import http_load, post
from services.bench.measure import CpuMeter, cpu_seconds, merge_cpu
from services.bench.report import Figure, Section
from services.bench.scenarios.e2e import HTTP_CLIENTS, db_now, run_stats, smoke_check, wait_done

TITLE = "The job timeline's cost: e2e with events on vs off"
ARMS = ("on", "off")
WARM_UP_JOBS = 200

BACKENDS = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND application_name NOT LIKE 'bench-%'
"""


# Jobs enqueued, then drained, at a time in the statements measurement.
CHUNK = 100


def steps(options: Options) -> int:
    return 3 * options.runs


async def backend_pids(db: Database, application_name: str) -> list[int]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %(name)s",
            {"name": application_name},
        )
        return [row["pid"] for row in await cur.fetchall()]


def precise_cpu_seconds(pid: int) -> float:
    """A process's CPU time in nanoseconds from the scheduler (``/proc/PID/schedstat``):
    a chunk of a hundred jobs costs its backend tenths of a second, which the tick-counted
    ``stat`` would round to 10 ms steps."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return cpu_seconds(pid)


async def cpu_of_backends(probe: Database, application_name: str) -> float:
    """CPU seconds used so far by the backends of the pool named ``application_name``."""
    return sum(map(precise_cpu_seconds, await backend_pids(probe, application_name)))


async def statements_chunk(worker: InlineWorker, n: int) -> None:
    """``n`` no-op jobs enqueued as the API does, then drained to succeeded."""
    for _ in range(n):
        await worker.enqueue("noop", {}, tenant="bench")
    drained = await worker.drain(timeout=600)
    if drained.succeeded != n:
        raise RuntimeError(f"{drained} did not run every job of the chunk")


async def measure_statements(bench: Bench, section: Section) -> None:
    """Per run, ``jobs`` jobs through each arm, alternating arms every CHUNK jobs (and
    which goes first), so that a change in the machine's load falls on both alike."""
    options = bench.options
    n = options.jobs
    pg_ms: dict[str, list[float]] = {a: [] for a in ARMS}
    rates: dict[str, list[float]] = {a: [] for a in ARMS}
    async with bench.scratch("timeline-statements") as config:
        registry = load_job_modules(config.job_modules)
        probe = Database(config, min_size=1, max_size=1, name="bench-probe")
        pools = {
            name: Database(
                config.model_copy(update={"job_events": name == "on"}),
                min_size=1,
                max_size=1,
                name=f"statements-{name}",
            )
            for name in ARMS
        }
        await probe.open(wait=True)
        for db in pools.values():
            await db.open(wait=True)
        try:
            workers = {
                name: InlineWorker(db, registry=registry, worker_id=f"statements-{name}")
                for name, db in pools.items()
            }
            for name in ARMS:  # warm-up: caches, plans, the tables' first pages
                await statements_chunk(workers[name], CHUNK)
            for run_number in range(options.runs):
                bench.step(f"timeline: statements, run {run_number + 1} of {options.runs}")
                used = dict.fromkeys(ARMS, 0.0)
                wall = dict.fromkeys(ARMS, 0.0)
                for i, first in enumerate(range(0, n, CHUNK)):
                    for name in ARMS if i % 2 == 0 else ARMS[::-1]:
                        cpu_before = await cpu_of_backends(probe, f"statements-{name}")
                        started = time.perf_counter()
                        await statements_chunk(workers[name], min(CHUNK, n - first))
                        wall[name] += time.perf_counter() - started
                        cpu_after = await cpu_of_backends(probe, f"statements-{name}")
                        used[name] += cpu_after - cpu_before
                for name in ARMS:
                    pg_ms[name].append(round(1000 * used[name] / n, 3))
                    rates[name].append(round(n / wall[name], 1))
            events = {name: await count_events(probe, f"statements-{name}") for name in ARMS}
        finally:
            for db in (*pools.values(), probe):
                await db.close()
    if events["off"] != 0:
        raise RuntimeError(f"events off wrote {events['off']} events: the switch leaks")
    section.add(
        Figure(
            f"statements, {n:,} jobs, events on",
            "PostgreSQL CPU ms/job",
            pg_ms["on"],
            "events off",
            pg_ms["off"],
            better="lower",
        )
    )
    section.add(
        Figure(
            f"statements, {n:,} jobs, events on",
            "jobs/s (one connection)",
            rates["on"],
            "events off",
            rates["off"],
        )
    )
    section.details["statements"] = {
        "pg_cpu_ms_per_job": pg_ms,
        "jobs_per_second": rates,
        "events_per_job_on": round(events["on"] / ((options.runs * n) + CHUNK), 2),
    }


async def count_events(db: Database, worker_id: str) -> int:
    """Events of the jobs the worker ``worker_id`` claimed."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM job_events JOIN jobs ON jobs.id = job_events.job_id"
            " WHERE jobs.worker_id = %(worker)s",
            {"worker": worker_id},
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


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
        cur = await conn.execute("SELECT count(*) AS n FROM job_events")
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def run(bench: Bench) -> Section:
    options = bench.options
    n = options.jobs
    section = Section(
        "timeline",
        TITLE,
        f"Events on against JOBCORE_JOB_EVENTS=false (the baseline), {options.runs} runs of "
        f"each, interleaved on, off, on, off. Statements: {n:,} no-op jobs per run enqueued "
        f"and drained {CHUNK} at a time on one connection by the hot path's statements "
        f"(InlineWorker), PostgreSQL CPU of that connection's backend. Pipeline: {n:,} "
        f"no-op jobs per run POSTed over {HTTP_CLIENTS} keep-alive connections to one API, "
        f"published by one relay, run by one worker (separate processes), on two stacks "
        f"with databases of their own; PostgreSQL CPU of the backends connected to the "
        f"run's database. Both in ms per job.",
    )
    await measure_statements(bench, section)
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
            await http_load(stack.api_port, request, HTTP_CLIENTS, WARM_UP_JOBS)
            await wait_done(db, since, WARM_UP_JOBS, stack.processes, 120)
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
