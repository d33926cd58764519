"""peers: jobcore's no-op drain next to Celery's and Procrastinate's, same count, same run.

Needs the ``bench`` extra (celery, procrastinate). Every measurement drains ``jobs``
no-op jobs that were all written before the clock starts, and the three systems take
turns within each run:

- **jobcore pipeline**: one relay and one worker run (ready) while the ``noop`` type is
  paused; the jobs are enqueued in batches of 1,000 (job + outbox rows) and the tables
  analysed; the clock starts at the resume and stops at the last ``finished_at``.
- **jobcore worker only**: a relay without a queue depth limit publishes every job's
  message and stops; then one worker starts (and, measured apart, two: as many processes
  as Celery's pool). jobs/s from the first ``started_at`` to the last ``finished_at``.
- **Celery** (RabbitMQ broker, prefork pool of 2, results ignored), on its default classic
  queue and on a quorum queue (jobcore's kind): the tasks are sent, then the worker
  starts; timed from the first message taken off the queue to the queue's last (its
  depth, polled every 20 ms; the pool's prefetch of 8 is in flight at both ends).
- **Procrastinate** (concurrency 8, on a scratch database of its own): the jobs are
  deferred in batches, the table analysed (as autovacuum would; without it its fetch
  falls to tens of jobs/s), then a one-shot worker runs; timed from the first ``started``
  event to the last ``succeeded`` one.

Over HTTP, as users call it, each run also POSTs ``min(jobs, http_jobs)`` no-op jobs
(``--http-jobs``, 2,000 by default) at 16 and at 64 connections, with the e2e scenario's
load generator, to jobcore (one API, one relay, one worker) and to the baselines a user
would build (:mod:`services.bench.peers_http_app`, one process each): FastAPI calling
Celery's ``apply_async`` and answering 202 with the task id, a prefork-2 worker with
``acks_late`` and ``task_track_started``, the PostgreSQL result backend on a scratch
database; and FastAPI calling Procrastinate's ``defer_async`` over its connector's pool
(as many connections as jobcore's API may hold) and answering 202 with the job id, a
Procrastinate worker of concurrency 8, on the drain's database (the drain's jobs, done,
stay in its table, as a deployment's history would). Each run waits until every job
succeeded. Reported: jobs/s from the first enqueue to the last done, and enqueue→start
p50/p99 (jobcore: the job rows; Celery: the enqueue time the API passes to the task, the
start time the task returns, and the backend's ``date_done``; Procrastinate: its
``deferred``, ``started`` and ``succeeded`` events), and the load generator's side: its
POSTs/s and its CPU (this process's, % of one core, over the POSTs).

Each drain of jobcore and of Celery also reports the CPU-ms per job of every process
group over its clock's window: its own processes, PostgreSQL (the backends of the
scenario's database: jobcore's; Celery uses none) and RabbitMQ (the whole node: it runs
nothing else here). A worker-only drain's window opens once its stack reports ready, so
it counts the jobs that finished inside it (the workers consume from their start). The
drains' stacks run no API (the jobs are written to the database directly): none starts
beside the workers, and none idles in a drain's window.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import aio_pika
import psycopg

from jobcore.amqp.connection import connect as connect_broker
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import Stack, free_port
from jobcore.testing.processes import ROOT
from jobcore.testing.scratch import database_url
from jobcore.testing.waiting import eventually
from jobcore.usecases.enqueue.write_many import MAX_BATCH_ITEMS
from jobcore.usecases.pauses import set_paused
from services.bench.harness import UNLIMITED_QUEUES, Bench, Options, pids, relays_ready
from services.bench.http import http_load, post
from services.bench.measure import CpuMeter, ms_per_job, pids_in_group
from services.bench.report import Figure, Section
from services.bench.scenarios.e2e import count_finished, db_now, preload, wait_done
from services.bench.scenarios.scale import backend_pids

TITLE = "jobcore's no-op drain vs Celery and Procrastinate"
CELERY_CONCURRENCY = 2
PROCRASTINATE_CONCURRENCY = 8
DEPTH_POLL = 0.02
DRAIN_TIMEOUT = 900.0
ACTOR = "bench:peers"
PEER_APPS = "services.bench.peers_apps"
# Celery's queue types: its default (classic) and the quorum queue jobcore uses.
CELERY_QUEUE_TYPES = ("classic", "quorum")


@dataclass(frozen=True)
class Drain:
    """One drain: its rate, and the CPU-ms per job of each process group while it ran."""

    rate: float
    # Empty where not measured (Procrastinate; a drain over before its window opened).
    cpu_ms_per_job: dict[str, float]


def roles(stack: Stack) -> dict[str, list[int]]:
    """The stack's processes by role (``worker-0`` and ``worker-1``: ``worker``)."""
    members: dict[str, list[int]] = defaultdict(list)
    for name, pid in pids(stack).items():
        members[name.partition("-")[0]].append(pid)
    return dict(members)


