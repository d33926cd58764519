"""Measure pruning: batched deletes against dropping time partitions.

Fills a scratch database with finished jobs (with effects, webhook deliveries and inbox
rows, about half of them past the default retention), then, while one connection enqueues
jobs at a steady modest rate and records each enqueue's latency:

1. runs the pruner's pass (``jobcore.maintenance.retention``) as the workers do, resting between
   batches as long as each batch took, and again without the rests, at two batch sizes;
2. drops one day's partition of a day-partitioned copy of the inbox.

Prints delete rates, batch durations and the enqueue latencies during each, for
docs/operations.md ("Retention"). Modest on purpose (the machine is shared): a few
hundred thousand rows, one enqueue connection at 200/s.

    .venv/bin/python scripts/measure_retention.py [--jobs 300000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator

import psycopg
from psycopg import sql

from jobcore.amqp.topology import Topology
from jobcore.database import migrate
from jobcore.database.gateway import Database
from jobcore.database.sql.inbox import INBOX_PRUNE_BATCH
from jobcore.examples.jobtypes import NoopPayload
from jobcore.execution.registry import load_job_modules
from jobcore.kernel.settings import Settings
from jobcore.maintenance.retention import Retention
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue

ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DATABASE = "jobcore_measure_retention"
ENQUEUE_RATE = 200.0  # per second, one connection

FILL = """
INSERT INTO jobcore.jobs (id, tenant, type, queue, status, payload, attempts, result, created_at,
                  updated_at, started_at, finished_at)
SELECT gen_random_uuid(), 't' || (g % 10), 'type' || (g % 5), 'default',
       CASE WHEN g % 100 < 90 THEN 'succeeded' WHEN g % 100 < 97 THEN 'failed'
            ELSE 'cancelled' END,
       jsonb_build_object('rows', g, 'note', repeat('x', 150)), 1, '{"ok": true}'::jsonb,
       now() - make_interval(secs => (g::float8 / {n}) * 14 * 86400) - interval '1 minute',
       now(), now(), now() - make_interval(secs => (g::float8 / {n}) * 14 * 86400)
FROM generate_series(1, {n}) AS g;
INSERT INTO jobcore.job_effects (job_id, attempt, kind, detail)
SELECT id, 1, 'did', '{"a": 1}' FROM jobcore.jobs;
INSERT INTO jobcore.webhook_deliveries (id, job_id, tenant, url, event, status)
SELECT gen_random_uuid(), id, tenant, 'https://example.com/h', 'job.' || status, 'delivered'
FROM jobcore.jobs WHERE random() < 0.2;
INSERT INTO jobcore.inbox (consumer, message_id, received_at)
SELECT 'jobs', gen_random_uuid(), finished_at FROM jobcore.jobs;
"""

PARTITIONED_INBOX = """
CREATE TABLE inbox_by_day (
    consumer text NOT NULL, message_id uuid NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, message_id, received_at)
) PARTITION BY RANGE (received_at);
"""


def admin(statement: sql.Composable) -> None:
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(statement)


def settings_for(batch_size: int) -> Settings:
    return Settings(
        database_url=f"postgresql://postgres@127.0.0.1:5432/{DATABASE}",
        pruner_batch_size=batch_size,
        result_dir="/tmp/jobcore-measure-retention-results",  # type: ignore[arg-type]
        db_pool_max=4,
    )


def fresh_database(jobs: int) -> None:
    admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))
    admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    settings = settings_for(1000)
    migrate.upgrade(settings)
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        started = time.monotonic()
        for statement in FILL.replace("{n}", str(int(jobs))).split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute("VACUUM ANALYZE")
        print(f"  filled {jobs} jobs in {time.monotonic() - started:.1f} s")


class Enqueuer:
    """Enqueues noop jobs at a steady rate on one connection; records each latency."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.latencies: list[float] = []
        self.marks: list[tuple[float, float]] = []  # (start time, latency)

    async def run(self, stop: asyncio.Event) -> None:
        registry = load_job_modules(("jobcore.examples.jobtypes",))
        noop = registry.get("noop")
        topology = Topology(self.settings.amqp_prefix, self.settings.amqp_delivery_limit)
        async with Database(self.settings, min_size=1, max_size=1) as db:
            interval = 1 / ENQUEUE_RATE
            next_at = time.monotonic()
            while not stop.is_set():
                started = time.monotonic()
                async with db.session() as session:
                    await enqueue(
                        session,
                        topology,
                        EnqueueRequest(tenant="m", job_type=noop, payload=NoopPayload()),
                    )
                self.marks.append((started, time.monotonic() - started))
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    def window(self, start: float, end: float) -> list[float]:
        return [latency for at, latency in self.marks if start <= at <= end]


@contextlib.asynccontextmanager
async def enqueueing(settings: Settings) -> AsyncIterator[Enqueuer]:
    enqueuer = Enqueuer(settings)
    stop = asyncio.Event()
    task = asyncio.create_task(enqueuer.run(stop))
    try:
        yield enqueuer
    finally:
        stop.set()
        await task


