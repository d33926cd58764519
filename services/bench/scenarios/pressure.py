"""pressure: jobcore at a steady rate while PostgreSQL is put under the pressures a
production database applies, each phase against the clean phase of the same run.

Runs on a cluster of its own (scripts/pressure_cluster.sh, started here: autovacuum on,
pg_stat_statements and pgstattuple), never on the shared one, with one API, one relay and
two workers as OS processes. An open-loop generator (services/bench/pressure_load.py)
POSTs ``effect`` jobs, whose handler records one row in the effects ledger when it
succeeds, at ``--pressure-rate`` per second through these phases, each followed by a
recovery window at the same rate:

- clean: nothing else;
- pin: one connection takes an XID (``BEGIN; SELECT txid_current()``) and stays idle in its
  transaction, pinning the xmin horizon, for ``--pressure-pin`` seconds;
- readers: 4 REPEATABLE READ connections scan the hot tables over and over, each
  transaction lasting ``READER_TRANSACTION`` seconds;
- overload: 1.5× the capacity measured just before (a burst at 3× the rate, the highest
  5-second completion rate it reached), then back to the rate;
- kills: ``--pressure-kill-rate`` pg_terminate_backend a second against jobcore's backends;
- pool: idle connections held until the cluster has max_connections − 3 backends (jobcore's
  own backends terminated first, so its pools must win a slot back), then released;
- restart: the pressure cluster restarted (fast shutdown);
- sigkill: one of the two workers SIGKILLed every ``SIGKILL_EVERY`` seconds and started
  again.

Measured per window: offered, accepted and completed jobs/s; pickup latency (created →
started) p50/p95/p99 from a bounded histogram; the hot tables' dead tuples (the statistics
collector's and pgstattuple's) and table and index sizes at its end; the top wait events
(pg_stat_activity every 0.25 s); the slowest statements (pg_stat_statements); CPU of each
process group, the generator's own included; 503s and whether each carried Retry-After;
requests unanswered after the generator's timeout. At the end, after the pipeline drained:
jobs lost (202s without a finished job) and duplicate effects, per window by creation time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from jobcore.database.schema import HOT_TABLES
from jobcore.kernel.settings import load_settings
from jobcore.testing.pipeline import Stack, archive_pruned
from jobcore.testing.processes import ROOT
from services.bench.harness import Bench, Options, pids, relays_ready
from services.bench.measure import CpuMeter
from services.bench.pressure_load import (
    MARK,
    Completions,
    Histogram,
    Monitor,
    OpenLoad,
    Window,
    connect,
)
from services.bench.report import Figure, Section, Series

TITLE = "Pressure and chaos as a production database applies them"
PHASES = ("clean", "pin", "readers", "overload", "kills", "pool", "restart", "sigkill")
# Only the test job types: the examples (jobcore.examples.jobtypes) include one that may run ten
# minutes, which would need a consumer timeout, and so an inbox window, of as long.
JOB_MODULES = ("jobcore.testing.jobtypes",)
CLUSTER_SCRIPT = ROOT / "scripts" / "pressure_cluster.sh"
READERS = 4
READER_TRANSACTION = 10.0  # seconds each reader's REPEATABLE READ transaction lasts
OVERLOAD = 1.5
PROBE_FACTOR = 3.0  # the capacity probe offers this × the rate
SIGKILL_EVERY = 10.0
TOP_WAITS = 5
TOP_STATEMENTS = 8
RECOVERY_SPAN = 5  # seconds of the sliding window "back to clean" is judged on
SETTLED_SPAN = 120.0  # seconds before the pin over which its "before" size must be flat
RATE_BACK = 0.9  # × the clean completed rate
RESUME_LIMIT = 600  # seconds after the pool's release work_resumed looks
P95_BACK = 3.0  # × the clean pickup p95
DRAIN_TIMEOUT = 600.0
RESERVED = 3  # connection slots pool exhaustion leaves (superuser_reserved_connections)
# Finished jobs kept two minutes, so the jobs table reaches a steady size within the warm-up
# (the default week would grow it throughout, hiding what a phase adds); the inbox window
# as short as five deliveries of a minute allow (the test job types hold a slot < 60 s).
RETENTION = 120
STACK_ENV = {
    "JOBCORE_RETENTION_SUCCEEDED": str(RETENTION),
    "JOBCORE_RETENTION_FAILED": str(RETENTION),
    "JOBCORE_RETENTION_CANCELLED": str(RETENTION),
    "JOBCORE_PRUNER_INTERVAL": "10",
    "JOBCORE_AMQP_DELIVERY_LIMIT": "5",
    "JOBCORE_AMQP_CONSUMER_TIMEOUT": "60",
    "JOBCORE_INBOX_RETENTION": "300",
}

PGSTATTUPLE = MARK + "SELECT dead_tuple_count, tuple_count FROM pgstattuple(%(table)s::regclass)"
# One row per statement text, keyed by it: a prepared statement made again after an
# ANALYZE (the analyzer runs in every phase) gets a new queryid for the same text, and a
# phase compared with another by queryid would miss it (services/bench/pgstats.py).
STATEMENTS = (
    MARK
    + """
