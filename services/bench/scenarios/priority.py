"""priority: a high job under one tenant's low backlog, with priorities and without.

Each run starts one API, one relay and one worker (separate processes), then writes a
backlog of ``fair_backlog`` no-op jobs of the tenant the probes use (job and outbox rows,
as enqueue writes them) in one SQL statement, untimed. From that commit the same tenant
POSTs one no-op job through the API every ``PROBE_INTERVAL`` seconds, ``fair_probes`` at
most, stopping early once the backlog has all started (bounded in count and time).
Everything is read from the job rows (PostgreSQL's clock): the probes' enqueue→start, and
the backlog's drain rate (its jobs / (its last finished_at − the fill's commit)).

Two modes, in interleaved runs: **priorities** (the backlog low, the probes
``?priority=high``: the relay's claim shares each batch 4:2:1 by priority lane, and the
queue depth limit keeps the broker's FIFO short) and **none** (everything normal: one
lane, so a probe waits behind the whole backlog, as before priorities). The drain rates
compare the throughput of the two claims (more lanes to scan, weights to apply).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.priorities import Priority
from jobcore.kernel.settings import RelayOptions
from jobcore.testing.waiting import eventually
from services.bench.harness import Bench, Options, pids
from services.bench.measure import cpu_of, merge_cpu
from services.bench.report import Figure, Section, Series
from services.bench.scenarios.e2e import db_now
from services.bench.scenarios.fair import UNFINISHED

TITLE = "A high job behind a low backlog of its own tenant: priorities vs none"
QUEUE = "default"  # the queue of the `noop` job type
TENANT = "bench"  # the tenant of the harness's API key: the probes are the backlog's tenant
PROBE_INTERVAL = 1.0
# (the backlog's priority, the probes' priority)
MODES: dict[str, tuple[Priority, Priority]] = {
    "priorities": (Priority.LOW, Priority.HIGH),
    "none": (Priority.NORMAL, Priority.NORMAL),
}

FILL_SQL = """
WITH job AS (
    INSERT INTO jobcore.jobs (id, tenant, type, queue, priority)
    SELECT gen_random_uuid(), %(tenant)s, 'noop', %(queue)s, %(priority)s
    FROM generate_series(1, %(n)s)
    RETURNING id, priority
)
INSERT INTO jobcore.outbox (message_id, exchange, routing_key, message_type, headers, body, job_id,
                    tenant, priority)
SELECT gen_random_uuid(), %(exchange)s, %(queue)s, 'noop', '{}'::jsonb,
       convert_to('{"v":1,"job_id":"' || job.id || '","attempt":1,"type":"noop"}', 'UTF8'),
       job.id, %(tenant)s, job.priority
FROM job
"""

BACKLOG_LEFT = """
SELECT count(*) AS n FROM jobcore.jobs WHERE priority = %(priority)s AND started_at IS NULL
  AND created_at < %(since)s
"""

RUN_STATS = """
WITH a AS (
    SELECT count(*) AS jobs, count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
           max(finished_at) AS last_finished
    FROM jobcore.jobs WHERE created_at < %(since)s
), b AS (
    SELECT created_at, started_at, status,
           extract(epoch FROM started_at - created_at) AS wait
    FROM jobcore.jobs WHERE created_at >= %(since)s
)
SELECT a.jobs AS a_jobs, a.succeeded AS a_succeeded,
       extract(epoch FROM a.last_finished - %(since)s) AS a_seconds,
       (SELECT count(*) FROM b) AS b_jobs,
       (SELECT count(*) FROM b WHERE status = 'succeeded') AS b_succeeded,
       (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY wait) FROM b) AS b_p50,
       (SELECT percentile_cont(0.99) WITHIN GROUP (ORDER BY wait) FROM b) AS b_p99,
       (SELECT max(wait) FROM b) AS b_max
FROM a
"""

PROBE_WAITS = """
SELECT extract(epoch FROM created_at - %(since)s) AS at,
       extract(epoch FROM started_at - created_at) AS wait
FROM jobcore.jobs WHERE created_at >= %(since)s
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


async def fill_backlog(db: Database, topology: Topology, n: int, priority: Priority) -> None:
    async with db.connection() as conn:
        async with conn.transaction():
            await conn.execute(
                FILL_SQL,
                {
                    "tenant": TENANT,
                    "queue": QUEUE,
                    "exchange": topology.jobs_exchange,
                    "priority": int(priority),
                    "n": n,
                },
            )
            await conn.execute("SELECT pg_notify(%s, '')", (OUTBOX_CHANNEL,))
        # As a deployment's autovacuum would after a bulk insert: without statistics the
        # planner picks plans that make a drain look many times slower than it is.
        await conn.execute("ANALYZE jobcore.jobs")
        await conn.execute("ANALYZE jobcore.outbox")


