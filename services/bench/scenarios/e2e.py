"""e2e: no-op jobs from `POST /jobs/noop` to `succeeded`, next to the broker's raw
consume+ack rate.

One API, one relay and one worker run as separate processes. Each run POSTs ``jobs``
no-op jobs over 16 keep-alive connections and waits until all have succeeded; jobs/s is
jobs / (last finished_at − first created_at), and the latencies come from the job rows
(PostgreSQL's clock): enqueue→start = started_at − created_at, enqueue→done =
finished_at − created_at. The baseline publishes the same number of persistent messages
to a scratch quorum queue (untimed) and times consuming and acknowledging them here with
the worker's prefetch. Then the idle latency (target: p50 <= 5 ms, p99 <= 20 ms):
``IDLE_SAMPLES`` single jobs enqueued one at a time (job + outbox row + NOTIFY, as the API
writes them) while nothing else runs, each after the previous one finished;
enqueue→start = started_at − created_at from the job rows. Its baseline is the floor of
that path on this machine, each part measured idle (``IDLE_GAP`` after the last), in the
same run: a durable commit of a one-row insert (the enqueue's commit), a round trip (the
relay's claim), and a persistent message from publish to a consumer through a quorum
queue (the broker's part), the p50 of each, summed. Each part is measured after an idle
gap, so it includes the wake-ups the real path pays.

With ``--pg-stats`` (services/bench/pgstats.py) the last run also reports what each SQL
statement cost PostgreSQL per job (pg_stat_statements) and what the backends waited on
(pg_stat_activity and ungranted pg_locks every 50 ms); and so does a pipeline drain of
the same number of jobs through the same stack, preloaded while the ``noop`` type is
paused (the peers scenario's jobcore pipeline), measured from the resume: the e2e path
without HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections import defaultdict
from typing import Any

import aio_pika
import psycopg

from jobcore.amqp.connection import connect as connect_broker
from jobcore.amqp.topology import Topology
from jobcore.client import AsyncClient, JobStatus
from jobcore.database.gateway import Database
from jobcore.examples.jobtypes import NoopPayload
from jobcore.execution.registry import load_job_modules
from jobcore.kernel.jobevents import JobEventKind
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue, enqueue_many
from jobcore.usecases.enqueue.wakeups import RelayWakeups
from jobcore.usecases.enqueue.write_many import MAX_BATCH_ITEMS
from services.bench.harness import Bench, Options, pids
from services.bench.http import http_load, post
from services.bench.measure import cpu_of, latency_ms, merge_cpu
from services.bench.pgstats import BENCH_MARK, TOP_STATEMENTS, Statements, WaitSampler
from services.bench.report import Figure, Section

TITLE = "POST to succeeded vs the broker's raw consume+ack"
ACTOR = "bench:e2e"
HTTP_CLIENTS = 16
IDLE_SAMPLES = 100
# Between two idle samples: the relay and the worker go back to waiting for work.
IDLE_GAP = 0.02

RUN_STATS = """
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       extract(epoch FROM max(finished_at) - min(created_at)) AS seconds,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at))
           AS start_p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at))
           AS start_p99,
       extract(epoch FROM max(started_at - created_at)) AS start_max,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at))
           AS done_p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - created_at))
           AS done_p99,
       extract(epoch FROM max(finished_at - created_at)) AS done_max
