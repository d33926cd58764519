"""cardinality: does a cost grow with how many tenants, keys and held jobs there are?

Four sweeps on one machine, each on a database of its own, every step's rows written in
bulk (INSERT ... SELECT generate_series, the same rows the enqueue path writes) and then
ANALYZEd, as a deployment's autovacuum would; each step adds to the previous one's rows,
and the outbox (and inbox) is vacuumed before each drain, whose rows the last one left dead.

- **tenants**: at each step T tenants each have one delayed job (due in a day: a job row
  and its outbox row), next to one tenant's backlog of due rows written in one statement
  while one relay runs (no worker; the queue is purged as it fills). Relay throughput is
  backlog rows / (commit of the backlog → no due row left). Each delayed tenant is a lane
  of the relay's fair claim (jobcore.database.sql.outbox.OUTBOX_CLAIM_FAIR) with nothing due.
- **ordering keys**: at each step the database holds K ordering keys, each with its
  job_gates counter and its earlier job, finished (the history a deployment keeps within
  its retention); then the same number of jobs is written in one statement, each the first
  of an ordering key of its own (so no job waits for another: the work is the same at
  every step), while one relay and one worker drain them. Pipeline throughput is jobs /
  (commit → last finished_at), from the job rows.
- **held jobs**: N jobs held by one rate key of 10/s (pending, held_reason rate_limit, its
  job_gates row just spent). A gate releaser round (jobcore.maintenance.held_jobs.release_held, what
  the worker's releaser runs under its lease) is run repeatedly on one connection, each
  rolled back so every round sees the same N; the PostgreSQL backend's CPU (utime +
  stime from /proc) and wall time per round, and the shared blocks (hit + read) of the
  round's scan (JOB_LOCK_RELEASABLE under EXPLAIN (ANALYZE, BUFFERS)).
  pg_stat_statements is read instead only where the server preloads it.
- **gate keys**: waves of distinct gate keys (ordering, rate and concurrency, a third
  each), each key with its job_gates row, one finished job past its retention and that
  job's inbox row past its own; after each wave the pruner runs (jobcore.maintenance.retention, the
  pass `jobcore prune` and the workers run) and then VACUUM, as autovacuum would. The
  size of job_gates, jobs, outbox and inbox (pg_total_relation_size) before and after.

Targets, as ratios of figures from the same run: relay throughput at the most tenants ≥
0.8× at the fewest; pipeline throughput at the most ordering keys ≥ 0.8× at the fewest;
the releaser's CPU per round at the most held jobs ≤ 2× at the fewest; and every table's
size after the last wave's prune ≤ 1.05× its size after the wave before's (flat: sizes
have stopped growing; see _settled).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aio_pika
import orjson
import psycopg

from jobcore.amqp.connection import connect as connect_broker
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.database.store import job_store
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.settings import Settings
from jobcore.maintenance import BATCH_SIZE
from jobcore.maintenance.held_jobs import RATE_HORIZON, release_held
from jobcore.maintenance.retention import Retention, prune_exclusively
from services.bench.harness import UNLIMITED_QUEUES, Bench, Options, pids, relays_ready
from services.bench.measure import cpu_of, cpu_seconds, merge_cpu
from services.bench.report import Figure, Section, Series
from services.bench.scenarios.e2e import wait_done
from services.bench.scenarios.relay import QUEUE, purge

if TYPE_CHECKING:
    from jobcore.testing.pipeline import Stack

TITLE = "Cardinality: tenants, ordering keys, held jobs and gate keys"
TENANT = "bench"
BACKLOG_TENANT = "bulk"
FILL_CHUNK = 100_000
RATE_KEY = "rate:noop:type"
RATE_PER_SECOND = 10.0
TABLES = ("job_gates", "jobs", "outbox", "inbox")
# The targets (the issue's): a ratio of figures from the same run, and the side it must be on.
RELAY_FLOOR = 0.8
PIPELINE_FLOOR = 0.8
RELEASER_CEILING = 2.0
FLAT_CEILING = 1.05


@dataclass(frozen=True)
class Plan:
    """The steps of every sweep, and what each step measures."""

    tenants: tuple[int, ...]
    backlog: int  # due rows of the one busy tenant, per drain
    drain_cap: float  # seconds a drain is timed at most
    keys: tuple[int, ...]
    ordered_jobs: int  # jobs drained per step of the ordering sweep
    held: tuple[int, ...]
    rounds: int  # releaser rounds per step, at least ...
    round_seconds: float  # ... and for at least this long
    gate_keys: int  # distinct gate keys written over all waves
    waves: int


PLANS = {
    # About a minute on a quiet 2-core machine: what CI runs.
    "small": Plan(
        tenants=(10, 1000),
        backlog=3000,
        drain_cap=10.0,
        keys=(10, 10_000),
        ordered_jobs=300,
        held=(1000, 10_000),
        rounds=10,
        round_seconds=0.5,
        gate_keys=20_000,
        waves=4,
    ),
    # The sweeps: run on demand (`make bench-cardinality`), tens of minutes.
    "full": Plan(
        tenants=(10, 100, 1000, 10_000),
        backlog=20_000,
        drain_cap=120.0,
        keys=(10, 1000, 100_000, 1_000_000),
        ordered_jobs=5000,
        held=(1000, 10_000, 100_000),
        rounds=20,
        round_seconds=3.0,
        gate_keys=1_000_000,
        waves=4,
    ),
}


def plan(options: Options) -> Plan:
    base = PLANS[options.cardinality_size]
    return Plan(
        tenants=options.tenant_steps or base.tenants,
        backlog=base.backlog,
        drain_cap=base.drain_cap,
        keys=options.key_steps or base.keys,
        ordered_jobs=base.ordered_jobs,
        held=options.held_steps or base.held,
        rounds=base.rounds,
        round_seconds=base.round_seconds,
        gate_keys=options.gate_keys or base.gate_keys,
        waves=base.waves,
    )


def steps(options: Options) -> int:
    p = plan(options)
    return len(p.tenants) + len(p.keys) + len(p.held) + p.waves


def _chunks(start: int, stop: int) -> list[tuple[int, int]]:
    return [(a, min(stop, a + FILL_CHUNK)) for a in range(start, stop, FILL_CHUNK)]


def _body(job_id: str) -> str:
    """SQL for a job message's body (jobcore.kernel.envelope.JobMessage) naming ``job_id``."""
    return f"""convert_to('{{"v":1,"job_id":"' || {job_id} || '","attempt":1,"type":"noop"}}',
                      'UTF8')"""