SELECT md5(query) AS key, left(regexp_replace(query, '\\s+', ' ', 'g'), 110) AS query,
       sum(calls)::bigint AS calls, sum(total_exec_time) AS total_exec_time,
       sum(shared_blks_hit + shared_blks_read)::bigint AS blocks
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query NOT LIKE '%%bench-pressure%%'
GROUP BY query HAVING sum(calls) > 0
"""
)
RESET_STATEMENTS = (
    MARK + "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
    " WHERE datname = current_database()), 0)"
)
JOBCORE_BACKENDS = (
    MARK
    + """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND application_name LIKE 'jobcore-%%' AND pid <> pg_backend_pid()
"""
)
BACKENDS = MARK + "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
# Each window's jobs by creation time, once the pipeline drained (live, or deleted by the
# pruner and archived): how many, how many not finished, failed, with an effect twice, and
# succeeded without one.
OUTCOMES = (
    MARK
    + """
WITH bounds AS (
    SELECT to_timestamp(t0) AS t0, to_timestamp(t1) AS t1, window_index
    FROM unnest(%(starts)s::float8[], %(ends)s::float8[]) WITH ORDINALITY
        AS b(t0, t1, window_index)
), every_job AS (
    SELECT id, status, created_at FROM jobcore.jobs
    UNION ALL SELECT id, status, created_at FROM public.pruned_jobs
), effects AS (
    SELECT job_id, count(*) AS n FROM (
        SELECT job_id FROM jobcore.job_effects UNION ALL SELECT job_id FROM public.pruned_effects
    ) e GROUP BY job_id
)
SELECT b.window_index, count(*) AS jobs,
       count(*) FILTER (WHERE j.status NOT IN ('succeeded', 'failed', 'cancelled')) AS open,
       count(*) FILTER (WHERE j.status = 'failed') AS failed,
       count(*) FILTER (WHERE coalesce(e.n, 0) > 1) AS duplicates,
       count(*) FILTER (WHERE j.status = 'succeeded' AND e.n IS NULL) AS missing_effects
FROM every_job j
JOIN bounds b ON j.created_at >= b.t0 AND j.created_at < b.t1
LEFT JOIN effects e ON e.job_id = j.id
GROUP BY b.window_index
"""
)
TOTALS = (
    MARK
    + """
WITH effects AS (
    SELECT job_id, count(*) AS n FROM (
        SELECT job_id FROM jobcore.job_effects UNION ALL SELECT job_id FROM public.pruned_effects
    ) e GROUP BY job_id
)
SELECT (SELECT count(*) FROM jobcore.jobs) + (SELECT count(*) FROM public.pruned_jobs) AS jobs,
       (SELECT count(*) FROM jobcore.jobs WHERE status NOT IN ('succeeded', 'failed', 'cancelled'))
           AS open,
       (SELECT count(*) FROM effects WHERE n > 1) AS duplicates
"""
)


def steps(options: Options) -> int:
    return 2 * len(PHASES) + 4


def start_cluster(port: int) -> str:
    """The pressure cluster running (created if missing); its URL."""
    result = subprocess.run(
        [str(CLUSTER_SCRIPT), "start"],
        env={**os.environ, "PRESSURE_PORT": str(port)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{CLUSTER_SCRIPT.name} start failed: {result.stderr.strip()[-300:]}")
    return result.stdout.strip().splitlines()[-1]


def restart_cluster(port: int) -> float:
    started = time.monotonic()
    subprocess.run(
        [str(CLUSTER_SCRIPT), "restart"],
        env={**os.environ, "PRESSURE_PORT": str(port)},
        capture_output=True,
        timeout=120,
        check=True,
    )
    return time.monotonic() - started


def cluster_pids(port: int) -> list[int]:
    """The pressure cluster's processes: its postmaster and every child of it."""
    pid_file = Path(f"/var/run/postgresql/15-{os.environ.get('PRESSURE_CLUSTER', 'pressure')}.pid")
    try:
        postmaster = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return []
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == postmaster:
                    children.append(int(entry.name))
    return [postmaster, *children]


async def window_end_stats(url: str) -> dict[str, Any]:
    """pgstattuple of every hot table and the statements since the last reset; then reset."""
    out: dict[str, Any] = {"pgstattuple_dead": {}, "statements": []}
    with contextlib.suppress(psycopg.Error):
        async with await connect(url, autocommit=True) as conn:
            for table in HOT_TABLES:
                cur = await conn.execute(PGSTATTUPLE, {"table": f"jobcore.{table}"})
                row = await cur.fetchone()
                if row is not None:
                    out["pgstattuple_dead"][table] = int(row[0])
            cur = await conn.execute(STATEMENTS)
            out["statements"] = [
                {
                    "key": key,
                    "query": query,
                    "calls": int(calls),
                    "mean_ms": round(total / calls, 4),
                    "total_ms": round(total, 1),
                    "blocks_per_call": round(int(blocks) / calls, 1),
                }
                for key, query, calls, total, blocks in await cur.fetchall()
            ]
            await conn.execute(RESET_STATEMENTS)
    return out


