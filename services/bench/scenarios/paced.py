"""paced: jobcore, Procrastinate and FastAPI + Celery + PostgreSQL results at steady rates
well under capacity, paced the same way, in the same invocation.

Each system runs as a user would deploy it, over HTTP: jobcore's API (``POST
/jobs/noop/batch``), one relay and one worker of 16 handlers; a FastAPI app deferring a
batch with Procrastinate's ``batch_defer_async`` and a Procrastinate worker of concurrency
16; a FastAPI app sending Celery tasks and a prefork worker with ``acks_late`` and the
PostgreSQL result backend (:mod:`services.bench.peers_http_app`). Every job is a no-op.
The load generator (:mod:`services.bench.paced_load`) offers each rate open loop on the
wall clock, batches of up to 128 every 25 ms, for ``--paced-seconds``; the rates are
``--paced-fractions`` of the peak (``--paced-peak``, or measured first: jobcore's
completions per second while it is offered ``--paced-probe-rate`` for
``--paced-probe-seconds``), the same rates for every system. After each step the system
drains; then, per step:

- pickup latency: from the generator's clock just before the batch's request to the
  handler's start (jobcore: the job's ``started_at``; Procrastinate: its ``started``
  event; Celery: the time the task itself reads), p50/p95/p99 from a log-bucket histogram
  of bounded memory (2 % buckets); the first ``WARMUP`` seconds of a step are left out;
- completed/s over the pacing window;
- accounting: every accepted job completed, and completed once (jobcore: one attempt;
  Procrastinate: one ``succeeded`` event per job; Celery: one result row per task);
- WAL bytes per job: ``pg_current_wal_lsn()`` before the step and after its drain (the
  whole cluster's: on a shared server others' writes count; ``--pg-stats`` runs on the
  bench's own cluster);
- heap and index bytes per job of each hot table (growth over the step), and dead tuples
  made per job (``n_tup_upd + n_tup_del`` growth: each update or delete leaves one dead
  row version, whenever vacuum removes it) and those left at the end (``n_dead_tup``);
- CPU-ms per job per process group (utime + stime from /proc over the step and its drain):
  the system's processes, PostgreSQL as the backends of its databases, RabbitMQ's node
  (others' queues count), and the load generator (``bench``, not in ``all``);
- jobcore only: the pickup split by hop from each job's ``published`` event (enqueue →
  relay's claim → confirm → worker start), p50 and p99.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import psycopg

from jobcore.amqp.connection import connect as connect_broker
from jobcore.database.schema import HOT_TABLES
from jobcore.kernel.jobevents import JobEventKind
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import free_port
from jobcore.testing.waiting import eventually
from services.bench.harness import Bench, Options, pids, relays_ready
from services.bench.http import post
from services.bench.measure import CpuMeter, ms_per_job, pids_in_group, with_children
from services.bench.paced_load import MAX_BATCH, TICK, HttpPool, PaceCounts, Pacer
from services.bench.pgstats import BENCH_MARK
from services.bench.pressure_load import Histogram
from services.bench.report import Figure, Section, Series

log = logging.getLogger(__name__)

TITLE = "Pickup latency and cost per job at steady rates, vs Procrastinate and Celery"
# The default; also jobcore-baseline, jobcore-2 and jobcore-relayed.
SYSTEMS = ("jobcore", "procrastinate", "celery")
HANDLERS = 16
CELERY_CONCURRENCY = 2
WARMUP_STEP = 3.0  # seconds of load before a system's first step, at its rate
WARMUP = 2.0  # seconds at the start of each step whose jobs' pickup is left out
DRAIN_TIMEOUT = 300.0
# A backend flushes its table counters (n_tup_upd, n_tup_del) at most once a second while
# busy and within 10 s once idle (PostgreSQL 15): read after this pause.
STATS_SETTLE = 11.0
PROCRASTINATE_TABLES = ("procrastinate_jobs", "procrastinate_events")
CELERY_TABLES = ("celery_taskmeta",)
HTTP_APP = "services.bench.peers_http_app"
PEER_APPS = "services.bench.peers_apps"
CHUNK = 5000  # ids per lookup statement

TABLE_STATS = (
    BENCH_MARK
    + """
SELECT s.relname AS name, pg_table_size(s.relid) AS heap, pg_indexes_size(s.relid) AS index,
       s.n_tup_upd + s.n_tup_del AS dead_made, s.n_dead_tup AS dead
FROM pg_stat_user_tables s
WHERE s.schemaname IN ('jobcore', 'public') AND s.relname = ANY(%(tables)s)
"""
)
WAL_LSN = BENCH_MARK + " SELECT pg_current_wal_lsn()::text AS lsn"
WAL_DIFF = BENCH_MARK + " SELECT pg_wal_lsn_diff(%(b)s::pg_lsn, %(a)s::pg_lsn) AS bytes"
BACKENDS = BENCH_MARK + " SELECT pid FROM pg_stat_activity WHERE datname = ANY(%(names)s)"
# The step's WAL by the hot table it was written for (its heap, indexes and TOAST), from
# pg_walinspect (PostgreSQL 15 and later) over the step's LSN range: each record counted
# once, for the first block it names, when that block is a relation of this database. The
# rest of the step's WAL (commits, other tables, other databases) is not attributed.
WALINSPECT = BENCH_MARK + " CREATE EXTENSION IF NOT EXISTS pg_walinspect"
KEEP_WAL = BENCH_MARK + " SELECT pg_create_physical_replication_slot(%(name)s, true, true)"
WAL_BY_TABLE = (
    BENCH_MARK
    + """