class DrainMeter:
    """CPU per process group over a drain: the stack's roles, RabbitMQ, and PostgreSQL as
    the backends of the scenario's database (read at both ends: one that connected in
    between counts from its start)."""

    def __init__(self, stack: Stack, db: Database) -> None:
        self.db = db
        self.backends: list[int] = []
        groups: dict[str, Callable[[], list[int]]] = {
            role: _fixed_pids(found) for role, found in roles(stack).items()
        }
        groups["postgres"] = lambda: list(self.backends)
        self.meter = CpuMeter(groups=groups)

    async def start(self) -> None:
        self.backends = await backend_pids(self.db)
        self.meter.start()

    async def stop(self, jobs: int) -> dict[str, float]:
        """CPU-ms per job of each group over ``jobs`` jobs."""
        self.backends = sorted(set(self.backends) | set(await backend_pids(self.db)))
        self.meter.stop()
        return ms_per_job(self.meter.seconds, jobs)


def _fixed_pids(found: list[int]) -> Callable[[], list[int]]:
    return lambda: list(found)


def steps(options: Options) -> int:
    return options.runs


def available() -> str | None:
    """Why the scenario cannot run here (None: it can)."""
    missing = [m for m in ("celery", "procrastinate") if importlib.util.find_spec(m) is None]
    if missing:
        return f"the peers scenario needs {' and '.join(missing)}: pip install 'jobcore[bench]'"
    return None


# -- jobcore ---------------------------------------------------------------------------------


async def seconds_between(db: Database, query: str, params: dict[str, Any]) -> float:
    async with db.connection() as conn:
        cur = await conn.execute(query, params)
        row = await cur.fetchone()
    assert row is not None
    assert row["seconds"] is not None, "no job finished"
    return float(row["seconds"])


async def jobcore_pipeline(bench: Bench, config: Settings, db: Database, n: int) -> Drain:
    """Preloaded while the type is paused, timed from the resume."""
    topology = Topology.from_settings(config)
    async with bench.stack(config, "peers-pipeline", relays=1, workers=1, api=False) as stack:
        await relays_ready(stack)
        await set_paused(db, "type", "noop", paused=True, actor=ACTOR)
        since = await db_now(db)
        await preload(db, topology, n)
        resumed = await db_now(db)
        meter = DrainMeter(stack, db)
        await meter.start()
        await set_paused(db, "type", "noop", paused=False, actor=ACTOR)
        await wait_done(db, since, n, stack.processes, DRAIN_TIMEOUT)
        cpu_ms_per_job = await meter.stop(n)
        seconds = await seconds_between(
            db,
            "SELECT extract(epoch FROM max(finished_at) - %(t0)s) AS seconds FROM jobcore.jobs"
            " WHERE created_at >= %(since)s",
            {"t0": resumed, "since": since},
        )
    return Drain(n / seconds, cpu_ms_per_job)


async def outbox_empty(db: Database) -> bool:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT NOT EXISTS (SELECT 1 FROM jobcore.outbox) AS empty")
        row = await cur.fetchone()
    return row is not None and bool(row["empty"])


async def jobcore_worker_only(
    bench: Bench, section: Section, config: Settings, db: Database, n: int, workers: int = 1
) -> Drain:
    """``workers`` worker processes on a queue that already holds every job's message
    (two: as many processes as Celery's prefork pool)."""
    topology = Topology.from_settings(config)
    since = await db_now(db)
    async with bench.stack(
        config, "peers-fill", relays=1, workers=0, api=False, env=UNLIMITED_QUEUES
    ) as stack:
        await relays_ready(stack)
        await preload(db, topology, n)
        await eventually(
            lambda: outbox_empty(db), timeout=DRAIN_TIMEOUT, interval=0.1, what="the outbox"
        )
    async with (
        bench.stack(
            config, f"peers-worker{workers}", relays=0, workers=workers, api=False
        ) as stack,
        bench.profiled(section, f"worker{workers}", pids(stack)),
    ):
        # The workers consume from their start, before the stack reports them ready: CPU
        # per job is over the jobs that finished while it was measured.
        meter = DrainMeter(stack, db)
        await meter.start()
        before = await count_finished(db, since)
        await wait_done(db, since, n, stack.processes, DRAIN_TIMEOUT)
        measured = n - before
        # None inside the window (a drain shorter than the stack's start): no figure.
        cpu_ms_per_job = await meter.stop(measured) if measured else {}
    seconds = await seconds_between(
        db,
        "SELECT extract(epoch FROM max(finished_at) - min(started_at)) AS seconds FROM jobcore.jobs"
        " WHERE created_at >= %(since)s",
        {"since": since},
    )
    return Drain(n / seconds, cpu_ms_per_job)