# -- the disturbances ------------------------------------------------------------------------


async def until(deadline: float) -> None:
    """Sleep until the wall clock reaches ``deadline`` (the phase's length)."""
    wait = deadline - time.time()
    if wait > 0:
        await asyncio.sleep(wait)


async def pin_horizon(url: str, deadline: float, detail: dict[str, Any]) -> None:
    async with await connect(url) as conn:
        cur = await conn.execute("SELECT txid_current()")
        row = await cur.fetchone()
        detail["pinned_xid"] = int(row[0]) if row else None
        await until(deadline)
        await conn.rollback()


async def readers(url: str, deadline: float, detail: dict[str, Any]) -> None:
    scans = Counter[str]()

    async def reader() -> None:
        while time.time() < deadline:
            with contextlib.suppress(psycopg.Error):
                async with await connect(url) as conn:
                    await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
                    ends = min(deadline, time.time() + READER_TRANSACTION)
                    while time.time() < ends:
                        for table in ("jobs", "outbox", "inbox", "job_events"):
                            await conn.execute(f"SELECT count(*) FROM jobcore.{table}")
                            scans[table] += 1
                    await conn.commit()

    await asyncio.gather(*(reader() for _ in range(READERS)))
    detail["scans"] = dict(scans)


async def kill_backends(url: str, rate: float, deadline: float, detail: dict[str, Any]) -> None:
    killed = 0
    attempts = 0
    started = time.monotonic()
    while time.time() < deadline:
        due = started + attempts / rate
        if (wait := due - time.monotonic()) > 0:
            await asyncio.sleep(wait)  # the kills' pacing
        attempts += 1
        with contextlib.suppress(psycopg.Error):
            async with await connect(url, autocommit=True) as conn:
                cur = await conn.execute(JOBCORE_BACKENDS)
                backends = [int(r[0]) for r in await cur.fetchall()]
                if backends:
                    await conn.execute(
                        "SELECT pg_terminate_backend(%(pid)s)", {"pid": random.choice(backends)}
                    )
                    killed += 1
    detail["terminated"] = killed
    detail["kill_attempts"] = attempts


async def exhaust_pool(
    url: str, deadline: float, detail: dict[str, Any], completions: Completions
) -> None:
    hogs: list[psycopg.AsyncConnection[Any]] = []
    try:
        async with await connect(url, autocommit=True) as control:
            cur = await control.execute("SHOW max_connections")
            row = await cur.fetchone()
            limit = int(row[0]) if row else 100
            target = limit - RESERVED
            fill_deadline = time.time() + 15
            for _ in range(limit * 2):  # bounded: each round opens at most one
                if time.time() > fill_deadline:
                    break
                cur = await control.execute(BACKENDS)
                row = await cur.fetchone()
                if row is None or int(row[0]) >= target:
                    break
                # jobcore's own backends go first, so its pools must win a slot back.
                cur = await control.execute(JOBCORE_BACKENDS)
                for (pid,) in await cur.fetchall():
                    await control.execute("SELECT pg_terminate_backend(%(pid)s)", {"pid": pid})
                try:
                    hogs.append(await connect(url, autocommit=True))
                except psycopg.Error:
                    break
            cur = await control.execute(BACKENDS)
            row = await cur.fetchone()
            detail["max_connections"] = limit
            detail["held_idle_connections"] = len(hogs)
            detail["backends_while_held"] = int(row[0]) if row else None
        await until(deadline)
    finally:
        for hog in hogs:
            with contextlib.suppress(psycopg.Error):
                await hog.close()
        released = time.time()
        detail["released_at"] = released
        completions.first_after[released] = None


async def sigkill_worker(stack: Stack, deadline: float, detail: dict[str, Any]) -> None:
    victim = stack.workers[-1]
    kills = 0
    for _ in range(10_000):  # bounded by the deadline below, and by count
        if time.time() >= deadline:
            break
        if victim.alive:
            assert victim.popen is not None
            victim.popen.send_signal(signal.SIGKILL)
            await asyncio.to_thread(victim.popen.wait, 10)
            kills += 1
        await stack.restart(victim, wait=False)
        await until(min(deadline, time.time() + SIGKILL_EVERY))
    with contextlib.suppress(AssertionError):
        await stack.wait_consuming(victim, timeout=60)
    detail["sigkills"] = kills


# -- figures -----------------------------------------------------------------------------------


def completed_rate(completions: Completions, start: float, end: float) -> float:
    seconds = range(int(start), int(end))
    if not seconds:
        return 0.0
    return sum(completions.per_second.get(s, 0) for s in seconds) / len(seconds)


def pickup_between(completions: Completions, start: float, end: float) -> Histogram:
    merged = Histogram()
    for second in range(int(start), int(end)):
        if second in completions.pickup_by_second:
            merged.merge(completions.pickup_by_second[second])
    return merged


