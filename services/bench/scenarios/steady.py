"""steady: a million no-op jobs at a sustained rate with retention in minutes — do the
tables stop growing, and does throughput hold?

Jobs are enqueued without the API (the library's ``enqueue`` in one transaction each, as
the API does) at ``steady_rate`` per second by a few concurrent tasks on their own pool,
paced against the clock, while one relay and one worker run with every finished job's
retention and the inbox window set to minutes. Every ``steady_sample`` seconds the scenario
reads ``pg_total_relation_size`` of every table and how many jobs are not finished yet.

Figures: the total size over the last quarter of the run against the second quarter (the
first quarter is still filling up to retention), and the jobs finished per second over the
last quarter against the first. The issue's bar: sizes within 10 %, throughput at least 0.9×.

Autovacuum: this machine's PostgreSQL runs with ``autovacuum = off`` (its CI config). A
production server vacuums, and bloat without it says nothing about jobcore, so when the
launcher is off the scenario applies autovacuum's default rule itself at every sample:
``VACUUM (ANALYZE)`` a table once its dead rows pass 50 + 20 % of its live rows.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import load_job_modules
from jobcore.kernel.states import TERMINAL
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue
from services.bench.harness import Bench, Options, pids, relays_ready
from services.bench.jobtypes import SteadyNoopPayload
from services.bench.measure import cpu_of, merge_cpu
from services.bench.report import Figure, Section, Series

TITLE = "Steady state: a million jobs with retention in minutes"
ENQUEUERS = 8
SUSTAINED_LAG = 5.0  # seconds behind schedule the generator may fall and still be steady
# The shortest inbox window start-up accepts is delivery limit × consumer timeout; the
# scenario's no-op type holds a slot at most 20 s (timeout 10 s + lease 10 s), under the 30 s
# declared here, so the window can be as short as 90 s.
JOB_MODULES = ("services.bench.jobtypes",)
JOB_TYPE = "steady_noop"
DELIVERY_LIMIT = 3
CONSUMER_TIMEOUT = 30
PRUNER_INTERVAL = 10  # seconds, or a third of a retention shorter than 30 s
VACUUM_THRESHOLD = 50
VACUUM_SCALE_FACTOR = 0.2

SIZES = """
SELECT c.relname AS name, pg_total_relation_size(c.oid) AS bytes
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'jobcore' AND c.relkind = 'r'
"""
UNFINISHED = "SELECT count(*) FROM jobcore.jobs WHERE status <> ALL(%(terminal)s)"
DEAD_TUPLES = (
    "SELECT relname, n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE schemaname = 'jobcore'"
)


def steps(options: Options) -> int:
    return 3


def pruner_interval(retention: int) -> int:
    return max(1, min(PRUNER_INTERVAL, retention // 3))


def worker_env(retention: int) -> dict[str, str]:
    seconds = str(retention)
    return {
        "JOBCORE_RETENTION_SUCCEEDED": seconds,
        "JOBCORE_RETENTION_FAILED": seconds,
        "JOBCORE_RETENTION_CANCELLED": seconds,
        "JOBCORE_INBOX_RETENTION": str(max(retention, DELIVERY_LIMIT * CONSUMER_TIMEOUT)),
        "JOBCORE_AMQP_DELIVERY_LIMIT": str(DELIVERY_LIMIT),
        "JOBCORE_AMQP_CONSUMER_TIMEOUT": str(CONSUMER_TIMEOUT),
        "JOBCORE_PRUNER_INTERVAL": str(pruner_interval(retention)),
    }


@dataclass
class Samples:
    seconds: list[float] = field(default_factory=list)
    sizes: list[dict[str, int]] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    unfinished: list[int] = field(default_factory=list)
    vacuums: dict[str, int] = field(default_factory=dict)

    def total_mib(self, index: int) -> float:
        return sum(self.sizes[index].values()) / 2**20

    def within(self, start: float, end: float) -> list[int]:
        """The samples taken between ``start`` and ``end``, or else the one nearest its
        middle: on a busy machine one sample of every table's size can take longer than a
        short run's quarter."""
        inside = [i for i, t in enumerate(self.seconds) if start <= t <= end]
        if inside or not self.seconds:
            return inside
        middle = (start + end) / 2
        return [min(range(len(self.seconds)), key=lambda i: abs(self.seconds[i] - middle))]