async def _connect(config: Settings) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(config.database_url, autocommit=True)


async def _scalar(conn: psycopg.AsyncConnection[Any], sql: str, params: Any = None) -> Any:
    cur = await conn.execute(sql, params)
    row = await cur.fetchone()
    assert row is not None
    return row[0]


# --- tenants: the relay's throughput next to many tenants' delayed jobs ----------------------

# Tenants [start, stop), each with one job due in a day and its outbox row, as enqueue
# writes a job with run_at.
DELAYED_SQL = f"""
WITH job AS (
    INSERT INTO jobcore.jobs (id, tenant, type, queue, next_attempt_at, accepted_detail)
    SELECT gen_random_uuid(), 'delayed-' || g, 'noop', %(queue)s, now() + interval '1 day',
           jsonb_build_object('run_at', now() + interval '1 day')
    FROM generate_series(%(start)s::int, %(stop)s::int - 1) AS g
    RETURNING id, tenant, next_attempt_at
)
INSERT INTO jobcore.outbox (message_id, exchange, routing_key, message_type, headers, body, job_id,
                    tenant, available_at)
SELECT gen_random_uuid(), %(exchange)s, %(queue)s, 'noop', '{{}}'::jsonb, {_body("job.id")},
       job.id, job.tenant, job.next_attempt_at
FROM job
"""

# One tenant's backlog of due jobs, as enqueue writes them.
BACKLOG_SQL = f"""
WITH job AS (
    INSERT INTO jobcore.jobs (id, tenant, type, queue)
    SELECT gen_random_uuid(), %(tenant)s, 'noop', %(queue)s
    FROM generate_series(1, %(n)s::int)
    RETURNING id, tenant
)
INSERT INTO jobcore.outbox (message_id, exchange, routing_key, message_type, headers, body, job_id,
                    tenant)
SELECT gen_random_uuid(), %(exchange)s, %(queue)s, 'noop', '{{}}'::jsonb, {_body("job.id")},
       job.id, job.tenant
FROM job
"""

ANY_DUE = """
SELECT EXISTS (
    SELECT 1 FROM jobcore.outbox WHERE available_at <= now() AND quarantined_at IS NULL
)
"""


LEFT_SQL = """
SELECT count(*) FROM jobcore.outbox WHERE tenant = %(tenant)s AND available_at <= now()
"""