# -- the peers -------------------------------------------------------------------------------


@contextlib.contextmanager
def peer_process(argv: list[str], env: dict[str, str], log_path: Any) -> Any:
    """A peer's worker in a session of its own (Celery forks children): stopped with
    SIGTERM to its process group, SIGKILL after a grace period."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield proc
        finally:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)


def _peer_env(config: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBCORE_", "BENCH_PEERS_"))}
    env["PYTHONPATH"] = str(ROOT)
    env["BENCH_PEERS_AMQP_URL"] = config.amqp_urls[0]
    env.update(extra)
    return env


def send_celery_tasks(config: Settings, queue: str, queue_type: str, n: int) -> None:
    os.environ["BENCH_PEERS_AMQP_URL"] = config.amqp_urls[0]
    os.environ["BENCH_PEERS_CELERY_QUEUE"] = queue
    from kombu.entity import Queue

    from services.bench.peers_apps import celery_app, celery_noop

    celery_app.conf.broker_url = config.amqp_urls[0]
    celery_app.conf.task_default_queue = queue
    # A Queue, not a name: a name would be declared with the queue type of the app as
    # this process first configured it (an earlier run's).
    target = Queue(queue, queue_arguments={"x-queue-type": queue_type})  # type: ignore[no-untyped-call]
    with celery_app.producer_or_acquire() as producer:
        for _ in range(n):
            celery_noop.apply_async(producer=producer, queue=target)


async def queue_depth(channel: aio_pika.abc.AbstractChannel, queue: str) -> int:
    declared = await channel.declare_queue(queue, passive=True)
    count = declared.declaration_result.message_count
    return int(count or 0)


async def celery_drain(bench: Bench, config: Settings, n: int, queue_type: str) -> Drain:
    """Celery's drain of ``n`` no-op tasks on a queue of ``queue_type`` (classic, quorum)."""
    queue = f"{config.amqp_prefix}.celery.{queue_type}"
    connection = await connect_broker(config)
    try:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": queue_type})
        await asyncio.to_thread(send_celery_tasks, config, queue, queue_type, n)
        await eventually(
            lambda: _depth_at_least(channel, queue, n),
            timeout=60,
            interval=0.05,
            what="the Celery tasks to be queued",
        )
        argv = [
            sys.executable, "-m", "celery", "-A", f"{PEER_APPS}:celery_app", "worker",
            "-P", "prefork", "-c", str(CELERY_CONCURRENCY), "-Q", queue, "-l", "warning",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        env = _peer_env(
            config, BENCH_PEERS_CELERY_QUEUE=queue, BENCH_PEERS_CELERY_QUEUE_TYPE=queue_type
        )
        log_path = bench.log_dir / f"peers-celery-{queue_type}.log"
        with peer_process(argv, env, log_path) as proc:
            # Celery's worker and the pool processes it forks: its own process group. It
            # uses no database.
            meter = CpuMeter(
                groups={"celery": lambda: pids_in_group(proc.pid), "postgres": lambda: []}
            )
            first: float | None = None
            deadline = time.monotonic() + DRAIN_TIMEOUT
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"the Celery worker exited; see logs/{log_path.name}")
                depth = await queue_depth(channel, queue)
                now = time.perf_counter()
                if first is None and depth < n:
                    first = now
                    meter.start()
                if depth == 0 and first is not None:
                    meter.stop()
                    meter.seconds.pop("postgres")
                    return Drain(n / max(now - first, 1e-6), ms_per_job(meter.seconds, n))
                await asyncio.sleep(DEPTH_POLL)  # the drain clock's resolution
            raise RuntimeError(f"Celery did not drain {n:,} tasks in {DRAIN_TIMEOUT:.0f}s")
    finally:
        with contextlib.suppress(Exception):
            cleanup = await connection.channel()
            await cleanup.queue_delete(queue)
        await connection.close()


async def _depth_at_least(channel: aio_pika.abc.AbstractChannel, queue: str, n: int) -> bool:
    return await queue_depth(channel, queue) >= n