def back_to_clean(
    completions: Completions, start: float, end: float, clean_rate: float, clean_p95: float
) -> float | None:
    """Seconds from ``start`` to the first RECOVERY_SPAN window (before ``end``) whose
    completed rate is at least RATE_BACK × clean and whose pickup p95 is at most
    P95_BACK × clean; None if there is none."""
    for offset in range(0, max(0, int(end - start) - RECOVERY_SPAN + 1)):
        t0 = start + offset
        rate = completed_rate(completions, t0, t0 + RECOVERY_SPAN)
        p95 = pickup_between(completions, t0, t0 + RECOVERY_SPAN).percentile(95)
        if rate >= RATE_BACK * clean_rate and p95 is not None and p95 <= P95_BACK * clean_p95:
            return float(offset)
    return None


def work_resumed(completions: Completions, release: float, clean_rate: float) -> float | None:
    """Seconds from ``release`` to the end of the first whole second after it in which
    jobs completed at half the clean rate or more (None: not within RESUME_LIMIT)."""
    for second in range(int(release) + 1, int(release) + RESUME_LIMIT):
        if completions.per_second.get(second, 0) >= 0.5 * clean_rate:
            return round(second + 1 - release, 2)
    return None


def sizes_at(monitor: Monitor, at: float) -> dict[str, dict[str, int]]:
    """The size sample nearest before ``at`` (or the first)."""
    before = [sample for t, sample in monitor.sizes if t <= at]
    return before[-1] if before else (monitor.sizes[0][1] if monitor.sizes else {})


def total_mib(sample: dict[str, dict[str, int]]) -> float:
    return sum(v["table"] + v["index"] for v in sample.values()) / 2**20


@dataclass
class Run:
    """Everything one run measured, window by window."""

    windows: list[Window] = field(default_factory=list)
    details: dict[int, dict[str, Any]] = field(default_factory=dict)
    cpu: dict[int, dict[str, float]] = field(default_factory=dict)
    end_stats: dict[int, dict[str, Any]] = field(default_factory=dict)
    exits: dict[int, list[str]] = field(default_factory=dict)


async def run(bench: Bench) -> Section:
    options = bench.options
    rate = options.pressure_rate
    phase_seconds = {name: options.pressure_phase for name in PHASES}
    phase_seconds["clean"] = options.pressure_clean
    phase_seconds["pin"] = options.pressure_pin
    recovery = options.pressure_recovery
    bench.step("pressure: starting its PostgreSQL cluster")
    server = await asyncio.to_thread(start_cluster, options.pressure_port)
    base = load_settings(database_url=server)
    own = Bench(options, base, bench.out, bench.step)
    section = Section(
        "pressure",
        TITLE,
        f"`effect` jobs POSTed open-loop at {rate:g}/s to one API (one relay, two workers) on "
        f"a PostgreSQL cluster of its own with autovacuum on (scripts/pressure_cluster.sh); "
        f"phases {', '.join(f'{p} {phase_seconds[p]:g} s' for p in PHASES)}, each followed "
        f"by {recovery:g} s of recovery at the same rate. Pickup is "
        f"created → started; 'back to clean' is the first {RECOVERY_SPAN} s window after the "
        f"phase whose completed rate is ≥ {RATE_BACK}× clean and pickup p95 ≤ {P95_BACK:g}× "
        f"clean. A warm-up of {options.pressure_warmup:g} s first (finished jobs are kept "
        f"{RETENTION} s). Load average at start {', '.join(f'{x:.2f}' for x in os.getloadavg())}.",
    )
    result = Run()
    async with own.scratch("pressure", JOB_MODULES) as config:
        url = config.database_url
        async with await connect(url, autocommit=True) as conn:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        bench.step("pressure: starting an API, a relay and two workers")
        async with own.stack(config, "pressure", relays=1, workers=2, env=STACK_ENV) as stack:
            await relays_ready(stack)
            await archive_pruned(stack.db)
            load = OpenLoad(stack.api_port, stack.api_key, rate)
            completions = Completions(url, result.windows)
            monitor = Monitor(url, result.windows, options.pressure_sample)
            # The load runs until every window is through (stop()), and at the latest an hour
            # after the longest the windows can take.
            planned = options.pressure_warmup + sum(phase_seconds.values())
            planned += (len(PHASES) + 1) * (recovery + options.pressure_phase)
            planned += options.pressure_pin_recovery + options.pressure_after_pin
            loading = asyncio.create_task(load.run(time.time() + planned + 3600))
            tailing = asyncio.create_task(completions.run())
            monitoring = asyncio.create_task(monitor.run())
            processes = pids(stack)

            def cpu_meter() -> CpuMeter:
                groups = {"postgres": lambda: cluster_pids(options.pressure_port)}
                return CpuMeter({k: v for k, v in pids(stack).items()}, groups)

            async def window(name: str, kind: str, seconds: float, work: Any = None) -> int:
                index = len(result.windows)
                start = time.time()
                result.windows.append(Window(name, kind, start))
                load.window = index
                detail: dict[str, Any] = {}
                result.details[index] = detail
                meter = cpu_meter()
                meter.start()
                deadline = start + seconds
                if work is None:
                    await until(deadline)
                else:
                    await work(deadline, detail)
                    await until(deadline)
                result.windows[index].end = time.time()
                result.cpu[index] = meter.stop()
                result.exits[index] = [
                    p.name for p in stack.processes if not p.alive and p is not stack.workers[-1]
                ]
                result.end_stats[index] = await window_end_stats(url)
                return index

            async def overload(deadline: float, detail: dict[str, Any]) -> None:
                load.rate = OVERLOAD * capacity
                detail["offered_rate"] = round(load.rate, 1)
                await until(deadline)
                load.rate = rate

            async def probe(deadline: float, detail: dict[str, Any]) -> None:
                load.rate = PROBE_FACTOR * rate
                await until(deadline)
                load.rate = rate

            actions: dict[str, Any] = {
                "clean": None,
                "pin": lambda d, x: pin_horizon(url, d, x),
                "readers": lambda d, x: readers(url, d, x),
                "overload": overload,
                "kills": lambda d, x: kill_backends(url, options.pressure_kill_rate, d, x),
                "pool": lambda d, x: exhaust_pool(url, d, x, completions),
                "restart": lambda d, x: restart_phase(options.pressure_port, d, x),
                "sigkill": lambda d, x: sigkill_worker(stack, d, x),
            }
            capacity = rate
            phase_index: dict[str, int] = {}
            recovery_index: dict[str, int] = {}
            try:
                # Warm-up: plans made, pools filled, the jobs table at its retention's size.
                await window("warm-up", "warm-up", options.pressure_warmup)
                for name in PHASES:
                    if name == "overload":
                        bench.step("pressure: measuring capacity")
                        probe_at = await window(
                            "capacity probe", "probe", phase_seconds[name], probe
                        )
                        probe_recovery = await window("capacity probe", "recovery", recovery)
                        spans = [
                            completed_rate(completions, t, t + RECOVERY_SPAN)
                            for t in range(
                                int(result.windows[probe_at].start),
                                int(result.windows[probe_recovery].end) - RECOVERY_SPAN,
                            )
                        ]
                        capacity = max([rate, *spans])
                        result.details[probe_at]["capacity_per_s"] = round(capacity, 1)
                    bench.step(f"pressure: {name}")
                    phase_index[name] = await window(
                        name, "phase", phase_seconds[name], actions[name]
                    )
                    bench.step(f"pressure: recovery after {name}")
                    seconds = recovery
                    if name == "pin":
                        seconds = max(recovery, options.pressure_pin_recovery)
                    recovery_index[name] = await window(name, "recovery", seconds)
                if options.pressure_after_pin:
                    pin_end = result.windows[phase_index["pin"]].end
                    left = pin_end + options.pressure_after_pin - time.time()
                    if left > 0:
                        bench.step("pressure: clean load until the time after the pin")
                        await window("after pin", "recovery", left)
            finally:
                load.stop()
                await loading
            bench.step("pressure: draining")
            drained = await drain(stack, completions, load)
            completions.stop()
            monitor.stop()
            await asyncio.gather(tailing, monitoring)
            outcomes, totals = await final_outcomes(url, result.windows)
            alive = {p.name: p.alive for p in stack.processes}
            incarnations = {p.name: p.incarnation for p in stack.processes}
    summarise(
        section,
        result,
        load,
        completions,
        monitor,
        outcomes,
        totals,
        phase_index,
        recovery_index,
        options,
        capacity,
        drained,
        alive,
        incarnations,
        processes,
        bench.out,
    )
    return section