@dataclass
class Load:
    """Enqueues ``total`` jobs at ``rate`` per second, paced against the clock."""

    total: int
    rate: float
    submitted: int = 0
    # How far behind its schedule the load ever fell: the generator's own health.
    worst_lag: float = 0.0
    started: float = 0.0

    async def run(self, db: Database, topology: Topology, tenant: str) -> None:
        noop = load_job_modules(JOB_MODULES).get(JOB_TYPE)
        numbers = itertools.count()
        self.started = time.monotonic()

        async def enqueuer() -> None:
            while (i := next(numbers)) < self.total:
                due = self.started + i / self.rate
                now = time.monotonic()
                if due > now:
                    await asyncio.sleep(due - now)
                else:
                    self.worst_lag = max(self.worst_lag, now - due)
                async with db.unit_of_work() as uow:
                    await enqueue(
                        uow,
                        topology,
                        EnqueueRequest(tenant=tenant, job_type=noop, payload=SteadyNoopPayload()),
                    )
                    await uow.commit()
                self.submitted += 1

        await asyncio.gather(*(enqueuer() for _ in range(ENQUEUERS)))


async def autovacuum_is_on(conn: psycopg.AsyncConnection[Any]) -> bool:
    cur = await conn.execute("SHOW autovacuum")
    row = await cur.fetchone()
    return row is not None and row[0] == "on"


async def vacuum_due(conn: psycopg.AsyncConnection[Any], samples: Samples) -> None:
    """Autovacuum's default rule, applied by hand (see the module docstring)."""
    cur = await conn.execute(DEAD_TUPLES)
    for name, live, dead in await cur.fetchall():
        if dead > VACUUM_THRESHOLD + VACUUM_SCALE_FACTOR * live:
            await conn.execute(f'VACUUM (ANALYZE) jobcore."{name}"')
            samples.vacuums[name] = samples.vacuums.get(name, 0) + 1


async def sample(
    conn: psycopg.AsyncConnection[Any], samples: Samples, load: Load, elapsed: float
) -> None:
    cur = await conn.execute(SIZES)
    sizes = {name: int(size) for name, size in await cur.fetchall()}
    cur = await conn.execute(UNFINISHED, {"terminal": [str(s) for s in TERMINAL]})
    row = await cur.fetchone()
    unfinished = int(row[0]) if row else 0
    samples.seconds.append(elapsed)
    samples.sizes.append(sizes)
    samples.unfinished.append(unfinished)
    samples.finished.append(load.submitted - unfinished)


def quarter_rate(samples: Samples, start: float, end: float) -> float:
    """Jobs finished per second between the samples nearest ``start`` and ``end``, or, when
    that is one sample (on a busy machine a sample can take longer than a quarter), between
    it and its neighbour."""
    first = min(range(len(samples.seconds)), key=lambda i: abs(samples.seconds[i] - start))
    last = min(range(len(samples.seconds)), key=lambda i: abs(samples.seconds[i] - end))
    if first == last:
        if last + 1 < len(samples.seconds):
            last += 1
        elif first > 0:
            first -= 1
    span = samples.seconds[last] - samples.seconds[first]
    return (samples.finished[last] - samples.finished[first]) / span if span > 0 else 0.0