WITH records AS (
    SELECT (regexp_match(block_ref, 'rel \\d+/(\\d+)/(\\d+)'))[1:2] AS rel, record_length
    FROM pg_get_wal_records_info(
        %(a)s::pg_lsn, least(%(b)s::pg_lsn, pg_current_wal_flush_lsn()))
), relations AS (
    SELECT pg_filenode_relation(0, rel[2]::oid) AS relation, record_length
    FROM records
    WHERE rel[1]::oid = (SELECT oid FROM pg_database WHERE datname = current_database())
), tables AS (
    SELECT coalesce(i.indrelid, t.oid, c.oid) AS table_oid, r.record_length
    FROM relations r
    JOIN pg_class c ON c.oid = r.relation
    LEFT JOIN pg_index i ON i.indexrelid = c.oid
    LEFT JOIN pg_class t ON t.reltoastrelid = c.oid
)
SELECT c.relname AS name, sum(t.record_length)::bigint AS wal
FROM tables t JOIN pg_class c ON c.oid = t.table_oid
WHERE c.relname = ANY(%(tables)s)
GROUP BY c.relname
"""
)
# jobcore's jobs by id: when each started and its hops: its first publish, dated the
# relay's claim, kept on the job row (published_at, migration 0041) or, when the job row
# does not keep it, its first `published` event, which also carries the broker's confirm
# time (the job row's publish has none); how many attempts, and whether it is done.
JOBCORE_JOBS = f"""
SELECT j.id::text AS id, extract(epoch FROM j.started_at)::float8 AS started,
       extract(epoch FROM j.finished_at)::float8 AS finished, j.status, j.attempts,
       extract(epoch FROM j.created_at)::float8 AS created,
       extract(epoch FROM coalesce(j.published_at, e.at))::float8 AS claimed,
       extract(epoch FROM (e.detail->>'confirmed_at')::timestamptz)::float8 AS confirmed
FROM jobcore.jobs AS j
LEFT JOIN LATERAL (
    SELECT e.at, e.detail FROM jobcore.job_events AS e
    WHERE e.job_id = j.id AND e.kind = '{JobEventKind.PUBLISHED}' AND j.published_at IS NULL
    ORDER BY e.at LIMIT 1
) AS e ON true
WHERE j.id = ANY(%(ids)s::uuid[])
"""
JOBCORE_DONE = (
    BENCH_MARK + " SELECT count(*) AS n FROM jobcore.jobs WHERE id = ANY(%(ids)s::uuid[])"
    " AND status IN ('succeeded', 'failed', 'cancelled')"
)
PROCRASTINATE_JOBS = """
SELECT j.id, j.status,
       extract(epoch FROM min(e.at) FILTER (WHERE e.type = 'started'))::float8 AS started,
       extract(epoch FROM max(e.at) FILTER (WHERE e.type = 'succeeded'))::float8 AS finished,
       count(*) FILTER (WHERE e.type = 'succeeded') AS succeeded
FROM procrastinate_jobs AS j LEFT JOIN procrastinate_events AS e ON e.job_id = j.id
WHERE j.id = ANY(%(ids)s::bigint[])
GROUP BY j.id, j.status
"""
PROCRASTINATE_DONE = (
    BENCH_MARK + " SELECT count(*) FROM procrastinate_jobs WHERE id = ANY(%(ids)s::bigint[])"
    " AND status IN ('succeeded', 'failed', 'aborted', 'cancelled')"
)
CELERY_DONE = (
    BENCH_MARK + " SELECT count(*) FROM celery_taskmeta WHERE status = 'SUCCESS'"
    " AND date_done >= %(since)s AT TIME ZONE 'UTC'"
)
CELERY_RESULTS = (
    BENCH_MARK + " SELECT result, extract(epoch FROM date_done AT TIME ZONE 'UTC')::float8"
    " FROM celery_taskmeta WHERE status = 'SUCCESS' AND date_done >= %(since)s"
)

# claim_to_confirm and confirm_to_start only for the jobs whose publish is an event row
# (the job row keeps no confirm time: migration 0041), claim_to_start for every job a
# relay published; insert_to_start for the jobs a worker took from the outbox itself
# (direct pickup: no publish at all).
HOP_NAMES = (
    "to_insert",
    "insert_to_claim",
    "claim_to_start",
    "claim_to_confirm",
    "confirm_to_start",
    "insert_to_start",
)
HOP_LABELS = {
    "to_insert": "enqueue→API's insert",
    "insert_to_claim": "insert→relay's claim",
    "claim_to_start": "relay's claim→worker start",
    "claim_to_confirm": "relay's claim→confirm",
    "confirm_to_start": "confirm→worker start",
    "insert_to_start": "insert→worker start, taken from the outbox",
}


def steps(options: Options) -> int:
    return (options.paced_peak <= 0) + len(options.paced_systems) * len(options.paced_fractions)


# -- one system under load -------------------------------------------------------------------


@dataclass
class Timings:
    """One step's jobs as the system recorded them, fed as they are read."""

    pickup: Histogram = field(default_factory=Histogram)
    hops: dict[str, Histogram] = field(default_factory=dict)
    completed: int = 0  # finished successfully
    completed_in_window: int = 0  # of them, inside the pacing window
    not_once: int = 0  # finished more than once, or after more than one attempt
    missing: int = 0  # accepted but not found finished
    counted: int = 0  # finished, and past the step's warm-up
    taken_from_outbox: int = 0  # of them, taken by a worker with no publish (direct pickup)

    def add(self, enqueued: float, started: float | None, counted: bool) -> None:
        if started is not None and counted:
            self.pickup.add(max(0.0, started - enqueued))

    def hop(self, name: str, seconds: float) -> None:
        self.hops.setdefault(name, Histogram()).add(max(0.0, seconds))