FROM jobcore.jobs WHERE created_at >= %(since)s
"""


def steps(options: Options) -> int:
    return options.runs + 2 + bool(options.pg_stats_url)


@contextlib.asynccontextmanager
async def pg_stats_window(
    config: Settings, on: bool, title: str, jobs: int, tables: list[dict[str, Any]], note: str
) -> Any:
    """With --pg-stats (``on``): the statements' counters reset at the start and read at
    the end, the wait sampler between; their tables appended to ``tables``."""
    if not on:
        yield
        return
    statements = Statements(config.database_url)
    sampler = WaitSampler(config.database_url)
    await statements.start()
    await sampler.start()
    try:
        yield
    finally:
        await sampler.stop()
    await statements.stop(exclude=(sampler.backend_pid,))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    shown = min(TOP_STATEMENTS, len(statements.rows))
    tables.append(
        statements.table(
            f"{title}: statements by PostgreSQL exec time, per job",
            jobs,
            f"{note} pg_stat_statements (track = all: `nested` rows are run by a top-level "
            f"statement, whose time includes theirs); the top {shown} "
            f"of {len(statements.rows)} statements; cpu_ms is the bench cluster's "
            f"processes' CPU per job over the window; load average at the end {load}.",
        )
    )
    tables.extend(sampler.tables(title))


async def preload(db: Database, topology: Topology, n: int) -> None:
    """``n`` no-op jobs with their outbox rows, in batches of 1,000; then ANALYZE."""
    noop = load_job_modules(("jobcore.examples.jobtypes",)).get("noop")
    request = EnqueueRequest(tenant="bench", job_type=noop, payload=NoopPayload())
    for start in range(0, n, MAX_BATCH_ITEMS):
        async with db.unit_of_work() as uow:
            await enqueue_many(uow, topology, [request] * min(MAX_BATCH_ITEMS, n - start))
            await uow.commit()
    async with db.connection() as conn:
        await conn.execute("ANALYZE jobcore.jobs")
        await conn.execute("ANALYZE jobcore.outbox")


async def pipeline_drain(
    bench: Bench, config: Settings, db: Database, stack: Any, tables: list[dict[str, Any]]
) -> None:
    """``jobs`` no-op jobs written while their type is paused (job + outbox rows in batches
    of 1,000, then ANALYZE), drained by the stack's relay and worker from the resume, with
    the per-statement and wait tables over the drain."""
    from jobcore.usecases.pauses import set_paused

    n = bench.options.jobs
    topology = Topology.from_settings(config)
    await set_paused(db, "type", "noop", paused=True, actor=ACTOR)
    since = await db_now(db)
    await preload(db, topology, n)
    note = (
        f"{n:,} no-op jobs preloaded while their type was paused, then resumed: one relay "
        f"and one worker drain them (no HTTP); from the resume to the last job done."
    )
    async with pg_stats_window(config, True, "pipeline drain", n, tables, note):
        await set_paused(db, "type", "noop", paused=False, actor=ACTOR)
        await wait_done(db, since, n, stack.processes, 600)


async def idle_enqueue_to_start(config: Settings, db: Database, samples: int) -> list[float]:
    """Seconds from created_at to started_at of ``samples`` jobs enqueued one at a time."""
    topology = Topology.from_settings(config)
    noop = load_job_modules(config.job_modules).get("noop")
    seconds = []
    # As the API wakes them (an idle enqueue is alone in flight: its statement NOTIFYs).
    wakeups = RelayWakeups(db)
    for _ in range(samples):
        # On a session, as the API enqueues: the one statement commits on its own.
        async with db.session() as session:
            result = await enqueue(
                session,
                topology,
                EnqueueRequest(tenant="bench", job_type=noop, payload=NoopPayload()),
                wakeups=wakeups,
            )

        # A one-element tuple: truthy even for a zero latency.
        async def finished(job_id: Any = result.job_id) -> tuple[float] | None:
            async with db.connection() as conn:
                cur = await conn.execute(
                    "SELECT extract(epoch FROM started_at - created_at) AS s FROM jobcore.jobs"
                    " WHERE id = %(id)s AND finished_at IS NOT NULL",
                    {"id": job_id},
                )
                row = await cur.fetchone()
            return None if row is None else (float(row["s"]),)

        found = await eventually(finished, timeout=30, interval=0.002, what="an idle job")
        assert found is not None  # eventually returns a truthy answer or raises
        seconds.append(found[0])
        await asyncio.sleep(IDLE_GAP)  # idle is what is measured: no work in flight
    await wakeups.close()
    return seconds


FLOOR_PARTS = ("durable commit", "round trip", "broker publish→consume")


async def idle_floor(config: Settings, samples: int) -> dict[str, float]:
    """p50 ms of each part of the idle floor (FLOOR_PARTS), each sample after IDLE_GAP."""
    parts: dict[str, list[float]] = {part: [] for part in FLOOR_PARTS}
    async with await psycopg.AsyncConnection.connect(config.database_url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS bench_idle_probe (id bigserial PRIMARY KEY)")
        for statement, part in (
            ("INSERT INTO bench_idle_probe DEFAULT VALUES", "durable commit"),
            ("SELECT 1", "round trip"),
        ):
            for _ in range(samples):
                await asyncio.sleep(IDLE_GAP)  # idle is what is measured
                started = time.perf_counter()
                await conn.execute(statement)
                parts[part].append(time.perf_counter() - started)
        await conn.execute("DROP TABLE bench_idle_probe")
    connection = await connect_broker(config)
    name = f"{config.amqp_prefix}.idle-probe"
    try:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(
            name, durable=True, arguments={"x-queue-type": "quorum"}
        )
        arrived: asyncio.Queue[float] = asyncio.Queue()

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            arrived.put_nowait(time.perf_counter())
            await message.ack()

        tag = await queue.consume(on_message)
        for _ in range(samples):
            await asyncio.sleep(IDLE_GAP)
            sent = time.perf_counter()
            # Not awaited: the consumer's clock stops when the message arrives, and the
            # confirm comes back in its own time.
            publish = asyncio.ensure_future(
                channel.default_exchange.publish(
                    aio_pika.Message(b"{}", delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key=name,
                )
            )
            parts["broker publish→consume"].append(
                await asyncio.wait_for(arrived.get(), timeout=10) - sent
            )
            await publish
        await queue.cancel(tag)
    finally:
        with contextlib.suppress(Exception):  # the probe's error, if any, is the one to see
            cleanup = await connection.channel()
            await cleanup.queue_delete(name)
        await connection.close()
    return {part: latency_ms(seconds)["p50"] for part, seconds in parts.items()}


async def db_now(db: Database) -> Any:
    async with db.connection() as conn:
        cur = await conn.execute(BENCH_MARK + " SELECT clock_timestamp() AS now")
        row = await cur.fetchone()
    assert row is not None
    return row["now"]


async def count_finished(db: Database, since: Any) -> int:
    """How many of the jobs created since ``since`` are terminal."""
    async with db.connection() as conn:
        cur = await conn.execute(
            BENCH_MARK + " SELECT count(*) AS n FROM jobcore.jobs WHERE created_at >= %(since)s"
            " AND status IN ('succeeded', 'failed', 'cancelled')",
            {"since": since},
        )
        row = await cur.fetchone()
    return 0 if row is None else int(row["n"])


async def wait_done(db: Database, since: Any, n: int, alive: list[Any], timeout: float) -> None:
    """Until ``n`` jobs created since ``since`` are terminal; fail if a process died."""

    async def done() -> bool:
        dead = [p.name for p in alive if not p.alive]
        if dead:
            raise RuntimeError(f"{', '.join(dead)} exited during the run; see the logs")
        return await count_finished(db, since) >= n

    await eventually(done, timeout=timeout, interval=0.05, what=f"{n:,} jobs to finish")


# Where a job's enqueue→start goes, from its first publish: dated the start of the
# relay's claiming transaction, kept on the job row (published_at, migration 0041) or, when
# the job row does not keep it, a `published` event with the relay's confirm time in its
# detail. p50s of the jobs that have one (all of them while the job timeline is on, the
# default); claim→confirm only of the jobs whose publish is an event row (none, on the
# happy path: the job row keeps no confirm time).
HOPS = f"""
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM p.at - j.created_at))
           AS to_claim,
       percentile_cont(0.5) WITHIN GROUP (
           ORDER BY extract(epoch FROM (p.detail->>'confirmed_at')::timestamptz - p.at)
       ) AS claim_to_confirm,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM j.started_at - p.at))
           AS claim_to_start
