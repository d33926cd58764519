"""fair: one tenant's backlog against another tenant's new jobs, fair relay vs FIFO relay.

Each run starts one API, one relay and one worker (separate processes), then writes tenant
A's backlog of ``fair_backlog`` no-op jobs (job and outbox rows, as enqueue writes them)
in one SQL statement, untimed, so the load generator is a single statement and not what is
measured. From that commit, tenant B POSTs one no-op job through the API every
``PROBE_INTERVAL`` seconds, ``fair_probes`` of them at most, stopping early once A's
backlog has all started (the loop is bounded in count and time). Everything is read from
the job rows (PostgreSQL's clock): B's enqueue→start (started_at − created_at), and A's
drain rate (A's jobs / (A's last finished_at − the fill's commit)).

Two relays, in interleaved runs: **fair** (the default: round-robin claim between tenants,
broker queues kept under JOBCORE_RELAY_QUEUE_DEPTH_LIMIT ready messages) and the baseline
**FIFO** (JOBCORE_RELAY_FAIR_CLAIM=false, no depth limit: the relay before fairness, which
publishes the whole backlog into the queue and so puts B's job behind it). A's drain rate
under the fair relay against the FIFO one is what the depth limit costs the workers.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg

from jobcore.amqp.topology import Topology
from jobcore.client import NO_RETRIES, ApiError, AsyncClient, ConnectionFailed
from jobcore.database.gateway import Database
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.settings import RelayOptions
from jobcore.testing.waiting import eventually
from services.bench.harness import Bench, Options, pids
from services.bench.measure import cpu_of, merge_cpu
from services.bench.report import Figure, Section, Series
from services.bench.scenarios.e2e import db_now

TITLE = "A quiet tenant's jobs next to another tenant's backlog: fair relay vs FIFO"
QUEUE = "default"  # the queue of the `noop` job type
BACKLOG_TENANT = "bulk"
PROBE_INTERVAL = 1.0
MODES: dict[str, dict[str, str]] = {
    "fair": {},  # the defaults
    "fifo": {"JOBCORE_RELAY_FAIR_CLAIM": "false", "JOBCORE_RELAY_QUEUE_DEPTH_LIMIT": "0"},
}

# A's backlog exactly as enqueue writes it (a pending job and its first message, with the
# tenant), in one statement.
FILL_SQL = """
WITH job AS (
    INSERT INTO jobcore.jobs (id, tenant, type, queue)
    SELECT gen_random_uuid(), %(tenant)s, 'noop', %(queue)s
    FROM generate_series(1, %(n)s)
    RETURNING id
)
INSERT INTO jobcore.outbox (message_id, exchange, routing_key, message_type, headers, body, job_id,
                    tenant)
SELECT gen_random_uuid(), %(exchange)s, %(queue)s, 'noop', '{}'::jsonb,
       convert_to('{"v":1,"job_id":"' || job.id || '","attempt":1,"type":"noop"}', 'UTF8'),
       job.id, %(tenant)s
FROM job
"""

BACKLOG_LEFT = """
SELECT count(*) AS n FROM jobcore.jobs WHERE tenant = %(tenant)s AND started_at IS NULL
"""

# Each run has a database of its own: every job in it is the run's.
UNFINISHED = """
SELECT count(*) AS n FROM jobcore.jobs WHERE status NOT IN ('succeeded', 'failed', 'cancelled')
"""

RUN_STATS = """
WITH a AS (
    SELECT count(*) AS jobs,
           count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
           max(finished_at) AS last_finished
    FROM jobcore.jobs WHERE tenant = %(backlog_tenant)s
), b AS (
    SELECT created_at, started_at, status,
           extract(epoch FROM started_at - created_at) AS wait
    FROM jobcore.jobs WHERE tenant = %(probe_tenant)s AND created_at >= %(since)s
)
SELECT a.jobs AS a_jobs, a.succeeded AS a_succeeded,
       extract(epoch FROM a.last_finished - %(since)s) AS a_seconds,
       (SELECT count(*) FROM b) AS b_jobs,
       (SELECT count(*) FROM b WHERE status = 'succeeded') AS b_succeeded,
       (SELECT count(*) FROM b WHERE created_at < a.last_finished) AS b_during_backlog,
       (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY wait) FROM b) AS b_p50,
       (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY wait) FROM b) AS b_p99,
       (SELECT max(wait) FROM b) AS b_max
FROM a
"""

PROBE_WAITS = """
SELECT extract(epoch FROM created_at - %(since)s) AS at,
       extract(epoch FROM started_at - created_at) AS wait
FROM jobcore.jobs WHERE tenant = %(probe_tenant)s AND created_at >= %(since)s
ORDER BY created_at
"""


def steps(options: Options) -> int:
    return options.runs * len(MODES)


async def _scalar(db: Database, sql: str, params: dict[str, Any]) -> Any:
    async with db.connection() as conn:
        cur = await conn.execute(sql, params)
        row = await cur.fetchone()
    assert row is not None
    return row["n"]


async def fill_backlog(database_url: str, topology: Topology, n: int) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        async with conn.transaction():
            await conn.execute(
                FILL_SQL,
                {
                    "tenant": BACKLOG_TENANT,
                    "queue": QUEUE,
                    "exchange": topology.jobs_exchange,
                    "n": n,
                },
            )
            await conn.execute("SELECT pg_notify(%s, '')", (OUTBOX_CHANNEL,))
        # As a deployment's autovacuum would after a bulk insert: without statistics the
        # planner picks plans that make a drain look many times slower than it is.
        await conn.execute("ANALYZE jobcore.jobs")
        await conn.execute("ANALYZE jobcore.outbox")


async def probe(
    db: Database, api_url: str, api_key: str, count: int, deadline: float
) -> tuple[int, int]:
    """B's jobs, one per interval, until ``count``, the deadline, or A's backlog has all
    started; the number sent and refused. One request a second is no load to generate, so
    B is a client as a user's would be (jobcore.client), without retries: a refusal counts."""
    sent = refused = 0
    async with AsyncClient(api_url, api_key, retry=NO_RETRIES) as client:
        while sent < count and time.monotonic() < deadline:
            started = time.monotonic()
            try:
                await client.enqueue("noop", {})
            except (ApiError, ConnectionFailed):
                refused += 1
            sent += 1
            if not await _scalar(db, BACKLOG_LEFT, {"tenant": BACKLOG_TENANT}):
                break
            # The probe's pace, not a synchronisation: the loop is bounded above.
            await asyncio.sleep(max(0.0, PROBE_INTERVAL - (time.monotonic() - started)))
    return sent, refused