@contextlib.asynccontextmanager
async def procrastinate_database(config: Settings) -> AsyncIterator[str]:
    """A scratch database with Procrastinate's schema; dropped afterwards."""
    name = f"bench_peers_{uuid.uuid4().hex[:10]}"
    admin = database_url(config.database_url, "postgres")
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        await conn.execute(f'CREATE DATABASE "{name}"')
    url = database_url(config.database_url, name)
    try:
        from procrastinate import schema

        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute(schema.SchemaManager.get_schema())
        yield url
    finally:
        async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def procrastinate_drain(bench: Bench, config: Settings, n: int, dsn: str) -> float:
    import procrastinate
    from procrastinate.tasks import configure_task

    from services.bench.peers_apps import procrastinate_app

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("TRUNCATE procrastinate_events, procrastinate_jobs CASCADE")
    app = procrastinate_app.with_connector(procrastinate.PsycopgConnector(conninfo=dsn))
    async with app.open_async():
        # Bound to this app's connector (the module's app reads its DSN at import).
        task = configure_task(name="noop", job_manager=app.job_manager)
        for start in range(0, n, MAX_BATCH_ITEMS):
            await task.batch_defer_async(*([{}] * min(MAX_BATCH_ITEMS, n - start)))
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        # As autovacuum would after a bulk insert: without statistics its fetch is slow.
        await conn.execute("ANALYZE procrastinate_jobs")
        await conn.execute("ANALYZE procrastinate_events")
    argv = [
        sys.executable, "-m", "procrastinate", "--app", f"{PEER_APPS}.procrastinate_app",
        "--log-level", "warning", "worker", "--concurrency", str(PROCRASTINATE_CONCURRENCY),
        "--one-shot",
    ]  # fmt: skip
    env = _peer_env(config, BENCH_PEERS_PROCRASTINATE_DSN=dsn)
    with peer_process(argv, env, bench.log_dir / "peers-procrastinate.log") as proc:
        await asyncio.wait_for(asyncio.to_thread(proc.wait), DRAIN_TIMEOUT)
        if proc.returncode != 0:
            raise RuntimeError("the Procrastinate worker failed; see logs/peers-procrastinate.log")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FILTER (WHERE type = 'succeeded'),"
            " extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')"
            "                    - min(at) FILTER (WHERE type = 'started'))"
            " FROM procrastinate_events"
        )
        row = await cur.fetchone()
    assert row is not None
    if row[0] != n:
        raise RuntimeError(f"Procrastinate ran {row[0]} of {n} jobs")
    return n / float(row[1])