async def restart_phase(port: int, deadline: float, detail: dict[str, Any]) -> None:
    detail["restart_seconds"] = round(await asyncio.to_thread(restart_cluster, port), 2)
    await until(deadline)


async def drain(stack: Stack, completions: Completions, load: OpenLoad) -> float:
    """Seconds until no job is open (bounded by DRAIN_TIMEOUT)."""
    started = time.monotonic()
    while time.monotonic() - started < DRAIN_TIMEOUT:
        with contextlib.suppress(Exception):
            async with stack.db.connection() as conn:
                cur = await conn.execute(
                    MARK + "SELECT count(*) AS n FROM jobcore.jobs"
                    " WHERE status NOT IN ('succeeded', 'failed', 'cancelled')"
                )
                row = await cur.fetchone()
                if row is not None and int(row["n"]) == 0:
                    break
        await asyncio.sleep(1)  # the drain's poll interval, bounded above
    # Let the tail read the last effects (it polls every half second).
    await asyncio.sleep(2)
    return time.monotonic() - started


async def final_outcomes(
    url: str, windows: list[Window]
) -> tuple[dict[int, dict[str, int]], dict[str, int]]:
    starts = [w.start for w in windows]
    ends = [w.end for w in windows]
    async with await connect(url, autocommit=True) as conn:
        cur = await conn.execute(OUTCOMES, {"starts": starts, "ends": ends})
        columns = [c.name for c in cur.description or []]
        per_window = {}
        for row in await cur.fetchall():
            data = dict(zip(columns, row, strict=True))
            per_window[int(data.pop("window_index")) - 1] = {k: int(v) for k, v in data.items()}
        cur = await conn.execute(TOTALS)
        row = await cur.fetchone()
    assert row is not None
    totals = {"jobs": int(row[0]), "open": int(row[1]), "duplicates": int(row[2])}
    return per_window, totals