async def one_run(bench: Bench, mode: str) -> tuple[dict[str, Any], list[Any], dict[str, float]]:
    options = bench.options
    backlog = options.fair_backlog
    async with (
        bench.scratch(f"fair-{mode}") as config,
        bench.stack(config, f"fair-{mode}", relays=1, workers=1, env=MODES[mode]) as stack,
    ):
        db = Database(config, min_size=1, max_size=2, name="bench-fair")
        await db.open(wait=True)
        try:
            topology = Topology.from_settings(config)
            used: dict[str, float] = {}
            with cpu_of(pids(stack), used):
                await fill_backlog(config.database_url, topology, backlog)
                since = await db_now(db)
                # Every probe is sent well before the FIFO relay could have drained A.
                limit = time.monotonic() + options.fair_probes * PROBE_INTERVAL * 2
                sent, refused = await probe(
                    db, stack.api_url, stack.api_key, options.fair_probes, limit
                )
                if refused:
                    raise RuntimeError(f"{refused} of {sent} POSTs were not accepted")

                async def finished() -> bool:
                    dead = [p.name for p in stack.processes if not p.alive]
                    if dead:
                        raise RuntimeError(f"{', '.join(dead)} exited during the run")
                    return not await _scalar(db, UNFINISHED, {})

                await eventually(
                    finished,
                    timeout=120 + backlog / 50,
                    interval=0.2,
                    what=f"{backlog:,} + {sent} jobs to finish",
                )
            params = {"since": since, "backlog_tenant": BACKLOG_TENANT, "probe_tenant": "bench"}
            async with db.connection() as conn:
                cur = await conn.execute(RUN_STATS, params)
                stats = await cur.fetchone()
                cur = await conn.execute(PROBE_WAITS, params)
                waits = await cur.fetchall()
        finally:
            await db.close()
    assert stats is not None
    if stats["a_succeeded"] != backlog or stats["b_succeeded"] != stats["b_jobs"]:
        raise RuntimeError(f"not every job succeeded: {dict(stats)}")
    return dict(stats), list(waits), used


async def run(bench: Bench) -> Section:
    options = bench.options
    limit = RelayOptions().queue_depth_limit
    section = Section(
        "fair",
        TITLE,
        f"Tenant A's {options.fair_backlog:,} no-op jobs written in one statement, then "
        f"tenant B POSTs one every {PROBE_INTERVAL:g} s (at most {options.fair_probes}) while "
        f"one relay and one worker drain them (separate processes); B's enqueue→start and "
        f"A's drain rate from the job rows. Fair relay (round-robin claim, queue depth limit "
        f"{limit}) against the FIFO relay (fairness off, no limit) in the same invocation; "
        f"{options.runs} interleaved run(s).",
    )
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for run_number in range(options.runs):
        for mode in MODES:
            bench.step(f"fair: {mode} relay, run {run_number + 1} of {options.runs}")
            stats, waits, used = await one_run(bench, mode)
            results[mode].append(stats)
            cpu[mode].append(used)
            if run_number == 0:
                section.series.append(
                    Series(
                        f"{mode} relay",
                        [round(float(w["at"]), 2) for w in waits],
                        [round(1000 * float(w["wait"]), 1) for w in waits],
                        "s since A's backlog was written",
                        "B's enqueue→start, ms",
                    )
                )

    def ms(mode: str, key: str) -> list[float]:
        return [round(1000 * float(r[key]), 1) for r in results[mode]]

    for q in ("p50", "p99", "max"):
        section.add(
            Figure(
                "B's jobs during A's backlog",
                f"enqueue→start {q} ms",
                ms("fair", f"b_{q}"),
                f"FIFO relay {q}",
                ms("fifo", f"b_{q}"),
                better="lower",
            )
        )

    def rate(mode: str) -> list[float]:
        return [round(float(r["a_jobs"]) / float(r["a_seconds"]), 1) for r in results[mode]]

    section.add(
        Figure(
            f"A's {options.fair_backlog:,} jobs",
            f"jobs/s drained (depth limit {limit})",
            rate("fair"),
            "FIFO relay, no limit",
            rate("fifo"),
        )
    )
    section.cpu_pct = {f"{mode} run": merge_cpu(cpu[mode]) for mode in MODES}
    section.details = {
        mode: {
            "probes_sent": [int(r["b_jobs"]) for r in results[mode]],
            "probes_during_backlog": [int(r["b_during_backlog"]) for r in results[mode]],
            "a_drain_seconds": [round(float(r["a_seconds"]), 1) for r in results[mode]],
        }
        for mode in MODES
    }
    return section