FROM jobcore.jobs AS j
CROSS JOIN LATERAL (
    SELECT j.published_at AS at, '{{}}'::jsonb AS detail WHERE j.published_at IS NOT NULL
    UNION ALL
    (SELECT e.at, e.detail FROM jobcore.job_events AS e
     WHERE e.job_id = j.id AND e.kind = '{JobEventKind.PUBLISHED}' AND j.published_at IS NULL
     ORDER BY e.at LIMIT 1)
) AS p
WHERE j.created_at >= %(since)s
"""
HOP_LABELS = {
    "to_claim": "enqueue→relay's claim p50 ms",
    "claim_to_confirm": "relay's claim→confirm p50 ms",
    "claim_to_start": "relay's claim→start p50 ms",
}


async def run_stats(db: Database, since: Any) -> dict[str, Any]:
    async with db.connection() as conn:
        cur = await conn.execute(RUN_STATS, {"since": since})
        row = await cur.fetchone()
        cur = await conn.execute(HOPS, {"since": since})
        hops = await cur.fetchone()
    assert row is not None
    if row["succeeded"] != row["jobs"]:
        raise RuntimeError(f"{row['jobs'] - row['succeeded']} jobs did not succeed")
    return {**row, **(hops or {})}


async def smoke_check(api_url: str, api_key: str) -> None:
    """One job through the client as a user would (enqueue, long-poll, read): the stack
    works end to end before anything is timed. Untimed; the load itself stays on the
    bench's own HTTP generator, which costs the shared cores less than httpx."""
    async with AsyncClient(api_url, api_key) as client:
        accepted = await client.enqueue("noop", {})
        job = await client.wait(accepted.job_id, timeout=60)
    if job.status != JobStatus.SUCCEEDED:
        raise RuntimeError(f"the smoke-check job ended {job.status}: {job.last_error}")