def _waits(monitor: Monitor, index: int) -> str:
    counter = monitor.waits.get(index, Counter())
    samples = max(1, monitor.wait_samples.get(index, 0))
    top = counter.most_common(TOP_WAITS)
    return "; ".join(f"{event} {n / samples:.2f}" for event, n in top) or "none active"


def _fmt(value: Any) -> Any:
    return "—" if value is None else value


def window_figures(
    index: int,
    result: Run,
    load: OpenLoad,
    completions: Completions,
    monitor: Monitor,
    outcomes: dict[int, dict[str, int]],
) -> dict[str, Any]:
    w = result.windows[index]
    counts = load.counts(index).as_dict(w.seconds)
    pickup = completions.pickup.get(index, Histogram())
    at_end = sizes_at(monitor, w.end)
    stats = result.end_stats.get(index, {})
    outcome = outcomes.get(index, {})
    return {
        "seconds": round(w.seconds, 1),
        **counts,
        "completed_per_s": round(completed_rate(completions, w.start, w.end), 1),
        "pickup_p50_ms": pickup.ms(50),
        "pickup_p95_ms": pickup.ms(95),
        "pickup_p99_ms": pickup.ms(99),
        "pickup_samples": pickup.total,
        "dead_tuples_at_end": {k: v["dead"] for k, v in sorted(at_end.items())},
        "pgstattuple_dead_at_end": stats.get("pgstattuple_dead", {}),
        "hot_tables_mib_at_end": round(total_mib(at_end), 2),
        "table_and_index_mib_at_end": {
            k: round((v["table"] + v["index"]) / 2**20, 2) for k, v in sorted(at_end.items())
        },
        "top_waits_per_sample": _waits(monitor, index),
        "cpu_pct": result.cpu.get(index, {}),
        "jobs_created": outcome.get("jobs", 0),
        "stranded": outcome.get("open", 0),
        "failed": outcome.get("failed", 0),
        "duplicate_effects": outcome.get("duplicates", 0),
        "missing_effects": outcome.get("missing_effects", 0),
        "processes_exited": result.exits.get(index, []),
        **result.details.get(index, {}),
    }


TABLE_ROWS = (
    ("offered jobs/s", "offered_per_s"),
    ("accepted (202)", "accepted"),
    ("completed jobs/s", "completed_per_s"),
    ("pickup p50 ms", "pickup_p50_ms"),
    ("pickup p95 ms", "pickup_p95_ms"),
    ("pickup p99 ms", "pickup_p99_ms"),
    ("hot tables MiB at end", "hot_tables_mib_at_end"),
    ("dead tuples at end (jobs)", ("dead_tuples_at_end", "jobs")),
    ("dead tuples at end (outbox)", ("dead_tuples_at_end", "outbox")),
    ("dead tuples at end (inbox)", ("dead_tuples_at_end", "inbox")),
    ("dead tuples at end (job_events)", ("dead_tuples_at_end", "job_events")),
    ("dead tuples at end (tenant_usage)", ("dead_tuples_at_end", "tenant_usage")),
    ("dead tuples at end (tenant_usage_deltas)", ("dead_tuples_at_end", "tenant_usage_deltas")),
    ("pgstattuple dead (tenant_usage)", ("pgstattuple_dead_at_end", "tenant_usage")),
    ("top waits (backends per sample)", "top_waits_per_sample"),
    ("503 answers", "answers_503"),
    ("503 without Retry-After", "503_without_retry_after"),
    ("requests over the generator's timeout", "hangs_over_timeout"),
    ("transport errors", "transport_errors"),
    ("HTTP p99 ms", "http_p99_ms"),
    ("shed by the generator", "shed_by_generator"),
    ("jobs stranded (not finished)", "stranded"),
    ("duplicate effects", "duplicate_effects"),
    ("processes exited", "processes_exited"),
    ("CPU % bench (the generator)", ("cpu_pct", "bench")),
    ("CPU % api", ("cpu_pct", "api")),
    ("CPU % postgres (this cluster)", ("cpu_pct", "postgres")),
    ("back to clean, s after the phase", "back_to_clean_seconds"),
)


def _pick(figures: dict[str, Any], key: Any) -> Any:
    if isinstance(key, tuple):
        return _fmt(figures.get(key[0], {}).get(key[1]))
    value = figures.get(key)
    if isinstance(value, list):
        return ", ".join(value) or "none"
    return _fmt(value)


def suffering_statements(
    clean: list[dict[str, Any]], pinned: list[dict[str, Any]]
) -> list[list[Any]]:
    """The statements whose mean time grew most from the clean phase to the pin."""
    before = {s["key"]: s for s in clean}
    rows = []
    for s in pinned:
        b = before.get(s["key"])
        if b is None or s["calls"] < 50 or b["mean_ms"] <= 0:
            continue
        rows.append(
            [
                s["query"],
                s["calls"],
                b["mean_ms"],
                s["mean_ms"],
                round(s["mean_ms"] / b["mean_ms"], 2),
                b["blocks_per_call"],
                s["blocks_per_call"],
            ]
        )
    rows.sort(key=lambda r: -(r[3] - r[2]) * r[1])
    return rows[:TOP_STATEMENTS]