async def _drain_backlog(
    conn: psycopg.AsyncConnection[Any],
    channel: aio_pika.abc.AbstractChannel,
    topology: Topology,
    rows: int,
    cap: float,
) -> float:
    """Rows/s published from the backlog's commit until no due row is left (the delayed
    ones stay), or until ``cap`` seconds: then over what was published by then, and the
    rest is deleted (a relay slowed a hundredfold must not hold the sweep for hours)."""
    async with conn.transaction():
        await conn.execute(
            BACKLOG_SQL,
            {
                "tenant": BACKLOG_TENANT,
                "queue": QUEUE,
                "exchange": topology.jobs_exchange,
                "n": rows,
            },
        )
        await conn.execute("SELECT pg_notify(%s, '')", (OUTBOX_CHANNEL,))
    started = time.perf_counter()
    purged = started
    published = rows
    while await _scalar(conn, ANY_DUE):
        now = time.perf_counter()
        if now - started > cap:
            published = rows - int(await _scalar(conn, LEFT_SQL, {"tenant": BACKLOG_TENANT}))
            break
        if now - purged > 1.0:
            with contextlib.suppress(aio_pika.exceptions.AMQPError):
                await purge(channel, topology)
            purged = now
        await asyncio.sleep(0.01)  # the poll interval of the drain clock
    seconds = time.perf_counter() - started
    # Waits for the rows a relay holds: it deletes those itself once they are confirmed.
    await conn.execute(
        "DELETE FROM jobcore.outbox WHERE tenant = %(tenant)s", {"tenant": BACKLOG_TENANT}
    )
    await purge(channel, topology)
    return published / seconds


async def tenants_sweep(bench: Bench, p: Plan, section: Section) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    async with (
        bench.scratch("cardinality-tenants") as config,
        bench.stack(
            config, "cardinality-tenants", relays=1, workers=0, env=UNLIMITED_QUEUES
        ) as stack,
    ):
        await relays_ready(stack)
        relay_pids = pids(stack)
        relay_pids.pop("api", None)
        topology = Topology.from_settings(config)
        connection = await connect_broker(config)
        try:
            channel = await connection.channel()
            async with await _connect(config) as conn:
                # A first drain, unmeasured: the relay's connections and plans warm.
                await _drain_backlog(conn, channel, topology, min(p.backlog, 1000), p.drain_cap)
                have = 0
                for tenants in p.tenants:
                    bench.step(f"cardinality: {tenants:,} tenants with a delayed job")
                    for start, stop in _chunks(have, tenants):
                        await conn.execute(
                            DELAYED_SQL,
                            {
                                "start": start,
                                "stop": stop,
                                "queue": QUEUE,
                                "exchange": topology.jobs_exchange,
                            },
                        )
                    have = max(have, tenants)
                    await conn.execute("ANALYZE jobcore.jobs")
                    await conn.execute("ANALYZE jobcore.outbox")
                    rates, cpu = [], []
                    for _ in range(bench.options.runs):
                        # Each drain leaves its backlog's rows dead: vacuumed, as autovacuum
                        # would (off on the project's machines), or every later step drains
                        # through the earlier steps' dead rows and looks slower for it.
                        await conn.execute("VACUUM (ANALYZE) jobcore.outbox")
                        used: dict[str, float] = {}
                        with cpu_of(relay_pids, used):
                            rate = await _drain_backlog(
                                conn, channel, topology, p.backlog, p.drain_cap
                            )
                        rates.append(round(rate, 1))
                        cpu.append(used)
                    delayed = await _scalar(
                        conn, "SELECT count(*) FROM jobcore.outbox WHERE available_at > now()"
                    )
                    results.append(
                        {"tenants": tenants, "rates": rates, "delayed_rows": delayed, "cpu": cpu}
                    )
        finally:
            await connection.close()
    first = results[0]
    for r in results:
        section.add(
            Figure(
                f"{r['tenants']:,} tenants, one delayed job each",
                f"relay rows/s ({p.backlog:,}-row backlog)",
                r["rates"],
                f"{first['tenants']:,} tenants",
                first["rates"],
            )
        )
        section.cpu_pct[f"tenants {r['tenants']:,}"] = merge_cpu(r["cpu"])
    section.series.append(
        Series(
            "relay",
            [float(r["tenants"]) for r in results],
            [statistics.median(r["rates"]) for r in results],
            "tenants with a delayed job (log)",
            "rows published/s",
            x_log=True,
        )
    )
    return [{k: v for k, v in r.items() if k != "cpu"} for r in results]


# --- ordering keys: the pipeline's throughput over many keys --------------------------------