async def raw_consume_ack(config: Settings, n: int, window: int = 1000) -> float:
    """Messages acknowledged per second by a plain aio-pika consumer, prefetch as the
    worker's; the messages are published first, untimed."""
    connection = await connect_broker(config)
    name = f"{config.amqp_prefix}.scratch"
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
        body = b'{"v":1,"job_id":"00000000-0000-0000-0000-000000000000","attempt":1,"type":"noop"}'
        for start in range(0, n, window):
            await asyncio.gather(
                *(
                    channel.default_exchange.publish(
                        aio_pika.Message(
                            body,
                            message_id=str(uuid.uuid4()),
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        ),
                        routing_key=name,
                    )
                    for _ in range(min(window, n - start))
                )
            )
        consumer = await connection.channel()
        await consumer.set_qos(prefetch_count=config.job_prefetch())
        queue = await consumer.declare_queue(name, passive=True)
        done = asyncio.Event()
        acked = 0

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            nonlocal acked
            await message.ack()
            acked += 1
            if acked == n:
                done.set()

        started = time.perf_counter()
        tag = await queue.consume(on_message)
        await asyncio.wait_for(done.wait(), timeout=300)
        seconds = time.perf_counter() - started
        await queue.cancel(tag)
        return n / seconds
    finally:
        cleanup = await connection.channel()
        await cleanup.queue_delete(name)
        await connection.close()