async def run(bench: Bench) -> Section:
    options = bench.options
    total, rate = options.steady_jobs, options.steady_rate
    retention, every = options.steady_retention, options.steady_sample
    section = Section(
        "steady",
        TITLE,
        f"{total:,} no-op jobs enqueued without the API at {rate:g}/s ({ENQUEUERS} tasks, one "
        f"transaction each) through one relay and one worker; retention {retention} s for every "
        f"finished job, inbox window {max(retention, DELIVERY_LIMIT * CONSUMER_TIMEOUT)} s, "
        f"pruner every {pruner_interval(retention)} s; table sizes sampled every {every:g} s. "
        "The total size over the last quarter against the second, the finish rate over the "
        "last quarter against the first. One run.",
    )
    samples = Samples()
    used: dict[str, float] = {}
    async with bench.scratch("steady", JOB_MODULES) as config:
        topology = Topology(config.amqp_prefix, DELIVERY_LIMIT)
        bench.step("steady: starting a relay and a worker")
        async with (
            bench.stack(config, "steady", relays=1, workers=1, env=worker_env(retention)) as stack,
            await psycopg.AsyncConnection.connect(config.database_url, autocommit=True) as conn,
        ):
            await relays_ready(stack)
            vacuum_by_hand = not await autovacuum_is_on(conn)
            db = Database(config, min_size=ENQUEUERS, max_size=ENQUEUERS, name="bench-steady")
            await db.open(wait=True)
            load = Load(total, rate)
            processes = pids(stack)
            processes.pop("api", None)
            bench.step(f"steady: {total:,} jobs at {rate:g}/s")
            try:
                with cpu_of(processes, used):
                    started = time.monotonic()
                    await sample(conn, samples, load, 0.0)
                    loading = asyncio.create_task(load.run(db, topology, stack.tenant))
                    while True:
                        await asyncio.wait({loading}, timeout=every)
                        if loading.done():
                            loading.result()  # an enqueue that failed ends the run
                        await sample(conn, samples, load, time.monotonic() - started)
                        if vacuum_by_hand:
                            await vacuum_due(conn, samples)
                        if loading.done():
                            break
                    load_seconds = time.monotonic() - started
                    bench.step("steady: draining what is left")
                    drain_deadline = time.monotonic() + 600
                    while samples.unfinished[-1] and time.monotonic() < drain_deadline:
                        await asyncio.sleep(1)
                        await sample(conn, samples, load, time.monotonic() - started)
                    cur = await conn.execute("SELECT count(*) FROM jobcore.jobs")
                    row = await cur.fetchone()
                    jobs_left = int(row[0]) if row else 0
            finally:
                await db.close()
    q = load_seconds / 4
    second = samples.within(q, 2 * q)
    last = samples.within(3 * q, load_seconds)
    size_second = statistics.mean(samples.total_mib(i) for i in second)
    size_last = statistics.mean(samples.total_mib(i) for i in last)
    rate_first = quarter_rate(samples, 0, q)
    rate_last = quarter_rate(samples, 3 * q, load_seconds)
    section.add(
        Figure(
            "all tables",
            "MiB, last quarter (mean)",
            [round(size_last, 2)],
            "second quarter",
            [round(size_second, 2)],
            better="lower",
        )
    )
    section.add(
        Figure(
            f"{rate:g} jobs/s offered",
            "jobs finished/s, last quarter",
            [round(rate_last, 1)],
            "first quarter",
            [round(rate_first, 1)],
        )
    )
    section.cpu_pct = {"steady": merge_cpu([used])}
    tables = sorted({name for sizes in samples.sizes for name in sizes})
    biggest = sorted(tables, key=lambda name: -samples.sizes[-1].get(name, 0))[:8]
    section.series.append(
        Series(
            "all tables",
            samples.seconds,
            [samples.total_mib(i) for i in range(len(samples.seconds))],
            "seconds",
            "MiB",
        )
    )
    for name in biggest:
        section.series.append(
            Series(
                name,
                samples.seconds,
                [sizes.get(name, 0) / 2**20 for sizes in samples.sizes],
                "seconds",
                "MiB per table",
            )
        )
    section.series.append(
        Series(
            "not finished",
            samples.seconds,
            [float(n) for n in samples.unfinished],
            "seconds",
            "jobs",
        )
    )
    size_ratio = size_last / size_second if size_second else float("inf")
    throughput_ratio = rate_last / rate_first if rate_first else 0.0
    section.details.update(
        jobs=total,
        offered_rate=rate,
        load_seconds=round(load_seconds, 1),
        generator_worst_lag_seconds=round(load.worst_lag, 3),
        size_ratio_last_to_second_quarter=round(size_ratio, 3),
        throughput_ratio_last_to_first_quarter=round(throughput_ratio, 3),
        plateau=size_ratio <= 1.10,
        # A generator that fell behind (the machine busy with something else) then enqueued
        # its backlog at once: a burst of live rows that raises every table's high-water
        # mark, which PostgreSQL reuses but never returns. The plateau is then not jobcore's.
        load_sustained=load.worst_lag <= SUSTAINED_LAG,
        throughput_held=throughput_ratio >= 0.9,
        vacuum_by_hand=vacuum_by_hand,
        vacuums=samples.vacuums,
        final_sizes_mib={
            name: round(size / 2**20, 2) for name, size in sorted(samples.sizes[-1].items())
        },
        unfinished_at_end=samples.unfinished[-1],
        # Rows still in `jobs` once the load drained: the pruner keeps it to about
        # rate × (retention + pruner interval), whatever the number of jobs.
        jobs_rows_at_end=jobs_left,
    )
    return section
