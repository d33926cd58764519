"""timeline: what recording the job timeline (``job_events``) costs the hot path's
statements, events on against events off (``JOBCORE_JOB_EVENTS=false``).

The hot path's own statements on one connection per arm, one database, no HTTP, no
broker: ``jobs`` no-op jobs per run and arm, enqueued as the API does and drained 100 at a
time by :class:`jobcore.testing.draining.InlineWorker` (the relay's claim and its
delete-when-confirmed, the worker's claim and its success), the arms alternating every
100 jobs (and which goes first) so that a change in the machine's load falls on both
alike. PostgreSQL CPU is that connection's backend's (from the scheduler, in ns), so
other databases on a shared server do not count, and both arms run against the same
tables. The ratio on/off of the medians is the timeline's cost. ``timeline_e2e`` measures
it through the whole pipeline (API, relay, worker as processes), less precisely.
"""

from __future__ import annotations

import time

from jobcore.database.gateway import Database
from jobcore.execution.registry import load_job_modules
from jobcore.testing.draining import InlineWorker
from services.bench.harness import Bench, Options
from services.bench.measure import cpu_seconds
from services.bench.report import Figure, Section

TITLE = "The job timeline's cost to the hot path's statements: events on vs off"
ARMS = ("on", "off")

# Jobs enqueued, then drained, at a time in the statements measurement.
CHUNK = 100


def steps(options: Options) -> int:
    return options.runs


async def backend_pids(db: Database, application_name: str) -> list[int]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %(name)s",
            {"name": application_name},
        )
        return [row["pid"] for row in await cur.fetchall()]


async def cpu_of_backends(probe: Database, application_name: str) -> dict[int, float]:
    """CPU seconds used so far by each backend of the pool named ``application_name``."""
    return {pid: cpu_seconds(pid) for pid in await backend_pids(probe, application_name)}


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used in between: a backend that replaced another (a reconnect) counts
    in full, one that ended in between is missed."""
    return sum(max(0.0, cpu - before.get(pid, 0.0)) for pid, cpu in after.items())


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
                        used[name] += cpu_between(cpu_before, cpu_after)
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
        # The same run's on/off: each run's arms shared the machine's load alike.
        "paired_ratios": [
            round(on / off, 3) for on, off in zip(pg_ms["on"], pg_ms["off"], strict=True)
        ],
        "jobs_per_second": rates,
        "events_per_job_on": round(events["on"] / ((options.runs * n) + CHUNK), 2),
    }


async def count_events(db: Database, worker_id: str) -> int:
    """Events of the jobs the worker ``worker_id`` claimed."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM jobcore.job_events"
            " JOIN jobcore.jobs ON jobs.id = job_events.job_id"
            " WHERE jobs.worker_id = %(worker)s",
            {"worker": worker_id},
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def run(bench: Bench) -> Section:
    options = bench.options
    section = Section(
        "timeline",
        TITLE,
        f"Events on against JOBCORE_JOB_EVENTS=false (the baseline), {options.runs} runs of "
        f"each: {options.jobs:,} no-op jobs per run and arm enqueued and drained {CHUNK} at "
        f"a time on one connection by the hot path's statements (InlineWorker), the arms "
        f"alternating every {CHUNK} jobs; PostgreSQL CPU of that connection's backend, in "
        f"ms per job. `timeline_e2e` measures the same through the whole pipeline.",
    )
    await measure_statements(bench, section)
    return section