async def run(bench: Bench) -> Section:
    options = bench.options
    n = options.jobs
    # The idle samples: fewer for a short run (the smoke test's).
    idle_samples = min(IDLE_SAMPLES, max(1, n // 5))
    section = Section(
        "e2e",
        TITLE,
        f"{n:,} no-op jobs per run POSTed over {HTTP_CLIENTS} keep-alive connections to one "
        f"API, published by one relay, run by one worker (separate processes); jobs/s from "
        f"the first created_at to the last finished_at; baseline: the same number of "
        f"messages consumed and acknowledged by aio-pika with the worker's prefetch; "
        f"{options.runs} interleaved runs; enqueue→start by hop from each job's `published` "
        f"event (dated the relay's claim, with its confirm time). Idle: {idle_samples} single jobs "
        f"enqueued one at a time with nothing else running, enqueue→start from the job "
        f"rows (target p50 ≤ 5 ms, p99 ≤ 20 ms).",
    )
    tables: list[dict[str, Any]] = []
    rates: dict[str, list[float]] = {"e2e": [], "raw": []}
    lat: dict[str, list[float]] = defaultdict(list)
    cpu: list[dict[str, float]] = []
    async with (
        bench.scratch("e2e") as config,
        bench.stack(config, "e2e", relays=1, workers=1) as stack,
    ):
        # Generic plans like the API's pool: the idle samples enqueue as the API does.
        db = Database(config, min_size=1, max_size=2, name="bench-e2e", generic_plans=True)
        await db.open(wait=True)
        port = stack.api_port
        request = post(port, "/jobs/noop", b"{}", {"Authorization": f"Bearer {stack.api_key}"})
        try:
            since = await db_now(db)
            await http_load(port, request, HTTP_CLIENTS, 100)  # warm-up, whole path
            await wait_done(db, since, 100, stack.processes, 120)
            await smoke_check(stack.api_url, stack.api_key)
            for run_number in range(options.runs):
                bench.step(f"e2e: run {run_number + 1} of {options.runs}")
                rates["raw"].append(round(await raw_consume_ack(config, n), 1))
                since = await db_now(db)
                used: dict[str, float] = {}
                last = run_number == options.runs - 1
                window = pg_stats_window(
                    config,
                    last and bool(options.pg_stats_url),
                    f"e2e run {run_number + 1}",
                    n,
                    tables,
                    f"{n:,} no-op jobs POSTed over {HTTP_CLIENTS} connections to one API, one "
                    f"relay, one worker; from the first POST to the last job done.",
                )
                async with (
                    window,
                    bench.profiled(section, "e2e", pids(stack) if last else {}),
                ):
                    with cpu_of(pids(stack), used):
                        _, _, errors = await http_load(port, request, HTTP_CLIENTS, n)
                        if errors:
                            raise RuntimeError(f"{errors} of {n} POSTs were not accepted")
                        await wait_done(db, since, n, stack.processes, 600)
                cpu.append(used)
                stats = await run_stats(db, since)
                rates["e2e"].append(round(stats["jobs"] / float(stats["seconds"]), 1))
                for key in (
                    "start_p50",
                    "start_p99",
                    "start_max",
                    "done_p50",
                    "done_p99",
                    "done_max",
                ):
                    lat[key].append(round(1000 * float(stats[key]), 1))
                for key in HOP_LABELS:
                    if stats[key] is not None:
                        lat[key].append(round(1000 * float(stats[key]), 2))
            bench.step("e2e: idle enqueue→start")
            idle = latency_ms(await idle_enqueue_to_start(config, db, idle_samples))
            bench.step("e2e: the idle path's floor")
            floor = await idle_floor(config, idle_samples)
            if options.pg_stats_url:
                bench.step("e2e: a pipeline drain, per statement")
                await pipeline_drain(bench, config, db, stack, tables)
        finally:
            await db.close()
    section.add(Figure(f"{n:,} jobs", "jobs/s", rates["e2e"], "raw consume+ack", rates["raw"]))
    for what, label in (("start", "enqueue→start"), ("done", "enqueue→done")):
        for q in ("p50", "p99", "max"):
            section.add(Figure(label, f"{q} ms", lat[f"{what}_{q}"], better="lower"))
    for key, label in HOP_LABELS.items():
        if lat[key]:
            section.add(Figure("enqueue→start, by hop", label, lat[key], better="lower"))
    floor_ms = round(sum(floor.values()), 2)
    section.add(
        Figure(
            f"idle, {idle_samples} single jobs",
            "enqueue→start p50 ms",
            [idle["p50"]],
            "floor: durable commit + round trip + broker publish→consume, p50s",
            [floor_ms],
            better="lower",
        )
    )
    section.add(
        Figure(
            f"idle, {idle_samples} single jobs",
            "enqueue→start p99 ms",
            [idle["p99"]],
            better="lower",
        )
    )
    section.cpu_pct = {"e2e run": merge_cpu(cpu)}
    section.details["idle_enqueue_to_start_ms"] = {**idle, "target_p50": 5.0, "target_p99": 20.0}
    section.details["idle_floor_p50_ms"] = {**floor, "sum": floor_ms}
    if tables:
        section.details["tables"] = tables
    return section