async def run(bench: Bench) -> Section:
    why = available()
    if why is not None:
        raise RuntimeError(why)
    options = bench.options
    n = options.jobs
    # Bounded apart from the drains': each HTTP run waits for every job it POSTed.
    http_n = min(n, options.http_jobs)
    section = Section(
        "peers",
        TITLE,
        f"{n:,} no-op jobs per run, written before the clock starts; jobcore: one relay + "
        f"one worker (pipeline, timed from the resume of the paused type), and one worker "
        f"and two (Celery's process count) on a full quorum queue; Celery "
        f"{_version('celery')} (RabbitMQ, prefork {CELERY_CONCURRENCY}, results ignored) on "
        f"its default classic queue and on a quorum queue; Procrastinate "
        f"{_version('procrastinate')} (concurrency {PROCRASTINATE_CONCURRENCY}, its table "
        f"analysed after the bulk defer); {options.runs} interleaved runs on the same machine. "
        f"CPU-ms per job (jobcore and Celery): utime + stime of each process group over the "
        f"drain's window, PostgreSQL as the backends of the scenario's database, RabbitMQ "
        f"as its node, over the jobs finished in it; `all` sums a run's groups but the "
        f"bench's own (each group's figure below is its median over the runs, and so is "
        f"`all`). Over HTTP: {http_n:,} no-op jobs POSTed over "
        f"{' and '.join(map(str, HTTP_CLIENTS))} connections (the e2e scenario's load "
        f"generator) to jobcore (one API, relay, worker), to {CELERY_HTTP} (a FastAPI "
        f"app answering 202 with the task id, Celery's PostgreSQL result backend) and to "
        f"{PROCRASTINATE_HTTP} (a FastAPI app answering 202 with the job id, its "
        f"connector's pool of up to {bench.config.db_pool_max} connections, the drain's "
        f"database); jobs/s from the first enqueue to the last done, enqueue→start from each "
        f"job's times (Procrastinate: its deferred and started events). The load "
        f"generator's POSTs/s and CPU (% of one core over the POSTs) are in the table below.",
    )
    drains: dict[str, list[Drain]] = defaultdict(list)
    http: dict[str, list[dict[int, HttpRun]]] = defaultdict(list)
    async with bench.scratch("peers") as config, procrastinate_database(config) as dsn:
        db = Database(config, min_size=1, max_size=2, name="bench-peers")
        await db.open(wait=True)
        try:
            for run_number in range(options.runs):
                bench.step(f"peers: run {run_number + 1} of {options.runs}")
                drains["pipeline"].append(await jobcore_pipeline(bench, config, db, n))
                for queue_type in CELERY_QUEUE_TYPES:
                    drains[f"celery {queue_type}"].append(
                        await celery_drain(bench, config, n, queue_type)
                    )
                for workers, name in ((1, "worker"), (2, "worker2")):
                    drains[name].append(
                        await jobcore_worker_only(bench, section, config, db, n, workers)
                    )
                drains["procrastinate"].append(
                    Drain(await procrastinate_drain(bench, config, n, dsn), {})
                )
                http["jobcore"].append(await jobcore_http(bench, config, db, http_n))
                http["celery"].append(await celery_http(bench, config, http_n))
                http["procrastinate"].append(await procrastinate_http(bench, config, http_n, dsn))
        finally:
            await db.close()
    rates = {name: [round(d.rate, 1) for d in runs] for name, runs in drains.items()}
    case = f"{n:,} no-op jobs"
    celery = f"Celery, prefork {CELERY_CONCURRENCY}"
    celery_quorum = f"{celery}, quorum queue"
    procrastinate = f"Procrastinate, concurrency {PROCRASTINATE_CONCURRENCY}"
    for metric, ours in (
        ("pipeline jobs/s", "pipeline"),
        ("worker-only jobs/s", "worker"),
        ("worker-only jobs/s, 2 workers", "worker2"),
    ):
        section.add(Figure(case, metric, rates[ours], celery, rates["celery classic"]))
    for metric, ours in (("pipeline jobs/s", "pipeline"), ("worker-only jobs/s", "worker")):
        section.add(Figure(case, metric, rates[ours], celery_quorum, rates["celery quorum"]))
        section.add(Figure(case, metric, rates[ours], procrastinate, rates["procrastinate"]))
    for clients in HTTP_CLIENTS:
        http_case = f"{http_n:,} jobs POSTed over {clients} connections"
        for metric, attribute, better in (
            ("POST→succeeded jobs/s", "rate", "higher"),
            ("enqueue→start p50 ms", "start_p50", "lower"),
            ("enqueue→start p99 ms", "start_p99", "lower"),
        ):
            for baseline, peer in ((CELERY_HTTP, "celery"), (PROCRASTINATE_HTTP, "procrastinate")):
                section.add(
                    Figure(
                        http_case,
                        metric,
                        [round(getattr(r[clients], attribute), 2) for r in http["jobcore"]],
                        baseline,
                        [round(getattr(r[clients], attribute), 2) for r in http[peer]],
                        better=better,
                    )
                )
    section.details.setdefault("tables", []).append(load_generator_table(http))
    section.details["http_runs"] = {
        name: [{str(c): asdict(r) for c, r in run.items()} for run in runs]
        for name, runs in http.items()
    }
    cpu_all = {
        name: [d.cpu_ms_per_job["all"] for d in runs if d.cpu_ms_per_job]
        for name, runs in drains.items()
    }
    for baseline, name in ((celery, "celery classic"), (celery_quorum, "celery quorum")):
        if cpu_all["worker"] and cpu_all[name]:
            section.add(
                Figure(
                    case,
                    "worker-only CPU-ms/job, all processes",
                    cpu_all["worker"],
                    baseline,
                    cpu_all[name],
                    better="lower",
                )
            )
    labels = {
        "pipeline": "jobcore pipeline",
        "worker": "jobcore worker-only",
        "worker2": "jobcore worker-only, 2 workers",
        "celery classic": celery,
        "celery quorum": celery_quorum,
    }
    section.cpu_ms_per_job = {
        labels[name]: median_per_group([d.cpu_ms_per_job for d in drains[name] if d.cpu_ms_per_job])
        for name in labels
        if any(d.cpu_ms_per_job for d in drains[name])
    }
    section.details["rates"] = rates
    section.details["cpu_ms_per_job_runs"] = {
        labels[name]: [d.cpu_ms_per_job for d in drains[name]] for name in labels
    }
    section.details["load_average"] = list(os.getloadavg())
    return section


def median_per_group(runs: list[dict[str, float]]) -> dict[str, float]:
    """The median of each group's CPU-ms per job over the runs, ``all`` last."""
    groups = [*sorted({g for run in runs for g in run} - {"all"}), "all"]
    return {g: round(statistics.median(run.get(g, 0.0) for run in runs), 3) for g in groups}


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


# -- the HTTP baseline a user would build with Celery -----------------------------------------

