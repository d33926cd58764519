"""End-to-end no-op jobs: enqueue → relay → RabbitMQ → worker → succeeded, next to the
raw consume+ack rate of the same broker in the same run.

1. Baseline: ``--jobs`` persistent messages published (pipelined confirms) to a scratch
   quorum queue, then consumed and acknowledged from this process with the worker's
   prefetch; the rate is messages acknowledged per second of consuming.
2. End to end: one ``jobcore relay`` and one ``jobcore worker`` process (fresh database and
   broker prefix). ``--jobs`` no-op jobs are enqueued straight into the database (job row +
   outbox row, one transaction each, ``--connections`` at once, as fast as they go) while
   both run. Throughput is jobs / (last ``finished_at`` − first ``created_at``); latencies
   come from the job rows: enqueue→start = ``started_at − created_at``, enqueue→done =
   ``finished_at − created_at`` (all timestamps are PostgreSQL's clock). The outbox and
   queue backlogs are sampled to show where jobs waited.
3. Backlog (skip with ``--no-backlog``): ``--jobs`` more jobs enqueued while nothing runs,
   then a fresh relay and worker drain them; jobs / (last ``finished_at`` − first
   ``started_at``) is what relay + worker sustain when enqueueing is not the limit.

CPU per process (this one, relay, worker, RabbitMQ, PostgreSQL) is read from /proc.

    .venv/bin/python -m bench.e2e --jobs 5000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aio_pika
import orjson
import psycopg
from psycopg import sql

from jobcore import migrate
from jobcore.amqp.topology import Topology
from jobcore.db import Database
from jobcore.enqueue import enqueue
from jobcore.jobtypes import NoopPayload
from jobcore.registry import load_job_modules
from jobcore.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")
RELAY_MODULE = ROOT / "services" / "relay" / "relay.py"


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def pids_named(name: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


class CpuMeter:
    """Percent of one core used by each group of processes between start() and stop().

    PostgreSQL and RabbitMQ are found by name at both ends, so backends started in
    between count in full; one that exited in between is missed (an underestimate).
    """

    def __init__(self, **extra: int) -> None:
        self.extra = extra

    def _pids(self) -> dict[str, list[int]]:
        return {
            "bench": [os.getpid()],
            "rabbitmq": pids_named("beam.smp"),
            "postgres": pids_named("postgres"),
            **{name: [pid] for name, pid in self.extra.items()},
        }

    def start(self) -> None:
        self._start = {p: cpu_seconds(p) for pids in self._pids().values() for p in pids}
        self._t0 = time.monotonic()

    def stop(self) -> dict[str, float]:
        wall = time.monotonic() - self._t0
        used = {
            group: sum(max(0.0, cpu_seconds(p) - self._start.get(p, 0.0)) for p in pids)
            for group, pids in self._pids().items()
        }
        return {f"{k}_cpu_pct": round(100 * v / wall, 1) for k, v in used.items()}


@contextmanager
def bench_settings(base: Settings, args: argparse.Namespace) -> Iterator[Settings]:
    suffix = uuid.uuid4().hex[:10]
    url = base.database_url.rsplit("/", 1)[0] + f"/jobcore_bench_e2e_{suffix}"
    settings = base.model_copy(
        update={
            "database_url": url,
            "amqp_prefix": f"bench.{suffix}",
            "relay_health_port": 0,
            "worker_health_port": 0,
            "job_modules": ("jobcore.jobtypes",),
            "worker_prefetch": args.prefetch or base.worker_prefetch,
            "worker_concurrency": args.concurrency or base.worker_concurrency,
            "db_pool_max": args.db_pool_max or base.db_pool_max,
        }
    )
    migrate.create_database(settings)
    try:
        migrate.upgrade(settings)
        yield settings
    finally:
        with psycopg.connect(settings.maintenance_database_url(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(settings.database_name)
                )
            )


def process_env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBCORE_")}
    env.update(
        {
            "JOBCORE_DATABASE_URL": settings.database_url,
            "JOBCORE_AMQP_URL": settings.amqp_url,
            "JOBCORE_AMQP_PREFIX": settings.amqp_prefix,
            "JOBCORE_JOB_MODULES": ",".join(settings.job_modules),
            "JOBCORE_RELAY_HEALTH_PORT": "0",
            "JOBCORE_WORKER_HEALTH_PORT": "0",
            "JOBCORE_WORKER_PREFETCH": str(settings.job_prefetch()),
            "JOBCORE_WORKER_CONCURRENCY": str(settings.worker_concurrency),
            "JOBCORE_DB_POOL_MAX": str(settings.db_pool_max),
            "PYTHONPATH": str(ROOT),
        }
    )
    return env


# -- the baseline: raw consume + ack -----------------------------------------------------------


async def raw_consume_ack(settings: Settings, n: int, window: int = 1000) -> dict[str, Any]:
    connection = await aio_pika.connect(settings.amqp_url)
    name = f"{settings.amqp_prefix}.scratch"
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
        body = b'{"v":1,"job_id":"00000000-0000-0000-0000-000000000000","attempt":1,"type":"noop"}'
        for i in range(0, n, window):
            await asyncio.gather(
                *(
                    channel.default_exchange.publish(
                        aio_pika.Message(
                            body,
                            message_id=str(uuid.uuid4()),
                            type="noop",
                            content_type="application/json",
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                            headers={"x-envelope-version": 1},
                        ),
                        routing_key=name,
                    )
                    for _ in range(min(window, n - i))
                )
            )
        consumer_channel = await connection.channel()
        await consumer_channel.set_qos(prefetch_count=settings.job_prefetch())
        scratch = await consumer_channel.declare_queue(name, passive=True)
        done = asyncio.Event()
        acked = 0
        first: float | None = None

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal acked, first
            if first is None:
                first = time.perf_counter()
            await message.ack()
            acked += 1
            if acked == n:
                done.set()

        meter = CpuMeter()
        meter.start()
        started = time.perf_counter()
        tag = await scratch.consume(on_message)
        await asyncio.wait_for(done.wait(), timeout=300)
        seconds = time.perf_counter() - started
        cpu = meter.stop()
        await scratch.cancel(tag)
        return {"msgs_per_s": round(n / seconds), "seconds": round(seconds, 3), **cpu}
    finally:
        cleanup = await connection.channel()
        await cleanup.queue_delete(name)
        await connection.close()


# -- end to end --------------------------------------------------------------------------------


def start(command: str, settings: Settings, log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "services.cli", command],
            env=process_env(settings),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


async def count_succeeded(db: Database) -> int:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM jobs WHERE status = 'succeeded'")
        row = await cur.fetchone()
    return int(row["n"]) if row else 0


async def wait_succeeded(db: Database, n: int, timeout: float, procs: list[Any]) -> None:
    deadline = time.monotonic() + timeout
    while await count_succeeded(db) < n:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[-1]} exited early with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {await count_succeeded(db)} of {n} jobs done in {timeout}s")
        await asyncio.sleep(0.05)  # polling the database for the count


async def enqueue_all(db: Database, topology: Topology, n: int, connections: int) -> float:
    noop = load_job_modules(("jobcore.jobtypes",)).get("noop")
    payload = NoopPayload()

    async def lane(count: int) -> None:
        for _ in range(count):
            async with db.unit_of_work() as uow:
                await enqueue(uow, topology, tenant="bench", job_type=noop, payload=payload)
                await uow.commit()

    share, extra = divmod(n, connections)
    started = time.perf_counter()
    await asyncio.gather(*(lane(share + (i < extra)) for i in range(connections)))
    return time.perf_counter() - started


async def sample_backlog(
    settings: Settings, topology: Topology, db: Database, backlog: dict[str, list[int]]
) -> None:
    """Every 0.2 s: outbox rows waiting for the relay, and messages waiting in the queue."""
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        while True:
            async with db.connection() as conn:
                cur = await conn.execute("SELECT count(*) AS n FROM outbox")
                row = await cur.fetchone()
            queue = await channel.declare_queue(topology.queue_name("default"), passive=True)
            backlog["outbox"].append(int(row["n"]) if row else 0)
            backlog["queue"].append(int(queue.declaration_result.message_count or 0))
            await asyncio.sleep(0.2)  # the sampling period


STATS_SQL = """
SELECT count(*) AS jobs,
       extract(epoch FROM max(finished_at) - min(created_at)) AS seconds,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at))
           AS start_p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at))
           AS start_p99,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at))
           AS done_p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at))
           AS done_p99,
       max(attempts) AS max_attempts_used,
       extract(epoch FROM max(created_at) - min(created_at)) AS enqueue_seconds