async def probe(
    db: Database, stack_url: str, api_key: str, modes: tuple[Priority, Priority], count: int
) -> int:
    """The probes, one per interval, until ``count``, a deadline, or the backlog started."""
    backlog_priority, probe_priority = modes
    since = await db_now(db)
    deadline = time.monotonic() + count * PROBE_INTERVAL * 2
    sent = 0
    headers = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=stack_url, headers=headers, timeout=10) as client:
        while sent < count and time.monotonic() < deadline:
            started = time.monotonic()
            answer = await client.post(
                "/jobs/noop", json={}, params={"priority": probe_priority.label}
            )
            if answer.status_code != 202:
                raise RuntimeError(f"a probe was answered {answer.status_code}: {answer.text}")
            sent += 1
            left = await _scalar(
                db, BACKLOG_LEFT, {"priority": int(backlog_priority), "since": since}
            )
            if not left:
                break
            # The probe's pace, not a synchronisation: the loop is bounded above.
            await asyncio.sleep(max(0.0, PROBE_INTERVAL - (time.monotonic() - started)))
    return sent


async def one_run(bench: Bench, mode: str) -> tuple[dict[str, Any], list[Any], dict[str, float]]:
    options = bench.options
    backlog = options.fair_backlog
    async with (
        bench.scratch(f"priority-{mode}") as config,
        bench.stack(config, f"priority-{mode}", relays=1, workers=1) as stack,
    ):
        db = Database(config, min_size=1, max_size=2, name="bench-priority")
        await db.open(wait=True)
        try:
            topology = Topology.from_settings(config)
            used: dict[str, float] = {}
            with cpu_of(pids(stack), used):
                await fill_backlog(db, topology, backlog, MODES[mode][0])
                since = await db_now(db)
                sent = await probe(
                    db, stack.api_url, stack.api_key, MODES[mode], options.fair_probes
                )

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
            async with db.connection() as conn:
                cur = await conn.execute(RUN_STATS, {"since": since})
                stats = await cur.fetchone()
                cur = await conn.execute(PROBE_WAITS, {"since": since})
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
        "priority",
        TITLE,
        f"{options.fair_backlog:,} no-op jobs of one tenant written in one statement, then "
        f"the same tenant POSTs one every {PROBE_INTERVAL:g} s (at most {options.fair_probes}) "
        f"while one relay and one worker drain them (separate processes); the probes' "
        f"enqueue→start and the backlog's drain rate from the job rows. Priorities (backlog "
        f"low, probes high, queue depth limit {limit}) against none (all normal) in the same "
        f"invocation; {options.runs} interleaved run(s).",
    )
    results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for run_number in range(options.runs):
        for mode in MODES:
            bench.step(f"priority: {mode}, run {run_number + 1} of {options.runs}")
            stats, waits, used = await one_run(bench, mode)
            results[mode].append(stats)
            cpu[mode].append(used)
            if run_number == 0:
                section.series.append(
                    Series(
                        mode,
                        [round(float(w["at"]), 2) for w in waits],
                        [round(1000 * float(w["wait"]), 1) for w in waits],
                        "s since the backlog was written",
                        "probe's enqueue→start, ms",
                    )
                )

    def ms(mode: str, key: str) -> list[float]:
        return [round(1000 * float(r[key]), 1) for r in results[mode]]

    for q in ("p50", "p99", "max"):
        section.add(
            Figure(
                "Probes during the backlog",
                f"enqueue→start {q} ms",
                ms("priorities", f"b_{q}"),
                f"no priorities {q}",
                ms("none", f"b_{q}"),
                better="lower",
            )
        )

    def rate(mode: str) -> list[float]:
        return [round(float(r["a_jobs"]) / float(r["a_seconds"]), 1) for r in results[mode]]

    section.add(
        Figure(
            f"The {options.fair_backlog:,}-job backlog",
            "jobs/s drained with priorities",
            rate("priorities"),
            "no priorities",
            rate("none"),
        )
    )
    section.cpu_pct = {f"{mode} run": merge_cpu(cpu[mode]) for mode in MODES}
    section.details = {
        mode: {
            "probes_sent": [int(r["b_jobs"]) for r in results[mode]],
            "backlog_drain_seconds": [round(float(r["a_seconds"]), 1) for r in results[mode]],
        }
        for mode in MODES
    }
    return section