# Keys [start, stop) of the history: each key's job_gates counter (as enqueue's upsert
# leaves it) and its one job, finished an hour ago.
KEY_HISTORY_SQL = """
WITH gate AS (
    INSERT INTO jobcore.job_gates (key, counter, updated_at)
    SELECT 'ordering:' || %(tenant)s || ':h-' || g, 1, now() - interval '1 hour'
    FROM generate_series(%(start)s::int, %(stop)s::int - 1) AS g
)
INSERT INTO jobcore.jobs (id, tenant, type, queue, status, attempts, ordering_key, ordering_seq,
                  created_at, updated_at, started_at, finished_at)
SELECT gen_random_uuid(), %(tenant)s, 'noop', %(queue)s, 'succeeded', 1, 'h-' || g, 1,
       now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour',
       now() - interval '1 hour'
FROM generate_series(%(start)s::int, %(stop)s::int - 1) AS g
"""

# The measured jobs: each the first of a key of its own (prefix ``%(prefix)s``), as the
# enqueue statement writes an ordered job (its key's counter, the job with its place, its
# outbox row).
ORDERED_SQL = f"""
WITH gate AS (
    INSERT INTO jobcore.job_gates (key, counter)
    SELECT 'ordering:' || %(tenant)s || ':' || %(prefix)s || g, 1
    FROM generate_series(1, %(n)s::int) AS g
    RETURNING key
), job AS (
    INSERT INTO jobcore.jobs (id, tenant, type, queue, ordering_key, ordering_seq)
    SELECT gen_random_uuid(), %(tenant)s, 'noop', %(queue)s,
           substr(gate.key, length('ordering:' || %(tenant)s || ':') + 1), 1
    FROM gate
    RETURNING id, tenant
)
INSERT INTO jobcore.outbox (message_id, exchange, routing_key, message_type, headers, body, job_id,
                    tenant)
SELECT gen_random_uuid(), %(exchange)s, %(queue)s, 'noop', '{{}}'::jsonb, {_body("job.id")},
       job.id, job.tenant
FROM job
"""


async def _drain_ordered(
    conn: psycopg.AsyncConnection[Any],
    db: Database,
    stack: Stack,
    topology: Topology,
    prefix: str,
    n: int,
) -> float:
    """Jobs/s of ``n`` ordered jobs, from their commit to the last one's finished_at."""
    async with conn.transaction():
        since = await _scalar(conn, "SELECT now()")
        await conn.execute(
            ORDERED_SQL,
            {
                "tenant": TENANT,
                "prefix": prefix,
                "n": n,
                "queue": QUEUE,
                "exchange": topology.jobs_exchange,
            },
        )
        await conn.execute("SELECT pg_notify(%s, '')", (OUTBOX_CHANNEL,))
    committed = await _scalar(conn, "SELECT clock_timestamp()")
    await wait_done(db, since, n, stack.processes, 600 + n / 5)
    cur = await conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE status = 'succeeded'), max(finished_at)"
        " FROM jobcore.jobs WHERE created_at >= %(since)s",
        {"since": since},
    )
    jobs, succeeded, last = await cur.fetchone() or (0, 0, None)
    if jobs != n or succeeded != n or last is None:
        raise RuntimeError(f"{succeeded} of {n} ordered jobs succeeded ({jobs} found)")
    seconds = float((last - committed).total_seconds())
    return n / max(1e-6, seconds)


async def keys_sweep(bench: Bench, p: Plan, section: Section) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    async with (
        bench.scratch("cardinality-keys") as config,
        bench.stack(config, "cardinality-keys", relays=1, workers=1) as stack,
    ):
        topology = Topology.from_settings(config)
        db = Database(config, min_size=1, max_size=2, name="bench-cardinality")
        await db.open(wait=True)
        try:
            async with await _connect(config) as conn:
                await _drain_ordered(conn, db, stack, topology, "warm-", 100)
                have = 0
                for number, keys in enumerate(p.keys):
                    bench.step(f"cardinality: {keys:,} ordering keys")
                    for start, stop in _chunks(have, keys):
                        await conn.execute(
                            KEY_HISTORY_SQL,
                            {"tenant": TENANT, "queue": QUEUE, "start": start, "stop": stop},
                        )
                    have = max(have, keys)
                    await conn.execute("ANALYZE jobcore.jobs")
                    await conn.execute("ANALYZE jobcore.job_gates")
                    rates = []
                    for run_number in range(bench.options.runs):
                        # As in the tenants sweep: the last drain's dead rows vacuumed first.
                        for table in ("outbox", "inbox"):
                            await conn.execute(f"VACUUM (ANALYZE) jobcore.{table}")
                        rate = await _drain_ordered(
                            conn, db, stack, topology, f"m{number}.{run_number}-", p.ordered_jobs
                        )
                        rates.append(round(rate, 1))
                    gates = await _scalar(conn, "SELECT count(*) FROM jobcore.job_gates")
                    results.append({"keys": keys, "rates": rates, "job_gates_rows": gates})
        finally:
            await db.close()
    first = results[0]
    for r in results:
        section.add(
            Figure(
                f"{r['keys']:,} ordering keys",
                f"pipeline jobs/s ({p.ordered_jobs:,} ordered jobs)",
                r["rates"],
                f"{first['keys']:,} ordering keys",
                first["rates"],
            )
        )
    section.series.append(
        Series(
            "relay + worker",
            [float(r["keys"]) for r in results],
            [statistics.median(r["rates"]) for r in results],
            "ordering keys in the database (log)",
            "pipeline jobs/s",
            x_log=True,
        )
    )
    return results