HTTP_APP = "services.bench.peers_http_app"
# The connection counts of the HTTP comparison (jobcore's e2e POSTs over 16).
HTTP_CLIENTS = (16, 64)
CELERY_HTTP = f"FastAPI + Celery apply_async, prefork {CELERY_CONCURRENCY}, acks_late, PG results"
PROCRASTINATE_HTTP = f"FastAPI + Procrastinate defer_async, concurrency {PROCRASTINATE_CONCURRENCY}"
HTTP_LATENCY = """
SELECT count(*) AS jobs,
       extract(epoch FROM max(finished_at) - min(created_at)) AS seconds,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at))
           AS start_p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at))
           AS start_p99
FROM jobcore.jobs WHERE created_at >= %(since)s
"""


@dataclass(frozen=True)
class HttpRun:
    """POST→succeeded jobs/s and enqueue→start p50/p99 (ms) of one HTTP run, and the load
    generator's side: its POSTs/s and its CPU over the POSTs (% of one core)."""

    rate: float
    start_p50: float
    start_p99: float
    posts_per_s: float = 0.0
    load_cpu_pct: float = 0.0


@dataclass(frozen=True)
class Load:
    """The load generator's side of one HTTP run."""

    errors: int
    posts_per_s: float
    cpu_pct: float

    def into(self, run: HttpRun) -> HttpRun:
        return replace(run, posts_per_s=self.posts_per_s, load_cpu_pct=self.cpu_pct)


async def load(port: int, request: bytes, clients: int, n: int) -> Load:
    """``n`` POSTs over ``clients`` connections; the load generator is this process (the
    bench does nothing else meanwhile), so its CPU over them shows whether it, and not the
    server, set the pace (near 100 % of a core: it did)."""
    cpu = time.process_time()
    _, seconds, errors = await http_load(port, request, clients, n)
    used = time.process_time() - cpu
    return Load(errors, round(n / max(seconds, 1e-6), 1), round(100 * used / max(seconds, 1e-6), 1))


def load_generator_table(http: dict[str, list[dict[int, HttpRun]]]) -> dict[str, Any]:
    """The load generator's POSTs/s and CPU per system and connection count (medians)."""
    names = {"jobcore": "jobcore", "celery": CELERY_HTTP, "procrastinate": PROCRASTINATE_HTTP}
    rows = []
    for clients in HTTP_CLIENTS:
        for name, label in names.items():
            runs = [run[clients] for run in http.get(name, []) if clients in run]
            if runs:
                rows.append(
                    [
                        label,
                        clients,
                        round(statistics.median(r.posts_per_s for r in runs), 1),
                        round(statistics.median(r.load_cpu_pct for r in runs), 1),
                        round(statistics.median(r.rate for r in runs), 1),
                    ]
                )
    busiest = max(
        (r.load_cpu_pct for runs in http.values() for run in runs for r in run.values()),
        default=0.0,
    )
    return {
        "title": "Over HTTP: the load generator (median over runs)",
        "note": (
            "The load generator is the bench's own process (asyncio, keep-alive connections). "
            "Its CPU is its utime + stime over the POSTs, in % of one core (near 100 %, it "
            f"and not the servers would set the pace; at most {busiest:.1f} % in any run "
            "here). POSTs/s counts the answers (202) over the same time."
        ),
        "columns": ["system", "connections", "POSTs/s", "load generator CPU %", "e2e jobs/s"],
        "rows": rows,
    }


def http_run(enqueued: list[float], started: list[float], done: list[float]) -> HttpRun:
    """An HTTP run from each task's enqueue, start and done times (epoch seconds)."""
    waits = sorted(s - e for e, s in zip(enqueued, started, strict=True))

    def quantile(q: float) -> float:
        return 1000 * statistics.quantiles(waits, n=100, method="inclusive")[round(100 * q) - 1]

    seconds = max(max(done) - min(enqueued), 1e-6)
    return HttpRun(len(enqueued) / seconds, round(quantile(0.5), 2), round(quantile(0.99), 2))


@contextlib.asynccontextmanager
async def celery_backend_database(config: Settings) -> AsyncIterator[str]:
    """A scratch database for Celery's result backend: its SQLAlchemy URL."""
    name = f"bench_celery_{uuid.uuid4().hex[:10]}"
    admin = database_url(config.database_url, "postgres")
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        await conn.execute(f'CREATE DATABASE "{name}"')
    url = database_url(config.database_url, name)
    try:
        yield url
    finally:
        async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def celery_results(dsn: str, since: float) -> tuple[list[float], list[float], list[float]]:
    """(enqueued, started, done) epoch seconds of the succeeded tasks enqueued since
    ``since``, from the result backend's table."""
    import json
    import pickle

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT result, extract(epoch FROM date_done AT TIME ZONE 'UTC') FROM celery_taskmeta"
            " WHERE status = 'SUCCESS'"
        )
        rows = await cur.fetchall()
    times: tuple[list[float], list[float], list[float]] = ([], [], [])
    for raw, done in rows:
        # PickleType around the JSON the backend encoded: the bench's own rows.
        value = pickle.loads(raw)
        result = json.loads(value) if isinstance(value, (str, bytes)) else value
        if result["enqueued"] >= since:
            times[0].append(float(result["enqueued"]))
            times[1].append(float(result["started"]))
            times[2].append(float(done))
    return times