FROM jobs WHERE status = 'succeeded' AND tenant = 'bench'
"""


async def end_to_end(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    topology = Topology(settings.amqp_prefix, settings.amqp_delivery_limit)
    logs = Path(args.log_dir)
    relay = start("relay", settings, logs / "e2e-relay.log")
    worker = start("worker", settings, logs / "e2e-worker.log")
    db = Database(settings, min_size=args.connections, max_size=args.connections, name="bench")
    await db.open(wait=True)
    results: dict[str, Any] = {}
    try:
        # Warm-up: one job through the whole path, so both processes are up and connected.
        await enqueue_all(db, topology, 1, 1)
        await wait_succeeded(db, 1, 60, [relay, worker])
        async with db.connection() as conn:
            await conn.execute("UPDATE jobs SET tenant = 'warmup'")

        meter = CpuMeter(relay=relay.pid, worker=worker.pid)
        meter.start()
        backlog: dict[str, list[int]] = {"outbox": [], "queue": []}
        sampler = asyncio.create_task(sample_backlog(settings, topology, db, backlog))
        try:
            enqueue_seconds = await enqueue_all(db, topology, args.jobs, args.connections)
            await wait_succeeded(db, args.jobs + 1, args.timeout, [relay, worker])
        finally:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
        cpu = meter.stop()
        async with db.connection() as conn:
            cur = await conn.execute(STATS_SQL)
            stats = await cur.fetchone()
        assert stats is not None
        seconds = float(stats["seconds"])
        results = {
            "jobs": stats["jobs"],
            "jobs_per_s": round(stats["jobs"] / seconds),
            "seconds": round(seconds, 3),
            "enqueue_per_s": round(args.jobs / enqueue_seconds),
            "enqueue_to_start_ms": {
                "p50": round(1000 * stats["start_p50"], 1),
                "p99": round(1000 * stats["start_p99"], 1),
            },
            "enqueue_to_done_ms": {
                "p50": round(1000 * stats["done_p50"], 1),
                "p99": round(1000 * stats["done_p99"], 1),
            },
            "max_attempts_used": stats["max_attempts_used"],
            # Where jobs waited: rows not yet published, messages not yet consumed.
            "backlog_max": {k: max(v, default=0) for k, v in backlog.items()},
            "backlog_mean": {k: round(sum(v) / len(v)) if v else 0 for k, v in backlog.items()},
            **cpu,
        }
    finally:
        await db.close()
        results["relay_exit_code"] = stop(relay)
        results["worker_exit_code"] = stop(worker)
        connection = await aio_pika.connect(settings.amqp_url)
        async with connection:
            await topology.delete(await connection.channel(), {"default"})
    return results


BACKLOG_SQL = """
SELECT count(*) AS jobs, extract(epoch FROM max(finished_at) - min(started_at)) AS seconds
FROM jobs WHERE status = 'succeeded' AND tenant = 'bench'
"""


async def drain_backlog(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    """The jobs are all enqueued first; then one relay and one worker drain them."""
    topology = Topology(settings.amqp_prefix, settings.amqp_delivery_limit)
    db = Database(settings, min_size=args.connections, max_size=args.connections, name="bench")
    await db.open(wait=True)
    logs = Path(args.log_dir)
    results: dict[str, Any] = {}
    try:
        async with db.connection() as conn:
            await conn.execute("UPDATE jobs SET tenant = 'live' WHERE tenant = 'bench'")
            cur = await conn.execute("SELECT count(*) AS n FROM jobs WHERE status = 'succeeded'")
            row = await cur.fetchone()
        done_before = int(row["n"]) if row else 0
        await enqueue_all(db, topology, args.jobs, args.connections)
        relay = start("relay", settings, logs / "backlog-relay.log")
        worker = start("worker", settings, logs / "backlog-worker.log")
        meter = CpuMeter(relay=relay.pid, worker=worker.pid)
        meter.start()
        try:
            await wait_succeeded(db, done_before + args.jobs, args.timeout, [relay, worker])
            cpu = meter.stop()
        finally:
            results["relay_exit_code"] = stop(relay)
            results["worker_exit_code"] = stop(worker)
        async with db.connection() as conn:
            cur = await conn.execute(BACKLOG_SQL)
            stats = await cur.fetchone()
        assert stats is not None
        seconds = float(stats["seconds"])
        # From the first claim to the last success: process start-up is not counted.
        results.update(
            jobs=stats["jobs"],
            jobs_per_s=round(stats["jobs"] / seconds),
            seconds=round(seconds, 3),
            **{k: v for k, v in cpu.items() if k != "bench_cpu_pct"},
        )
    finally:
        await db.close()
        connection = await aio_pika.connect(settings.amqp_url)
        async with connection:
            await topology.delete(await connection.channel(), {"default"})
    return results


async def run(args: argparse.Namespace) -> dict[str, Any]:
    if not RELAY_MODULE.exists():  # pragma: no cover - the relay exists in this tree
        raise SystemExit("bench.e2e needs services/relay (jobcore relay)")
    with bench_settings(load_settings(), args) as settings:
        baseline = await raw_consume_ack(settings, args.jobs)
        e2e = await end_to_end(settings, args)
        backlog = await drain_backlog(settings, args) if args.backlog else None
    return {
        "jobs": args.jobs,
        "prefetch": settings.job_prefetch(),
        "concurrency": settings.worker_concurrency,
        "enqueue_connections": args.connections,
        "db_pool_max": settings.db_pool_max,
        "drained_by": "jobcore relay (one process)",
        "raw_consume_ack": baseline,
        "end_to_end": e2e,
        "ratio_e2e_vs_raw_consume_ack": round(e2e["jobs_per_s"] / baseline["msgs_per_s"], 3),
        **(
            {
                "backlog_drain": backlog,
                "ratio_backlog_vs_raw_consume_ack": round(
                    backlog["jobs_per_s"] / baseline["msgs_per_s"], 3
                ),
            }
            if backlog
            else {}
        ),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.e2e", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=5000, help="no-op jobs (default 5000)")
    parser.add_argument("--connections", type=int, default=8, help="enqueue connections")
    parser.add_argument(
        "--prefetch", type=int, default=0, help="worker prefetch (at most the concurrency)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=0, help="worker concurrency (default: setting)"
    )
    parser.add_argument(
        "--db-pool-max", type=int, default=0, help="connections per process (default: setting)"
    )
    parser.add_argument(
        "--no-backlog",
        dest="backlog",
        action="store_false",
        help="skip the second run (all jobs enqueued first, then drained)",
    )
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for the jobs")
    parser.add_argument("--log-dir", default="/tmp/jobcore-bench-e2e", help="process logs")
    args = parser.parse_args(argv)
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    results = asyncio.run(run(args))
    print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
    e2e, raw = results["end_to_end"], results["raw_consume_ack"]
    print(
        f"e2e {e2e['jobs_per_s']} jobs/s = {results['ratio_e2e_vs_raw_consume_ack']:.2f}x raw "
        f"consume+ack ({raw['msgs_per_s']} msg/s, prefetch {results['prefetch']}); "
        f"enqueue->start p50 {e2e['enqueue_to_start_ms']['p50']} ms "
        f"p99 {e2e['enqueue_to_start_ms']['p99']} ms; enqueue->done p50 "
        f"{e2e['enqueue_to_done_ms']['p50']} ms p99 {e2e['enqueue_to_done_ms']['p99']} ms"
        + (
            f"; backlog drained at {results['backlog_drain']['jobs_per_s']} jobs/s = "
            f"{results['ratio_backlog_vs_raw_consume_ack']:.2f}x"
            if "backlog_drain" in results
            else ""
        )
    )


if __name__ == "__main__":
    main()