def latency_summary(values: list[float]) -> str:
    if not values:
        return "no enqueues"
    ms = sorted(v * 1000 for v in values)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return (
        f"{len(ms)} enqueues: p50 {statistics.median(ms):.2f} ms, p99 {p99:.2f} ms, "
        f"max {ms[-1]:.2f} ms"
    )


async def measure_pass(batch_size: int, *, rest: bool) -> None:
    settings = settings_for(batch_size)
    job_batches: list[float] = []
    last_jobs_at = 0.0

    def on_batch(counts: Counter[str]) -> None:
        nonlocal last_jobs_at
        if counts["jobs"]:
            last_jobs_at = time.monotonic()

    async def pause(seconds: float) -> bool:
        if last_jobs_at and time.monotonic() - last_jobs_at < 0.01:
            job_batches.append(seconds)
        if rest:
            await asyncio.sleep(seconds)
        return False

    async with Database(settings, min_size=1, max_size=2) as db, enqueueing(settings) as enq:
        await asyncio.sleep(5)  # a baseline before the pass
        started = time.monotonic()
        report = await Retention(settings, db).prune(
            pause=pause, on_batch=on_batch, sweep_files=False
        )
        ended = time.monotonic()
        await asyncio.sleep(1)
    jobs, inbox = report.tables["jobs"], report.tables["inbox"]
    jobs_seconds, inbox_seconds = last_jobs_at - started, ended - last_jobs_at
    batch_ms = sorted(s * 1000 for s in job_batches)
    p95 = batch_ms[int(len(batch_ms) * 0.95)]
    print(
        f"  batch {batch_size}, {'rest = batch time' if rest else 'no rest'}: "
        f"{jobs} jobs (+{report.tables['job_effects']} effects, "
        f"{report.tables['webhook_deliveries']} deliveries) in {jobs_seconds:.1f} s = "
        f"{jobs / jobs_seconds:,.0f} jobs/s; job batches p50 "
        f"{statistics.median(batch_ms):.0f} ms, p95 {p95:.0f} ms, max {batch_ms[-1]:.0f} ms; "
        f"then {inbox} inbox rows in {inbox_seconds:.1f} s = {inbox / inbox_seconds:,.0f}/s"
    )
    for label, start, end in (
        ("before", started - 5, started),
        ("while pruning jobs", started, last_jobs_at),
    ):
        values = enq.window(start, end)
        print(
            f"    enqueue {label}: {latency_summary(values)} "
            f"({len(values) / (end - start):.0f}/s of {ENQUEUE_RATE:.0f}/s asked)"
        )


async def measure_partition_drop(jobs: int) -> None:
    settings = settings_for(1000)
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(PARTITIONED_INBOX)
        for day in range(16):
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} PARTITION OF inbox_by_day FOR VALUES FROM "
                    "(date_trunc('day', now()) - make_interval(days => {})) TO "
                    "(date_trunc('day', now()) - make_interval(days => {}))"
                ).format(
                    sql.Identifier(f"inbox_by_day_{day}"), sql.Literal(day), sql.Literal(day - 1)
                )
            )
        conn.execute(
            "INSERT INTO inbox_by_day SELECT consumer, message_id, received_at FROM jobcore.inbox"
        )
        conn.execute("ANALYZE inbox_by_day")
        rows = conn.execute("SELECT count(*) FROM inbox_by_day_10").fetchone()
    async with enqueueing(settings) as enq:
        await asyncio.sleep(2)
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            started = time.monotonic()
            conn.execute("DROP TABLE inbox_by_day_10")
            dropped = time.monotonic() - started
        await asyncio.sleep(1)
    print(
        f"  dropping one day's inbox partition ({rows[0] if rows else 0} rows of {jobs}): "
        f"{dropped * 1000:.1f} ms"
    )
    print(f"    enqueue around it: {latency_summary(enq.window(started - 1, started + 1))}")

    # The batched-delete equivalent on the plain inbox, for comparison.
    started = time.monotonic()
    deleted = 0
    async with Database(settings, min_size=1, max_size=1) as db:
        while True:
            async with db.unit_of_work() as uow:
                count = await uow.execute(
                    INBOX_PRUNE_BATCH, {"keep": 10 * 86_400.0, "limit": settings.pruner_batch_size}
                )
                await uow.commit()
            deleted += count
            if count < settings.pruner_batch_size:
                break
    elapsed = time.monotonic() - started
    print(
        f"  batched deletes of the plain inbox older than 10 days: {deleted} rows in "
        f"{elapsed * 1000:.0f} ms ({deleted / max(elapsed, 1e-9):,.0f} rows/s)"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300_000)
    parser.add_argument("--partitions-only", action="store_true")
    args = parser.parse_args()
    passes = [] if args.partitions_only else [(1000, True), (1000, False), (10_000, False)]
    try:
        for batch_size, rest in passes:
            print(f"fresh database, batch size {batch_size}:")
            fresh_database(args.jobs)
            await measure_pass(batch_size, rest=rest)
        print("partitioning (the inbox, by day):")
        fresh_database(args.jobs)
        await measure_partition_drop(args.jobs)
    finally:
        admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))


if __name__ == "__main__":
    asyncio.run(main())