# The HTTP runs' polls share one connection held from before the load: a connection
# every 0.1 s would fork a backend each time on the cores being measured, and on a shared
# server it can find every slot taken.
Watch = psycopg.AsyncConnection[tuple[Any, ...]]


async def _answers(port: int, request: bytes) -> bool:
    """Whether the HTTP app on ``port`` answers one POST without an error."""
    try:
        _, _, errors = await http_load(port, request, 1, 1)
    except OSError:
        return False
    return errors == 0


async def _succeeded(conn: Watch) -> int:
    try:
        cur = await conn.execute("SELECT count(*) FROM celery_taskmeta WHERE status = 'SUCCESS'")
        row = await cur.fetchone()
    except psycopg.errors.UndefinedTable:
        return 0  # the backend creates its table with its first result
    return 0 if row is None else int(row[0])


async def celery_http(bench: Bench, config: Settings, n: int) -> dict[int, HttpRun]:
    """``n`` POSTs to the Celery app at each of :data:`HTTP_CLIENTS` connections, each run
    waited on until every task succeeded in the result backend."""
    queue = f"{config.amqp_prefix}.celery.http"
    runs: dict[int, HttpRun] = {}
    async with celery_backend_database(config) as dsn:
        backend = "db+postgresql+psycopg://" + dsn.split("://", 1)[1]
        env = _peer_env(config, BENCH_PEERS_CELERY_QUEUE=queue, BENCH_PEERS_CELERY_BACKEND=backend)
        port = free_port()
        worker_argv = [
            sys.executable, "-m", "celery", "-A", f"{HTTP_APP}:celery_http", "worker",
            "-P", "prefork", "-c", str(CELERY_CONCURRENCY), "-Q", queue, "-l", "warning",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        api_argv = [
            sys.executable, "-m", "uvicorn", f"{HTTP_APP}:api", "--host", "127.0.0.1",
            "--port", str(port), "--loop", "uvloop", "--http", "httptools",
            "--no-access-log", "--log-level", "warning",
        ]  # fmt: skip
        request = post(port, "/jobs/noop", b"{}")
        with (
            peer_process(worker_argv, env, bench.log_dir / "peers-celery-http-worker.log"),
            peer_process(api_argv, env, bench.log_dir / "peers-celery-http-api.log"),
        ):
            watch = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
            try:
                await eventually(
                    functools.partial(_answers, port, request),
                    timeout=60,
                    interval=0.2,
                    what="the Celery HTTP app",
                )
                await eventually(
                    lambda: _at_least(watch, 1), timeout=60, interval=0.1, what="a Celery task"
                )
                for clients in HTTP_CLIENTS:
                    done_before = await _succeeded(watch)
                    since = time.time()
                    sent = await load(port, request, clients, n)
                    if sent.errors:
                        raise RuntimeError(f"{sent.errors} of {n} POSTs to the Celery app failed")
                    await eventually(
                        functools.partial(_at_least, watch, done_before + n),
                        timeout=DRAIN_TIMEOUT,
                        interval=0.1,
                        what=f"{n:,} Celery tasks to succeed",
                    )
                    runs[clients] = sent.into(http_run(*await celery_results(dsn, since)))
            finally:
                await watch.close()
                with contextlib.suppress(Exception):
                    connection = await connect_broker(config)
                    async with connection:
                        await (await connection.channel()).queue_delete(queue)
    return runs


async def _at_least(conn: Watch, n: int) -> bool:
    return await _succeeded(conn) >= n


async def jobcore_http(bench: Bench, config: Settings, db: Database, n: int) -> dict[int, HttpRun]:
    """jobcore's e2e path at each of :data:`HTTP_CLIENTS` connections: ``n`` POSTs to one
    API, one relay, one worker; from the job rows."""
    runs: dict[int, HttpRun] = {}
    async with bench.stack(config, "peers-http", relays=1, workers=1) as stack:
        await relays_ready(stack)
        auth = {"Authorization": f"Bearer {stack.api_key}"}
        request = post(stack.api_port, "/jobs/noop", b"{}", auth)
        for clients in HTTP_CLIENTS:
            since = await db_now(db)
            sent = await load(stack.api_port, request, clients, n)
            if sent.errors:
                raise RuntimeError(f"{sent.errors} of {n} POSTs to jobcore failed")
            await wait_done(db, since, n, stack.processes, DRAIN_TIMEOUT)
            async with db.connection() as conn:
                cur = await conn.execute(HTTP_LATENCY, {"since": since})
                row = await cur.fetchone()
            assert row is not None
            runs[clients] = sent.into(
                HttpRun(
                    row["jobs"] / float(row["seconds"]),
                    round(1000 * float(row["start_p50"]), 2),
                    round(1000 * float(row["start_p99"]), 2),
                )
            )
    return runs


# -- the HTTP baseline a user would build with Procrastinate ----------------------------------

# Each job's deferred, started and succeeded times (epoch seconds), from Procrastinate's
# own events, for the jobs after ``after`` (the run's: ids only grow).
PROCRASTINATE_TIMES = """
SELECT extract(epoch FROM min(at) FILTER (WHERE type = 'deferred')) AS deferred,
       extract(epoch FROM min(at) FILTER (WHERE type = 'started')) AS started,
       extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')) AS succeeded
FROM procrastinate_events WHERE job_id > %(after)s GROUP BY job_id
"""


async def _last_job_id(conn: Watch) -> int:
    cur = await conn.execute("SELECT coalesce(max(id), 0) FROM procrastinate_jobs")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def _procrastinate_done(conn: Watch, after: int, n: int) -> bool:
    """Whether ``n`` jobs after id ``after`` succeeded (one failed: an error)."""
    cur = await conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'succeeded'),"
        " count(*) FILTER (WHERE status IN ('failed', 'aborted', 'cancelled'))"
        " FROM procrastinate_jobs WHERE id > %(after)s",
        {"after": after},
    )
    row = await cur.fetchone()
    assert row is not None
    if row[1]:
        raise RuntimeError(f"{row[1]} Procrastinate jobs did not succeed")
    return int(row[0]) >= n