# --- held jobs: what one gate releaser round costs ------------------------------------------

# Jobs [start, stop) held by the rate key, created 1 ms apart (their order of release).
HELD_SQL = """
INSERT INTO jobcore.jobs (id, tenant, type, queue, rate_key, rate_per_second, rate_burst,
                  held_reason, held_since, created_at, updated_at)
SELECT gen_random_uuid(), %(tenant)s, 'noop', %(queue)s, %(key)s, %(rate)s, 1,
       'rate_limit', now(), now() - interval '1 day' + g * interval '1 millisecond', now()
FROM generate_series(%(start)s::int, %(stop)s::int - 1) AS g
"""

# The key's GCRA state as a claim that just admitted a job leaves it; nothing handed out.
SPENT_SQL = """
INSERT INTO jobcore.job_gates (key, tat, released_until) VALUES (%(key)s, now(), NULL)
ON CONFLICT (key) DO UPDATE SET tat = now(), released_until = NULL, updated_at = now()
"""


async def _stat_statements(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether pg_stat_statements can be read here: the server must preload it (a setting
    of the shared server this bench never changes)."""
    preload = str(await _scalar(conn, "SHOW shared_preload_libraries"))
    if "pg_stat_statements" not in preload:
        return False
    await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    return True


SCAN_STATS = """
SELECT sum(calls), sum(total_exec_time), sum(shared_blks_hit + shared_blks_read)
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query LIKE '%%held_reason%%' AND query LIKE '%%FOR UPDATE OF jobs SKIP LOCKED%%'
"""


async def _round_cost(
    db: Database, conn: psycopg.AsyncConnection[Any], topology: Topology, p: Plan, pgss: bool
) -> dict[str, Any]:
    """Rounds of the releaser on ``db``'s one connection, each rolled back: CPU and wall ms
    per round of its PostgreSQL backend, and what a round released."""
    async with db.connection() as own:
        found = await (await own.execute("SELECT pg_backend_pid() AS pid")).fetchone()
    assert found is not None
    backend = int(found["pid"])
    if pgss:
        await conn.execute("SELECT pg_stat_statements_reset()")
    released: list[int] = []
    cpu_before = cpu_seconds(backend)
    started = time.perf_counter()
    while len(released) < p.rounds or time.perf_counter() - started < p.round_seconds:
        async with db.unit_of_work() as uow:
            _, rows = await release_held(uow, topology, limit=BATCH_SIZE)
            await uow.rollback()
        released.append(len(rows))
        if len(released) >= 10_000:
            break
    wall = time.perf_counter() - started
    cpu = cpu_seconds(backend) - cpu_before
    cost: dict[str, Any] = {
        "rounds": len(released),
        "cpu_ms_per_round": round(1000 * cpu / len(released), 3),
        "wall_ms_per_round": round(1000 * wall / len(released), 3),
        "released_per_round": statistics.median(released),
    }
    if pgss:
        cur = await conn.execute(SCAN_STATS)
        stats = await cur.fetchone()
        if stats is not None and stats[0]:
            calls, total_ms, blocks = int(stats[0]), float(stats[1]), int(stats[2])
            cost["pgss_scan_ms_per_call"] = round(total_ms / calls, 3)
            cost["pgss_scan_blocks_per_call"] = round(blocks / calls, 1)
    # The scan's own buffers, from the plan (the same SQL and parameters, rolled back).
    async with conn.transaction(force_rollback=True):
        row = await job_store.explain_lock_releasable(
            conn, {"limit": BATCH_SIZE, "horizon": RATE_HORIZON}
        )
    assert row is not None
    document: list[dict[str, Any]] = (
        orjson.loads(row[0]) if isinstance(row[0], str | bytes) else row[0]
    )
    top = document[0]["Plan"]
    cost["scan_shared_blocks"] = int(top.get("Shared Hit Blocks", 0)) + int(
        top.get("Shared Read Blocks", 0)
    )
    cost["scan_ms_explain"] = round(float(document[0]["Execution Time"]), 3)
    return cost


async def held_sweep(bench: Bench, p: Plan, section: Section) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    async with bench.scratch("cardinality-held") as config:
        topology = Topology.from_settings(config)
        # One connection, configured as the worker's pool configures its own.
        db = Database(config, min_size=1, max_size=1, name="bench-gate-releaser")
        await db.open(wait=True)
        try:
            async with await _connect(config) as conn:
                pgss = await _stat_statements(conn)
                have = 0
                for held in p.held:
                    bench.step(f"cardinality: releaser rounds, {held:,} held jobs")
                    for start, stop in _chunks(have, held):
                        await conn.execute(
                            HELD_SQL,
                            {
                                "tenant": TENANT,
                                "queue": QUEUE,
                                "key": RATE_KEY,
                                "rate": RATE_PER_SECOND,
                                "start": start,
                                "stop": stop,
                            },
                        )
                    have = max(have, held)
                    await conn.execute("ANALYZE jobcore.jobs")
                    await conn.execute(SPENT_SQL, {"key": RATE_KEY})
                    # Two rounds unmeasured: the statements prepared, the pages cached.
                    async with db.unit_of_work() as uow:
                        await release_held(uow, topology, limit=BATCH_SIZE)
                        await uow.rollback()
                    cost = await _round_cost(db, conn, topology, p, pgss)
                    results.append({"held": held, **cost})
        finally:
            await db.close()
    first = results[0]
    for metric, key in (
        ("releaser PostgreSQL CPU-ms/round", "cpu_ms_per_round"),
        ("releaser ms/round (wall)", "wall_ms_per_round"),
        ("releaser scan shared blocks/round", "scan_shared_blocks"),
    ):
        for r in results:
            section.add(
                Figure(
                    f"{r['held']:,} held jobs, rate key {RATE_PER_SECOND:g}/s",
                    metric,
                    [r[key]],
                    f"{first['held']:,} held jobs",
                    [first[key]],
                    better="lower",
                )
            )
    section.series.append(
        Series(
            "PostgreSQL CPU per releaser round",
            [float(r["held"]) for r in results],
            [r["cpu_ms_per_round"] for r in results],
            "held jobs behind one rate key (log)",
            "releaser CPU-ms/round",
            x_log=True,
        )
    )
    section.details["pg_stat_statements"] = (
        "read" if pgss else "not preloaded by the server: CPU from /proc, blocks from EXPLAIN"
    )
    return results


# --- gate keys: table sizes as keys come and go ----------------------------------------------

# Keys [start, stop), a third each ordering, rate and concurrency: each key's job_gates row
# as its last use left it (8 days ago) and its one job, finished then (past the default
# 7-day retention), with its message's inbox row (past the 3-day inbox retention).
GATE_KEYS_SQL = """
WITH k AS (
    SELECT g, (ARRAY['ordering', 'rate', 'concurrency'])[g %% 3 + 1] AS kind,
           now() - interval '8 days' AS at
    FROM generate_series(%(start)s::int, %(stop)s::int - 1) AS g
), gate AS (
    INSERT INTO jobcore.job_gates (key, counter, tat, updated_at)
    SELECT CASE kind WHEN 'ordering' THEN 'ordering:' || %(tenant)s || ':g-' || g
                     ELSE kind || ':noop:tenant=' || %(tenant)s || ':id=' || g END,
           CASE kind WHEN 'ordering' THEN 1 ELSE 0 END,
           CASE kind WHEN 'rate' THEN at END, at
    FROM k
), job AS (
    INSERT INTO jobcore.jobs (id, tenant, type, queue, status, attempts, ordering_key, ordering_seq,
                      rate_key, rate_per_second, rate_burst, concurrency_key,
                      concurrency_limit, created_at, updated_at, started_at, finished_at)
    SELECT gen_random_uuid(), %(tenant)s, 'noop', %(queue)s, 'succeeded', 1,
           CASE kind WHEN 'ordering' THEN 'g-' || g END,
           CASE kind WHEN 'ordering' THEN 1 END,
           CASE kind WHEN 'rate' THEN 'rate:noop:tenant=' || %(tenant)s || ':id=' || g END,
           CASE kind WHEN 'rate' THEN 10 END, CASE kind WHEN 'rate' THEN 1 END,
           CASE kind WHEN 'concurrency'
                THEN 'concurrency:noop:tenant=' || %(tenant)s || ':id=' || g END,
           CASE kind WHEN 'concurrency' THEN 1 END,
           at, at, at, at
    FROM k
    RETURNING id
)
INSERT INTO jobcore.inbox (consumer, message_id, received_at)
SELECT 'jobs', gen_random_uuid(), now() - interval '4 days' FROM job
"""

SIZES_SQL = """
SELECT relname, pg_total_relation_size(oid) AS bytes
FROM pg_class
WHERE relnamespace = 'jobcore'::regnamespace AND relname = ANY(%(tables)s) AND relkind = 'r'
"""


async def _sizes(conn: psycopg.AsyncConnection[Any]) -> dict[str, dict[str, float]]:
    """Each table's size (MiB, with indexes and TOAST) and rows."""
    cur = await conn.execute(SIZES_SQL, {"tables": list(TABLES)})
    sizes = {name: {"mib": round(int(b) / 2**20, 3)} for name, b in await cur.fetchall()}
    for name in TABLES:
        sizes[name]["rows"] = int(await _scalar(conn, f"SELECT count(*) FROM jobcore.{name}"))
    return sizes


async def gate_keys_sweep(bench: Bench, p: Plan, section: Section) -> list[dict[str, Any]]:
    waves: list[dict[str, Any]] = []
    per_wave = max(1, p.gate_keys // p.waves)
    async with bench.scratch("cardinality-gates") as config:
        db = Database(config, min_size=1, max_size=2, name="bench-cardinality-pruner")
        await db.open(wait=True)
        try:
            async with await _connect(config) as conn:
                for wave in range(p.waves):
                    upto = (wave + 1) * per_wave
                    bench.step(f"cardinality: {upto:,} gate keys ever seen, pruning")
                    for start, stop in _chunks(wave * per_wave, upto):
                        await conn.execute(
                            GATE_KEYS_SQL,
                            {"tenant": TENANT, "queue": QUEUE, "start": start, "stop": stop},
                        )
                    await conn.execute("ANALYZE")
                    before = await _sizes(conn)
                    started = time.perf_counter()
                    deleted: dict[str, int] = {}
                    for _ in range(20):  # passes until one completes (bounded)
                        report = await prune_exclusively(
                            Retention(config, db), owner="jobcore-bench:cardinality", ttl=600
                        )
                        for table, rows in report.tables.items():
                            deleted[table] = deleted.get(table, 0) + rows
                        if report.complete:
                            break
                    prune_seconds = time.perf_counter() - started
                    for table in TABLES:
                        await conn.execute(f"VACUUM (ANALYZE) jobcore.{table}")
                    after = await _sizes(conn)
                    waves.append(
                        {
                            "gate_keys_seen": upto,
                            "before": before,
                            "after": after,
                            "deleted": deleted,
                            "prune_seconds": round(prune_seconds, 2),
                        }
                    )
        finally:
            await db.close()

    def total(sizes: dict[str, dict[str, float]]) -> float:
        return round(sum(s["mib"] for s in sizes.values()), 3)

    settled = waves[_settled(waves)]
    for w in waves:
        section.add(
            Figure(
                f"{w['gate_keys_seen']:,} gate keys ever seen",
                "MiB of the 4 tables after prune",
                [total(w["after"])],
                f"after the prune at {settled['gate_keys_seen']:,}",
                [total(settled["after"])],
                better="lower",
            )
        )
        section.add(
            Figure(
                f"{w['gate_keys_seen']:,} gate keys ever seen",
                "MiB of the 4 tables before prune",
                [total(w["before"])],
                better="lower",
            )
        )
    seen = [float(w["gate_keys_seen"]) for w in waves]
    for table in TABLES:
        section.series.append(
            Series(
                f"{table}, after prune",
                seen,
                [w["after"][table]["mib"] for w in waves],
                "gate keys ever seen",
                "MiB (pg_total_relation_size)",
            )
        )
    section.series.append(
        Series(
            "4 tables, before prune",
            seen,
            [total(w["before"]) for w in waves],
            "gate keys ever seen",
            "MiB (pg_total_relation_size)",
        )
    )
    return waves


# --- the whole scenario -----------------------------------------------------------------------


def _settled(waves: list[dict[str, Any]]) -> int:
    """The wave whose sizes after its prune the last one is held to: the one before it.
    "Flat" means the sizes stopped growing, not that they never grew: a prune frees space
    only the next waves reuse, and a b-tree's deleted pages are recycled only after a
    further VACUUM, so the first waves grow the files (seen: +50% from the second wave's
    prune to the third's) before they settle (the third and the fourth: equal)."""
    return max(0, len(waves) - 2)


def _target(name: str, ratio: float, limit: float, *, at_most: bool, what: str) -> dict[str, Any]:
    ok = ratio <= limit if at_most else ratio >= limit
    return {
        "target": name,
        "measured": what,
        "ratio": round(ratio, 3),
        "limit": f"{'≤' if at_most else '≥'} {limit:g}×",
        "verdict": "PASS" if ok else "FAIL",
    }


def targets(
    tenants: list[dict[str, Any]],
    keys: list[dict[str, Any]],
    held: list[dict[str, Any]],
    waves: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    def ratio(last: list[float], first: list[float]) -> float:
        return statistics.median(last) / max(1e-9, statistics.median(first))

    t0, t1 = tenants[0], tenants[-1]
    k0, k1 = keys[0], keys[-1]
    h0, h1 = held[0], held[-1]
    w0, w1 = waves[_settled(waves)], waves[-1]
    growth = {
        table: w1["after"][table]["mib"] / max(1e-9, w0["after"][table]["mib"]) for table in TABLES
    }
    worst = max(growth, key=lambda table: growth[table])
    return [
        _target(
            f"relay throughput at {t1['tenants']:,} tenants ≥ {RELAY_FLOOR:g}× at "
            f"{t0['tenants']:,}",
            ratio(t1["rates"], t0["rates"]),
            RELAY_FLOOR,
            at_most=False,
            what=f"{statistics.median(t1['rates']):,.0f} vs {statistics.median(t0['rates']):,.0f}"
            " rows/s",
        ),
        _target(
            f"pipeline throughput at {k1['keys']:,} ordering keys ≥ {PIPELINE_FLOOR:g}× at "
            f"{k0['keys']:,}",
            ratio(k1["rates"], k0["rates"]),
            PIPELINE_FLOOR,
            at_most=False,
            what=f"{statistics.median(k1['rates']):,.1f} vs {statistics.median(k0['rates']):,.1f}"
            " jobs/s",
        ),
        _target(
            f"gate releaser CPU per round at {h1['held']:,} held jobs ≤ {RELEASER_CEILING:g}× "
            f"at {h0['held']:,}",
            h1["cpu_ms_per_round"] / max(1e-9, h0["cpu_ms_per_round"]),
            RELEASER_CEILING,
            at_most=True,
            what=f"{h1['cpu_ms_per_round']:.2f} vs {h0['cpu_ms_per_round']:.2f} PostgreSQL "
            "CPU-ms/round",
        ),
        _target(
            f"table sizes flat once pruned: each table after the prune at "
            f"{w1['gate_keys_seen']:,} gate keys ever seen ≤ {FLAT_CEILING:g}× after the "
            f"prune at {w0['gate_keys_seen']:,}",
            growth[worst],
            FLAT_CEILING,
            at_most=True,
            what=f"largest growth: {worst} {w0['after'][worst]['mib']:.2f} → "
            f"{w1['after'][worst]['mib']:.2f} MiB ({w1['after'][worst]['rows']:,} rows left)",
        ),
    ]


async def run(bench: Bench) -> Section:
    p = plan(bench.options)
    section = Section(
        "cardinality",
        TITLE,
        f"Size {bench.options.cardinality_size}. Tenants {', '.join(f'{n:,}' for n in p.tenants)}"
        f" with one delayed job each next to one tenant's {p.backlog:,}-row backlog (one relay,"
        f" no worker): relay rows/s from the backlog's commit to no due row left (at most"
        f" {p.drain_cap:g} s: then rows published by then). Ordering keys"
        f" {', '.join(f'{n:,}' for n in p.keys)} in the database (each key's job_gates row"
        f" and its finished job), then {p.ordered_jobs:,} jobs each the first of a key of its"
        f" own (no job waits for another) drained by one relay and one worker: jobs/s from the"
        f" commit to the last finished_at. {bench.options.runs} drain(s) per step. Held jobs"
        f" {', '.join(f'{n:,}' for n in p.held)} behind one rate key of {RATE_PER_SECOND:g}/s:"
        " gate releaser rounds (jobcore.maintenance.held_jobs.release_held,"
        f" at least {p.rounds} and"
        f" {p.round_seconds:g} s, each rolled back), the PostgreSQL backend's CPU per round"
        f" (/proc) and the scan's shared blocks (EXPLAIN BUFFERS). {p.gate_keys:,} distinct"
        f" gate keys in {p.waves} waves, each key's job_gates row, finished job and inbox row"
        f" past retention; after each wave the pruner (jobcore.maintenance.retention) and VACUUM;"
        f" sizes by pg_total_relation_size. Rows written in bulk, then ANALYZE. Targets are ratios"
        f" of figures from this run.",
    )
    tenants = await tenants_sweep(bench, p, section)
    keys = await keys_sweep(bench, p, section)
    held = await held_sweep(bench, p, section)
    waves = await gate_keys_sweep(bench, p, section)
    section.details.update(
        size=bench.options.cardinality_size,
        tenants=tenants,
        ordering_keys=keys,
        held=held,
        gate_key_waves=waves,
        targets=targets(tenants, keys, held, waves),
    )
    return section