class System:
    """A system the scenario paces: its processes, how a batch is sent, what it measured."""

    name = ""
    tables: tuple[str, ...] = ()

    def __init__(self, bench: Bench, config: Settings) -> None:
        self.bench = bench
        self.config = config
        self.pool: HttpPool | None = None
        self.databases: list[str] = []  # its databases' names (their backends' CPU)
        self.watch_url = ""  # where its tables are
        self.processes: dict[str, Callable[[], list[int]]] = {}
        # Each accepted job's enqueue clock, by id, for the step (its pickup's start).
        self.enqueued: dict[Any, float] = {}
        # The step's HTTP answers by status, and a refused answer's body (the last).
        self.answers: Counter[int] = Counter()
        self.refusal = ""

    def running(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Its processes running (and its databases there) for the block."""
        raise NotImplementedError

    async def send(self, count: int, enqueued: float) -> int:
        raise NotImplementedError

    async def done(self, conn: psycopg.AsyncConnection[Any], since: float) -> int:
        """How many of the step's jobs are finished."""
        raise NotImplementedError

    async def timings(
        self, conn: psycopg.AsyncConnection[Any], window: tuple[float, float]
    ) -> Timings:
        raise NotImplementedError


def _chunks(ids: list[Any]) -> list[list[Any]]:
    return [ids[i : i + CHUNK] for i in range(0, len(ids), CHUNK)]


class Jobcore(System):
    name = "jobcore"
    tables = HOT_TABLES
    # One replica: an API process, a relay and a worker.
    replicas = 1

    def env(self) -> dict[str, str]:
        return {}

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        api_args = ("--workers", str(self.replicas)) if self.replicas > 1 else ()
        async with self.bench.stack(
            self.config,
            f"paced-{self.name}",
            relays=self.replicas,
            workers=self.replicas,
            env=self.env(),
            api_args=api_args,
        ) as stack:
            await relays_ready(stack)
            self.pool = HttpPool(stack.api_port)
            self._auth = {"Authorization": f"Bearer {stack.api_key}"}
            self.databases = [self.config.database_url.rsplit("/", 1)[1]]
            self.watch_url = self.config.database_url
            groups: dict[str, list[int]] = {}
            for name, pid in pids(stack).items():
                groups.setdefault(name.partition("-")[0], []).append(pid)
            for group, members in groups.items():
                self.processes[group] = functools.partial(with_children, members)
            try:
                yield
            finally:
                self.pool.close()

    async def send(self, count: int, enqueued: float) -> int:
        assert self.pool is not None
        body = orjson.dumps({"items": [{"payload": {}}] * count})
        status, answer = await self.pool.post(
            post(self.pool.port, "/jobs/noop/batch", body, self._auth)
        )
        self.answers[status] += 1
        if status != 200:
            self.refusal = answer[:300].decode(errors="replace")
            return 0
        accepted = 0
        for item in orjson.loads(answer)["items"]:
            if item["status"] == "created":
                self.enqueued[item["job_id"]] = enqueued
                accepted += 1
            else:
                self.refusal = orjson.dumps(item).decode()[:300]
        return accepted

    async def done(self, conn: psycopg.AsyncConnection[Any], since: float) -> int:
        total = 0
        for chunk in _chunks(list(self.enqueued)):
            cur = await conn.execute(JOBCORE_DONE, {"ids": chunk})
            row = await cur.fetchone()
            total += int(row[0]) if row else 0
        return total

    async def timings(
        self, conn: psycopg.AsyncConnection[Any], window: tuple[float, float]
    ) -> Timings:
        t = Timings()
        seen = 0
        for chunk in _chunks(list(self.enqueued)):
            cur = await conn.execute(JOBCORE_JOBS, {"ids": chunk})
            for (
                job_id,
                started,
                finished,
                status,
                attempts,
                created,
                claimed,
                confirmed,
            ) in await cur.fetchall():
                seen += 1
                enqueued = self.enqueued[job_id]
                counted = enqueued >= window[0] + WARMUP
                if status != "succeeded":
                    t.missing += 1
                    continue
                t.completed += 1
                t.completed_in_window += window[0] <= finished <= window[1]
                t.not_once += attempts != 1
                t.add(enqueued, started, counted)
                t.counted += counted
                if counted:
                    t.hop("to_insert", created - enqueued)
                if counted and claimed is None:
                    t.taken_from_outbox += 1
                    t.hop("insert_to_start", started - created)
                if counted and claimed is not None:
                    t.hop("insert_to_claim", claimed - created)
                    t.hop("claim_to_start", started - claimed)
                if counted and claimed is not None and confirmed is not None:
                    t.hop("claim_to_confirm", confirmed - claimed)
                    t.hop("confirm_to_start", started - confirmed)
        t.missing += len(self.enqueued) - seen
        return t


class JobcoreBaseline(Jobcore):
    """jobcore with ``--paced-baseline-env`` (e.g. a tuning switched back to its old
    value): a change and what it replaced, measured in the same invocation."""

    name = "jobcore-baseline"

    def env(self) -> dict[str, str]:
        pairs = (item.partition("=") for item in self.bench.options.paced_baseline_env)
        return {key.strip(): value.strip() for key, _, value in pairs}


class JobcoreRelayed(Jobcore):
    """jobcore without direct pickup (JOBCORE_DIRECT_PICKUP=false, services/worker/direct.py):
    every job goes through a relay and the broker, as before direct pickup."""

    name = "jobcore-relayed"

    def env(self) -> dict[str, str]:
        return {"JOBCORE_DIRECT_PICKUP": "false"}


class JobcoreReplicas(Jobcore):
    """jobcore as two replicas at the same total rate: two API processes sharing the port
    (`jobcore api --workers 2`), two relays and two workers (issue: two replicas must not
    start a job later than one)."""

    name = "jobcore-2"
    replicas = 2


class Peer(System):
    """A FastAPI app and a worker of a peer, each in a process group of its own."""

    async def send(self, count: int, enqueued: float) -> int:
        assert self.pool is not None
        body = orjson.dumps({"count": count, "enqueued": enqueued})
        status, answer = await self.pool.post(post(self.pool.port, "/jobs/noop/batch", body))
        self.answers[status] += 1
        if status != 202:
            self.refusal = answer[:300].decode(errors="replace")
            return 0
        return self.accepted(orjson.loads(answer), enqueued)

    def accepted(self, answer: dict[str, Any], enqueued: float) -> int:
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def apps(
        self, name: str, api: list[str], worker: list[str], env: dict[str, str], port: int
    ) -> AsyncIterator[None]:
        from services.bench.scenarios.peers import _answers, peer_process

        logs = self.bench.log_dir
        with (
            peer_process(worker, env, logs / f"paced-{name}-worker.log") as worker_proc,
            peer_process(api, env, logs / f"paced-{name}-api.log") as api_proc,
        ):
            self.processes = {
                "api": functools.partial(pids_in_group, api_proc.pid),
                "worker": functools.partial(pids_in_group, worker_proc.pid),
            }
            probe = post(port, "/jobs/noop/batch", orjson.dumps({"count": 1, "enqueued": 0.0}))
            await eventually(
                functools.partial(_answers, port, probe),
                timeout=60,
                interval=0.2,
                what=f"the {name} HTTP app",
            )
            self.pool = HttpPool(port)
            try:
                yield
            finally:
                self.pool.close()


class Procrastinate(Peer):
    name = "procrastinate"
    tables = PROCRASTINATE_TABLES

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        from services.bench.scenarios.peers import _peer_env, procrastinate_database

        async with procrastinate_database(self.config) as dsn:
            self.databases = [dsn.rsplit("/", 1)[1]]
            self.watch_url = dsn
            port = free_port()
            worker = [
                sys.executable, "-m", "procrastinate", "--app", f"{PEER_APPS}.procrastinate_app",
                "--log-level", "warning", "worker", "--concurrency", str(HANDLERS),
            ]  # fmt: skip
            api = [
                sys.executable, "-m", "uvicorn", f"{HTTP_APP}:procrastinate_api",
                "--host", "127.0.0.1", "--port", str(port), "--loop", "uvloop",
                "--http", "httptools", "--no-access-log", "--log-level", "warning",
            ]  # fmt: skip
            env = _peer_env(
                self.config,
                BENCH_PEERS_PROCRASTINATE_DSN=dsn,
                BENCH_PEERS_PROCRASTINATE_POOL_MAX=str(self.config.db_pool_max),
            )
            async with self.apps(self.name, api, worker, env, port):
                yield

    def accepted(self, answer: dict[str, Any], enqueued: float) -> int:
        for job_id in answer["ids"]:
            self.enqueued[int(job_id)] = enqueued
        return len(answer["ids"])

    async def done(self, conn: psycopg.AsyncConnection[Any], since: float) -> int:
        total = 0
        for chunk in _chunks(list(self.enqueued)):
            cur = await conn.execute(PROCRASTINATE_DONE, {"ids": chunk})
            row = await cur.fetchone()
            total += int(row[0]) if row else 0
        return total

    async def timings(
        self, conn: psycopg.AsyncConnection[Any], window: tuple[float, float]
    ) -> Timings:
        t = Timings()
        seen = 0
        for chunk in _chunks(list(self.enqueued)):
            cur = await conn.execute(PROCRASTINATE_JOBS, {"ids": chunk})
            for job_id, status, started, finished, succeeded in await cur.fetchall():
                seen += 1
                enqueued = self.enqueued[int(job_id)]
                if status != "succeeded" or finished is None:
                    t.missing += 1
                    continue
                t.completed += 1
                t.completed_in_window += window[0] <= finished <= window[1]
                t.not_once += succeeded != 1
                t.add(enqueued, started, enqueued >= window[0] + WARMUP)
        t.missing += len(self.enqueued) - seen
        return t


class Celery(Peer):
    name = "celery"
    tables = CELERY_TABLES

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        from services.bench.scenarios.peers import _peer_env, celery_backend_database

        queue = f"{self.config.amqp_prefix}.celery.paced"
        async with celery_backend_database(self.config) as dsn:
            self.databases = [dsn.rsplit("/", 1)[1]]
            self.watch_url = dsn
            backend = "db+postgresql+psycopg://" + dsn.split("://", 1)[1]
            env = _peer_env(
                self.config, BENCH_PEERS_CELERY_QUEUE=queue, BENCH_PEERS_CELERY_BACKEND=backend
            )
            port = free_port()
            worker = [
                sys.executable, "-m", "celery", "-A", f"{HTTP_APP}:celery_http", "worker",
                "-P", "prefork", "-c", str(CELERY_CONCURRENCY), "-Q", queue, "-l", "warning",
                "--without-gossip", "--without-mingle", "--without-heartbeat",
            ]  # fmt: skip
            api = [
                sys.executable, "-m", "uvicorn", f"{HTTP_APP}:api", "--host", "127.0.0.1",
                "--port", str(port), "--loop", "uvloop", "--http", "httptools",
                "--no-access-log", "--log-level", "warning",
            ]  # fmt: skip
            try:
                async with self.apps(self.name, api, worker, env, port):
                    yield
            finally:
                with contextlib.suppress(Exception):
                    connection = await connect_broker(self.config)
                    async with connection:
                        await (await connection.channel()).queue_delete(queue)

    def accepted(self, answer: dict[str, Any], enqueued: float) -> int:
        return int(answer["count"])  # each task carries its clock: no id to remember

    async def done(self, conn: psycopg.AsyncConnection[Any], since: float) -> int:
        with contextlib.suppress(psycopg.errors.UndefinedTable):
            cur = await conn.execute(CELERY_DONE, {"since": _utc(since)})
            row = await cur.fetchone()
            return int(row[0]) if row else 0
        return 0  # the backend creates its table with its first result

    async def timings(
        self, conn: psycopg.AsyncConnection[Any], window: tuple[float, float]
    ) -> Timings:
        import pickle

        t = Timings()
        cur = await conn.execute(CELERY_RESULTS, {"since": _utc(window[0] - 1)})
        for raw, finished in await cur.fetchall():
            # PickleType around the JSON the backend encoded: the bench's own rows.
            value = pickle.loads(raw)
            result = orjson.loads(value) if isinstance(value, (str, bytes)) else value
            enqueued = float(result["enqueued"])
            if enqueued < window[0]:
                continue
            t.completed += 1
            t.completed_in_window += window[0] <= finished <= window[1]
            t.add(enqueued, float(result["started"]), enqueued >= window[0] + WARMUP)
        return t


def _utc(epoch: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(epoch, UTC).replace(tzinfo=None)


SYSTEM_CLASSES: dict[str, type[System]] = {
    "jobcore": Jobcore,
    "jobcore-baseline": JobcoreBaseline,
    "jobcore-2": JobcoreReplicas,
    "jobcore-relayed": JobcoreRelayed,
    "procrastinate": Procrastinate,
    "celery": Celery,
}


# -- a step ------------------------------------------------------------------------------------


@dataclass
class Snapshot:
    wal: str
    tables: dict[str, dict[str, int]]
    backends: list[int]


async def snapshot(conn: psycopg.AsyncConnection[Any], system: System) -> Snapshot:
    cur = await conn.execute(WAL_LSN)
    row = await cur.fetchone()
    assert row is not None
    cur = await conn.execute(TABLE_STATS, {"tables": list(system.tables)})
    tables = {
        name: {"heap": int(h), "index": int(i), "dead_made": int(m), "dead": int(d)}
        for name, h, i, m, d in await cur.fetchall()
    }
    cur = await conn.execute(BACKENDS, {"names": system.databases})
    return Snapshot(str(row[0]), tables, [int(r[0]) for r in await cur.fetchall()])


async def stats_settled(conn: psycopg.AsyncConnection[Any]) -> None:
    """The statistics of this connection's own view read afresh (pg_stat_* are cached
    per transaction; autocommit reads a new snapshot each statement)."""
    await conn.execute("SELECT pg_stat_clear_snapshot()")


async def keep_wal(conn: psycopg.AsyncConnection[Any]) -> None:
    """Keep the step's WAL until :func:`wal_by_table` reads it: a temporary physical
    replication slot of this connection's, reserving WAL from now until the connection
    closes. Without it a checkpoint may recycle the step's first segments before they
    are read (a busy cluster writes its max_wal_size in minutes). Not to be had (no
    replication slot free, no right to make one): the WAL by table may then be missing."""
    try:
        await conn.execute(KEEP_WAL, {"name": f"jobcore_bench_{uuid.uuid4().hex}"})
    except psycopg.Error as exc:
        log.info("the step's WAL is not kept", extra={"error": str(exc).strip()})


async def wal_by_table(
    conn: psycopg.AsyncConnection[Any], a: str, b: str, tables: Sequence[str]
) -> dict[str, int] | None:
    """The WAL bytes written for each of ``tables`` between LSNs ``a`` and ``b``; None
    where pg_walinspect is not to be had (before PostgreSQL 15, no right to create it) or
    the range's WAL is gone (a checkpoint recycled it)."""
    try:
        await conn.execute(WALINSPECT)
        cur = await conn.execute(WAL_BY_TABLE, {"a": a, "b": b, "tables": list(tables)})
        found = {str(name): int(wal) for name, wal in await cur.fetchall()}
    except psycopg.Error as exc:
        log.info("no WAL by table for this step", extra={"error": str(exc).strip()})
        return None
    return {name: found.get(name, 0) for name in tables}


@dataclass
class Step:
    system: str
    fraction: int
    rate: float
    counts: PaceCounts
    timings: Timings
    drain_seconds: float
    drained: bool
    wal_bytes: int
    tables: dict[str, dict[str, int]]  # growth over the step: heap, index, dead_made; dead
    cpu_ms_per_job: dict[str, float]
    load: tuple[float, float, float]
    answers: dict[str, int] = field(default_factory=dict)
    refusal: str = ""
    # WAL bytes per hot table over the step (wal_by_table), None when not to be had.
    wal_tables: dict[str, int] | None = None

    def figures(self) -> dict[str, Any]:
        jobs = max(1, self.counts.accepted)
        t = self.timings
        heap = sum(v["heap"] for v in self.tables.values())
        index = sum(v["index"] for v in self.tables.values())
        dead = sum(v["dead_made"] for v in self.tables.values())
        return {
            "system": self.system,
            "fraction_pct": self.fraction,
            "rate": round(self.rate, 1),
            "offered": self.counts.offered,
            "accepted": self.counts.accepted,
            "shed": self.counts.shed,
            "failed": self.counts.failed,
            "late_ticks": self.counts.late_ticks,
            "ticks": self.counts.ticks,
            "completed": t.completed,
            "completed_once": t.completed - t.not_once,
            "not_once": t.not_once,
            "missing": t.missing,
            "drained": self.drained,
            "drain_seconds": round(self.drain_seconds, 2),
            "completed_per_s": round(t.completed_in_window / max(1e-9, self.counts.seconds), 1),
            "pickup_samples": t.pickup.total,
            "pickup_p50_ms": t.pickup.ms(50),
            "pickup_p95_ms": t.pickup.ms(95),
            "pickup_p99_ms": t.pickup.ms(99),
            "taken_from_outbox_pct": (
                round(100 * t.taken_from_outbox / t.counted, 1) if t.counted else None
            ),
            "hops_ms": {
                name: {"p50": t.hops[name].ms(50), "p99": t.hops[name].ms(99)}
                for name in HOP_NAMES
                if name in t.hops
            },
            "wal_bytes_per_job": round(self.wal_bytes / jobs, 1),
            "heap_bytes_per_job": round(heap / jobs, 1),
            "index_bytes_per_job": round(index / jobs, 1),
            "dead_tuples_per_job": round(dead / jobs, 3),
            "dead_tuples_at_end": sum(v["dead"] for v in self.tables.values()),
            "tables": {
                name: {
                    "heap_bytes_per_job": round(v["heap"] / jobs, 1),
                    "index_bytes_per_job": round(v["index"] / jobs, 1),
                    "dead_tuples_per_job": round(v["dead_made"] / jobs, 3),
                    "dead_tuples_at_end": v["dead"],
                    "wal_bytes_per_job": (
                        None
                        if self.wal_tables is None
                        else round(self.wal_tables.get(name, 0) / jobs, 1)
                    ),
                }
                for name, v in sorted(self.tables.items())
            },
            "cpu_ms_per_job": self.cpu_ms_per_job,
            "load_average": [round(x, 2) for x in self.load],
            "answers": self.answers,
            "refusal": self.refusal,
        }


async def pace_step(
    system: System, rate: float, seconds: float, fraction: int, settle: bool = True
) -> Step:
    """One step: ``rate`` for ``seconds``, then the drain; its figures (with ``settle``,
    the tables' statistics read once every backend has flushed its counts)."""
    system.enqueued = {}
    system.answers = Counter()
    system.refusal = ""
    async with await psycopg.AsyncConnection.connect(system.watch_url, autocommit=True) as conn:
        await stats_settled(conn)
        await keep_wal(conn)
        before = await snapshot(conn, system)
        backends = set(before.backends)
        groups: dict[str, Callable[[], list[int]]] = {
            **system.processes,
            "postgres": lambda: sorted(backends),
        }
        meter = CpuMeter(groups=groups)
        meter.start()
        started = time.time()
        counts = await Pacer(system.send, rate).run(seconds)
        ended = started + counts.seconds
        drain_started = time.monotonic()

        async def drained() -> bool:
            done = await system.done(conn, started)
            return done >= counts.accepted

        ok = True
        try:
            await eventually(drained, timeout=DRAIN_TIMEOUT, interval=0.1, what="the drain")
        except AssertionError:
            ok = False
        drain_seconds = time.monotonic() - drain_started
        cur = await conn.execute(BACKENDS, {"names": system.databases})
        backends.update(int(r[0]) for r in await cur.fetchall())
        meter.stop()
        if settle:
            await asyncio.sleep(STATS_SETTLE)  # not a synchronisation: the counters' delay
        await stats_settled(conn)
        after = await snapshot(conn, system)
        cur = await conn.execute(WAL_DIFF, {"a": before.wal, "b": after.wal})
        row = await cur.fetchone()
        wal = int(row[0]) if row else 0
        wal_tables = await wal_by_table(conn, before.wal, after.wal, list(system.tables))
        timings = await system.timings(conn, (started, ended))
    growth = {
        name: {
            "heap": v["heap"] - before.tables.get(name, {}).get("heap", 0),
            "index": v["index"] - before.tables.get(name, {}).get("index", 0),
            "dead_made": v["dead_made"] - before.tables.get(name, {}).get("dead_made", 0),
            "dead": v["dead"],
        }
        for name, v in after.tables.items()
    }
    return Step(
        system.name,
        fraction,
        rate,
        counts,
        timings,
        drain_seconds,
        ok,
        wal,
        growth,
        ms_per_job(meter.seconds, max(1, counts.accepted)),
        os.getloadavg(),
        {str(k): v for k, v in sorted(system.answers.items())},
        system.refusal,
        wal_tables,
    )


async def probe_peak(system: System, rate: float, seconds: float) -> tuple[float, Step]:
    """jobcore's completions per second while offered ``rate`` (above its capacity)."""
    step = await pace_step(system, rate, seconds, 0)
    return step.figures()["completed_per_s"], step


# -- the scenario --------------------------------------------------------------------------------


async def analyze(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(BENCH_MARK + " ANALYZE")


def _fmt(value: Any) -> Any:
    return "—" if value is None else value


def main_table(steps: list[Step]) -> dict[str, Any]:
    rows = []
    for step in steps:
        f = step.figures()
        rows.append(
            [
                f["system"],
                f"{f['fraction_pct']} %",
                f["rate"],
                f["completed_per_s"],
                _fmt(f["pickup_p50_ms"]),
                _fmt(f["pickup_p95_ms"]),
                _fmt(f["pickup_p99_ms"]),
                f"{f['completed_once']}/{f['accepted']}",
                f["wal_bytes_per_job"],
                f["heap_bytes_per_job"],
                f["index_bytes_per_job"],
                f["dead_tuples_per_job"],
                f["cpu_ms_per_job"].get("all"),
                f["cpu_ms_per_job"].get("bench"),
                " ".join(f"{x:.2f}" for x in f["load_average"]),
            ]
        )
    return {
        "title": "Each system at each rate",
        "note": "pickup: enqueue call → handler start; completed once / accepted: every "
        "accepted job finished, exactly once; bytes and dead tuples: growth over the step "
        "and its drain, per accepted job, summed over the hot tables; CPU: ms per job of "
        "every process group but the load generator (`all`), and the load generator's own "
        "(`bench`); load: the machine's 1/5/15-minute load average at the step's end.",
        "columns": [
            "system",
            "of peak",
            "offered jobs/s",
            "completed/s",
            "pickup p50 ms",
            "p95 ms",
            "p99 ms",
            "completed once / accepted",
            "WAL B/job",
            "heap B/job",
            "index B/job",
            "dead tuples/job",
            "CPU-ms/job",
            "generator CPU-ms/job",
            "load avg",
        ],
        "rows": rows,
    }


def hops_table(steps: list[Step]) -> dict[str, Any]:
    rows = []
    for step in steps:
        f = step.figures()
        if not f["system"].startswith("jobcore") or not f["hops_ms"]:
            continue
        row: list[Any] = [
            f["system"],
            f"{f['fraction_pct']} %",
            f["rate"],
            _fmt(f["pickup_p50_ms"]),
            _fmt(f.get("taken_from_outbox_pct")),
        ]
        for name in HOP_NAMES:
            hop = f["hops_ms"].get(name, {})
            row.append(f"{_fmt(hop.get('p50'))} / {_fmt(hop.get('p99'))}")
        rows.append(row)
    return {
        "title": "jobcore: pickup by hop (p50 / p99 ms)",
        "note": "From each job's first publish, dated the start of the relay's claiming "
        "transaction: kept on the job row, or a `published` event carrying the broker's "
        "confirm time (the confirm hops count only those jobs: a job published once and "
        "claimed has no confirm time since migration 0041); the hops' p50s need not add "
        "up to the pickup's. Taken from the outbox: the % of jobs a worker claimed from "
        "their outbox rows itself, unpublished (direct pickup), whose hop is the last "
        "column.",
        "columns": [
            "system",
            "of peak",
            "jobs/s",
            "pickup p50",
            "taken from the outbox %",
            *HOP_LABELS.values(),
        ],
        "rows": rows,
    }


def tables_table(steps: list[Step]) -> dict[str, Any]:
    rows = []
    for step in steps:
        f = step.figures()
        for name, v in f["tables"].items():
            rows.append(
                [
                    f["system"],
                    f"{f['fraction_pct']} %",
                    name,
                    v["heap_bytes_per_job"],
                    v["index_bytes_per_job"],
                    "—" if v["wal_bytes_per_job"] is None else v["wal_bytes_per_job"],
                    v["dead_tuples_per_job"],
                    v["dead_tuples_at_end"],
                ]
            )
    return {
        "title": "Hot tables, per accepted job",
        "note": "Growth of pg_table_size and pg_indexes_size over the step (space vacuum "
        "freed is reused, so a table at its steady size grows less than it writes); dead "
        "tuples made: n_tup_upd + n_tup_del growth; at end: n_dead_tup after the drain; "
        "WAL: the step's WAL records for the table, its indexes and TOAST (pg_walinspect, "
        "each record for the first block it names; — where it is not to be had).",
        "columns": [
            "system",
            "of peak",
            "table",
            "heap B/job",
            "index B/job",
            "WAL B/job",
            "dead tuples made/job",
            "dead at end",
        ],
        "rows": rows,
    }


def cpu_table(steps: list[Step]) -> dict[str, Any]:
    groups = sorted({g for s in steps for g in s.cpu_ms_per_job} - {"all"})
    return {
        "title": "CPU-ms per job, per process group",
        "note": "utime + stime from /proc over the step and its drain; postgres: the backends "
        "of the system's databases; rabbitmq: the broker's node (on a shared machine, others' "
        "queues count); bench: the load generator (not in `all`).",
        "columns": ["system", "of peak", *groups, "all"],
        "rows": [
            [
                s.system,
                f"{s.fraction} %",
                *(_fmt(s.cpu_ms_per_job.get(g)) for g in groups),
                s.cpu_ms_per_job.get("all"),
            ]
            for s in steps
        ],
    }


def pickup_series(figures: list[dict[str, Any]]) -> list[Series]:
    """Each system's pickup p50 and p99 against the offered rate (the plot's panel)."""
    series = []
    for system in dict.fromkeys(f["system"] for f in figures):
        mine = [f for f in figures if f["system"] == system]
        for pct in (50, 99):
            points = [(f["rate"], f[f"pickup_p{pct}_ms"]) for f in mine]
            points = [(x, y) for x, y in points if y is not None]
            series.append(
                Series(
                    f"{system} p{pct}",
                    [x for x, _ in points],
                    [y for _, y in points],
                    "offered jobs/s",
                    "pickup ms",
                )
            )
    return series


async def run(bench: Bench) -> Section:
    options = bench.options
    fractions = options.paced_fractions
    seconds = options.paced_seconds
    section = Section(
        "paced",
        TITLE,
        f"Open-loop batches of up to {MAX_BATCH} every {1000 * TICK:g} ms on the wall clock, "
        f"{seconds:g} s per rate, at {', '.join(f'{f} %' for f in fractions)} of the peak, "
        f"each system in turn ({', '.join(options.paced_systems)}) over HTTP, no-op jobs; "
        f"jobcore: one API, one relay, one worker of {HANDLERS} handlers; Procrastinate: "
        f"FastAPI + batch_defer_async, a worker of concurrency {HANDLERS}; Celery: FastAPI + "
        f"apply_async, prefork {CELERY_CONCURRENCY}, acks_late, PostgreSQL results. Pickup "
        f"from the generator's clock before the request to the handler's start, the first "
        f"{WARMUP:g} s of each step left out. 7 other engineers load this machine: see the "
        f"load average next to each figure.",
    )
    steps_done: list[Step] = []
    peak = options.paced_peak
    probe: Step | None = None
    async with bench.scratch("paced") as config:
        systems = {name: SYSTEM_CLASSES[name](bench, config) for name in options.paced_systems}
        if peak <= 0:
            bench.step("paced: measuring jobcore's peak")
            async with systems["jobcore"].running():
                peak, probe = await probe_peak(
                    systems["jobcore"], options.paced_probe_rate, options.paced_probe_seconds
                )
        for name, system in systems.items():
            if name == "jobcore" and probe is not None:
                system = systems[name] = SYSTEM_CLASSES[name](bench, config)
            async with system.running():
                # Untimed: every process warm, the tables analysed as autovacuum would once
                # they fill (the services plan their statements once: on empty tables a
                # plan may scan), the counters flushed before the first step's are read.
                await pace_step(system, peak * fractions[0] / 100, WARMUP_STEP, 0, settle=False)
                await analyze(system.watch_url)
                await pace_step(system, MAX_BATCH / 0.5, 0.5, 0)
                for fraction in fractions:
                    bench.step(f"paced: {name} at {fraction} % of the peak")
                    step = await pace_step(system, peak * fraction / 100, seconds, fraction)
                    steps_done.append(step)
    tables = [main_table(steps_done), hops_table(steps_done), tables_table(steps_done)]
    tables.append(cpu_table(steps_done))
    by = {(s.system, s.fraction): s.figures() for s in steps_done}
    for fraction in fractions:
        ours = by.get(("jobcore", fraction))
        if ours is None:
            continue
        case = f"{fraction} % of the peak ({peak * fraction / 100:.0f} jobs/s)"
        for pct in (50, 99):
            key = f"pickup_p{pct}_ms"
            theirs = by.get(("procrastinate", fraction), {}).get(key)
            if ours[key] is not None:
                section.add(
                    Figure(
                        case,
                        f"pickup p{pct} ms",
                        [ours[key]],
                        "Procrastinate" if theirs is not None else None,
                        [theirs] if theirs is not None else [],
                        better="lower",
                    )
                )
    section.series.extend(pickup_series([s.figures() for s in steps_done]))
    section.details.update(
        peak_per_s=round(peak, 1),
        peak_measured=probe is not None,
        probe=probe.figures() if probe is not None else None,
        steps=[s.figures() for s in steps_done],
        tables=tables,
        accounting_exact=all(
            s.timings.completed == s.counts.accepted
            and s.timings.not_once == 0
            and s.timings.missing == 0
            and s.counts.failed == 0
            and s.counts.shed == 0
            for s in steps_done
        ),
    )
    return section