async def procrastinate_http(
    bench: Bench, config: Settings, n: int, dsn: str
) -> dict[int, HttpRun]:
    """``n`` POSTs to the Procrastinate app at each of :data:`HTTP_CLIENTS` connections,
    each run waited on until every job succeeded; from Procrastinate's events."""
    runs: dict[int, HttpRun] = {}
    port = free_port()
    worker_argv = [
        sys.executable, "-m", "procrastinate", "--app", f"{PEER_APPS}.procrastinate_app",
        "--log-level", "warning", "worker", "--concurrency", str(PROCRASTINATE_CONCURRENCY),
    ]  # fmt: skip
    api_argv = [
        sys.executable, "-m", "uvicorn", f"{HTTP_APP}:procrastinate_api", "--host", "127.0.0.1",
        "--port", str(port), "--loop", "uvloop", "--http", "httptools",
        "--no-access-log", "--log-level", "warning",
    ]  # fmt: skip
    worker_env = _peer_env(config, BENCH_PEERS_PROCRASTINATE_DSN=dsn)
    api_env = _peer_env(
        config,
        BENCH_PEERS_PROCRASTINATE_DSN=dsn,
        BENCH_PEERS_PROCRASTINATE_POOL_MAX=str(config.db_pool_max),
    )
    request = post(port, "/jobs/noop", b"{}")
    with (
        peer_process(
            worker_argv, worker_env, bench.log_dir / "peers-procrastinate-http-worker.log"
        ),
        peer_process(api_argv, api_env, bench.log_dir / "peers-procrastinate-http-api.log"),
    ):
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watch:
            before = await _last_job_id(watch)

            await eventually(
                functools.partial(_answers, port, request),
                timeout=60,
                interval=0.2,
                what="the Procrastinate HTTP app",
            )
            await eventually(
                functools.partial(_procrastinate_done, watch, before, 1),
                timeout=60,
                interval=0.1,
                what="a Procrastinate job",
            )
            for clients in HTTP_CLIENTS:
                after = await _last_job_id(watch)
                sent = await load(port, request, clients, n)
                if sent.errors:
                    raise RuntimeError(
                        f"{sent.errors} of {n} POSTs to the Procrastinate app failed"
                    )
                await eventually(
                    functools.partial(_procrastinate_done, watch, after, n),
                    timeout=DRAIN_TIMEOUT,
                    interval=0.1,
                    what=f"{n:,} Procrastinate jobs to succeed",
                )
                cur = await watch.execute(PROCRASTINATE_TIMES, {"after": after})
                rows = await cur.fetchall()
                if len(rows) != n or any(None in row for row in rows):
                    raise RuntimeError(f"Procrastinate's events cover {len(rows)} of {n} jobs")
                deferred, started, succeeded = ([float(row[i]) for row in rows] for i in range(3))
                runs[clients] = sent.into(http_run(deferred, started, succeeded))
    return runs