def summarise(
    section: Section,
    result: Run,
    load: OpenLoad,
    completions: Completions,
    monitor: Monitor,
    outcomes: dict[int, dict[str, int]],
    totals: dict[str, int],
    phase_index: dict[str, int],
    recovery_index: dict[str, int],
    options: Options,
    capacity: float,
    drained: float,
    alive: dict[str, bool],
    incarnations: dict[str, int],
    processes: dict[str, int],
    out: Path,
) -> None:
    from services.bench.pressure_plot import plot_phase

    figures = {
        i: window_figures(i, result, load, completions, monitor, outcomes)
        for i in range(len(result.windows))
    }
    clean = figures[phase_index["clean"]]
    clean_rate = clean["completed_per_s"] or options.pressure_rate
    clean_p95 = (clean["pickup_p95_ms"] or 1.0) / 1000
    for name, index in recovery_index.items():
        w = result.windows[index]
        figures[index]["back_to_clean_seconds"] = back_to_clean(
            completions, result.windows[phase_index[name]].end, w.end, clean_rate, clean_p95
        )
    accepted = sum(c.accepted for c in load.windows.values())
    lost = max(0, accepted - totals["jobs"]) + totals["open"]
    tables: list[dict[str, Any]] = []
    plots: list[str] = []
    for name in PHASES:
        p, r = phase_index[name], recovery_index[name]
        tables.append(
            {
                "title": f"{name}: {result.windows[p].seconds:.0f} s, then "
                f"{result.windows[r].seconds:.0f} s of recovery",
                "note": "; ".join(
                    f"{k} {v}"
                    for k, v in result.details.get(p, {}).items()
                    if k not in ("released_at",)
                ),
                "columns": ["", "clean", name, "recovery"],
                "rows": [
                    [label, _pick(clean, key), _pick(figures[p], key), _pick(figures[r], key)]
                    for label, key in TABLE_ROWS
                ],
            }
        )
        plot_name = f"pressure-{name}.png"
        plot_phase(
            out / plot_name,
            name,
            result.windows[p],
            result.windows[r],
            load,
            completions,
            monitor,
        )
        plots.append(plot_name)
    pin = figures[phase_index["pin"]]
    pin_window = result.windows[phase_index["pin"]]
    before_pin = total_mib(sizes_at(monitor, pin_window.start))
    after_at = pin_window.end + 1800
    last_t = monitor.sizes[-1][0] if monitor.sizes else pin_window.end
    after_pin = total_mib(sizes_at(monitor, min(after_at, last_t)))
    after_seconds = min(after_at, last_t) - pin_window.end
    # Whether "before" was the working size: the growth over the last SETTLED_SPAN seconds
    # before the pin (a warm-up shorter than the inbox's window leaves the tables filling).
    settling = total_mib(sizes_at(monitor, pin_window.start - SETTLED_SPAN))
    before_growth = before_pin / max(settling, 1e-9) - 1
    kills, kills_r = figures[phase_index["kills"]], figures[recovery_index["kills"]]
    pool, pool_r = figures[phase_index["pool"]], figures[recovery_index["pool"]]
    release = result.details[phase_index["pool"]].get("released_at")
    first = completions.first_after.get(release) if release else None
    behind = None if first is None or release is None else round(first - release, 2)
    resumed = None if release is None else work_resumed(completions, release, clean_rate)
    per_phase_bad = {
        name: (
            figures[phase_index[name]]["duplicate_effects"],
            figures[phase_index[name]]["stranded"],
        )
        for name in PHASES
    }
    backs = {name: figures[recovery_index[name]]["back_to_clean_seconds"] for name in PHASES}
    targets = [
        (
            "jobs lost, duplicate effects: 0 in every phase",
            lost == 0 and totals["duplicates"] == 0,
            f"{lost} lost ({accepted:,} accepted, {totals['jobs']:,} jobs, {totals['open']} "
            f"not finished after a {drained:.0f} s drain), {totals['duplicates']} duplicates; "
            f"per phase (duplicates, stranded): {per_phase_bad}",
        ),
        (
            "completed rate while the horizon is pinned ≥ 0.8× clean",
            pin["completed_per_s"] >= 0.8 * clean_rate,
            f"{pin['completed_per_s']} vs {clean_rate} jobs/s "
            f"({pin['completed_per_s'] / clean_rate:.2f}×; pin {pin_window.seconds:.0f} s)",
        ),
        (
            "pickup p95 while pinned ≤ 3× clean",
            pin["pickup_p95_ms"] is not None and pin["pickup_p95_ms"] <= 3 * 1000 * clean_p95,
            f"{pin['pickup_p95_ms']} vs {clean['pickup_p95_ms']} ms",
        ),
        (
            "back to the clean rate within 60 s after each phase",
            all(v is not None and v <= 60 for v in backs.values()),
            ", ".join(f"{k} {_fmt(v)} s" for k, v in backs.items()),
        ),
        (
            "hot tables' total size 30 min after the pin ≤ 1.5× before it",
            after_pin <= 1.5 * before_pin,
            f"{after_pin:.1f} vs {before_pin:.1f} MiB ({after_pin / max(before_pin, 1e-9):.2f}×), "
            f"measured {after_seconds:.0f} s after the pin ended"
            # One size sample's period short still counts: the last sample falls within it.
            + (
                ""
                if after_seconds >= 1800 - options.pressure_sample
                else " (the target asks 1800 s: not reached)"
            )
            + f"; before the pin the tables grew {before_growth:+.0%} in its last "
            f"{SETTLED_SPAN:.0f} s (near 0: their working size)",
        ),
        (
            "backend kills: no job stranded, no process exits, every 503 carries Retry-After",
            kills["stranded"] == 0
            and kills_r["stranded"] == 0
            and not kills["processes_exited"]
            and not kills_r["processes_exited"]
            and kills["503_without_retry_after"] == 0,
            f"{kills.get('terminated')} backends terminated; stranded {kills['stranded']}; "
            f"exited {kills['processes_exited'] or 'none'}; 503s {kills['answers_503']}, "
            f"without Retry-After {kills['503_without_retry_after']}",
        ),
        (
            "pool exhaustion: 503 with Retry-After, no hang past the timeout, work resumes "
            "within 10 s of release",
            pool["503_without_retry_after"] == 0
            and pool["hangs_over_timeout"] == 0
            and resumed is not None
            and resumed <= 10,
            f"{pool.get('held_idle_connections')} idle connections held "
            f"({pool.get('backends_while_held')} backends of {pool.get('max_connections')}); "
            f"503s {pool['answers_503']}, without Retry-After {pool['503_without_retry_after']}, "
            f"over the timeout {pool['hangs_over_timeout']}; HTTP max {pool['http_max_ms']} ms; "
            f"completions back to half the clean rate {_fmt(resumed)} s after the release "
            f"(a job created after it finished {_fmt(behind)} s after it, behind the backlog); "
            f"recovery 503s {pool_r['answers_503']}",
        ),
    ]
    tables.insert(
        0,
        {
            "title": "Targets (issue's table), measured against the clean phase of this run",
            "note": f"Capacity measured before the overload: {capacity:.0f} jobs/s "
            f"(overload offered {OVERLOAD}× that). Processes alive at the end: "
            f"{alive}; starts per process: {incarnations}.",
            "columns": ["target", "verdict", "measured"],
            "rows": [[t, "met" if ok else "NOT met", m] for t, ok, m in targets],
        },
    )
    statements = suffering_statements(
        result.end_stats.get(phase_index["clean"], {}).get("statements", []),
        result.end_stats.get(phase_index["pin"], {}).get("statements", []),
    )
    tables.append(
        {
            "title": "Statements that suffer under the pinned horizon (pg_stat_statements)",
            "note": "Top-level statements with at least 50 calls in the pin, by the extra "
            "time the pin cost them (calls × mean growth); blocks = shared hit + read.",
            "columns": [
                "statement",
                "calls in pin",
                "clean mean ms",
                "pin mean ms",
                "×",
                "clean blocks/call",
                "pin blocks/call",
            ],
            "rows": statements,
        }
    )
    for name in PHASES:
        p, r = phase_index[name], recovery_index[name]
        section.add(
            Figure(
                name,
                "completed jobs/s",
                [figures[p]["completed_per_s"]],
                "clean",
                [clean["completed_per_s"]],
            )
        )
        if figures[p]["pickup_p95_ms"] is not None and clean["pickup_p95_ms"]:
            section.add(
                Figure(
                    name,
                    "pickup p95 ms",
                    [figures[p]["pickup_p95_ms"]],
                    "clean",
                    [clean["pickup_p95_ms"]],
                    better="lower",
                )
            )
    origin = result.windows[0].start
    seconds = sorted(s for s in load.sent_per_second if s >= origin)
    section.series.append(
        Series(
            "offered",
            [s - origin for s in seconds],
            [float(load.sent_per_second[s]) for s in seconds],
            "seconds",
            "jobs/s",
        )
    )
    done = sorted(s for s in completions.per_second if s >= origin)
    section.series.append(
        Series(
            "completed",
            [s - origin for s in done],
            [float(completions.per_second[s]) for s in done],
            "seconds",
            "jobs/s",
        )
    )
    section.series.append(
        Series(
            "hot tables",
            [t - origin for t, _ in monitor.sizes],
            [total_mib(s) for _, s in monitor.sizes],
            "seconds",
            "MiB",
        )
    )
    section.cpu_pct = {
        f"{result.windows[i].name} ({result.windows[i].kind})": result.cpu[i]
        for i in sorted(result.cpu)
    }
    section.details.update(
        targets_met=all(ok for _, ok, _ in targets),
        lost=lost,
        duplicates=totals["duplicates"],
        accepted=accepted,
        jobs=totals["jobs"],
        capacity_per_s=round(capacity, 1),
        tail_reconnects=completions.reconnects,
        windows=[
            {"name": w.name, "kind": w.kind, **figures[i]} for i, w in enumerate(result.windows)
        ],
        tables=tables,
        plots=plots,
        process_pids=processes,
    )
