"""relay: drain a pre-filled outbox, next to the strongest raw publisher of the same messages.

Each run fills the outbox with ``relay_rows`` rows in one transaction while one `jobcore
relay` process idles, and times from that commit until the outbox is empty (every row
published, confirmed and deleted). The baselines publish the same number of messages
(same body size, headers, persistence, mandatory flag, exchange and quorum queue)
straight from this process with publisher confirms and a window of 1,000 in flight: raw
aio-pika (batches of 1,000 gathered) and raw aiormq (a sliding window of 1,000, each
publish handed to the socket without waiting for its write). The relay is compared with
the faster of the two (by median), in throughput and in CPU per message of the publishing
process (utime + stime over the run; on a shared machine this moves less with the load
than throughput does). Runs are interleaved; the queue is purged between them. Then the
idle latency: single jobs enqueued while the relay idles, from commit to consumed here,
next to a message published and consumed straight through the broker.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import Any, cast

import aio_pika
import aiormq
import orjson
import psycopg
from pamqp.commands import Basic

from jobcore.amqp.connection import connect as connect_broker
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.examples.jobtypes import NoopPayload
from jobcore.execution.registry import load_job_modules
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.envelope import JobMessage
from jobcore.kernel.settings import RelayOptions, Settings
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue
from services.bench.harness import UNLIMITED_QUEUES, Bench, pids, relays_ready
from services.bench.measure import cpu_of, latency_ms, merge_cpu
from services.bench.report import Figure, Section

TITLE = "Outbox relay vs raw publishing with confirms"
QUEUE = "default"  # the queue of the `noop` job type
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
LATENCY_SAMPLES = 200
# Confirms in flight of the raw publishers (the "pipelined, window of 1,000").
RAW_WINDOW = 1000
RAW_PUBLISHERS = ("aio-pika", "aiormq")

FILL_SQL = """
INSERT INTO jobcore.outbox (message_id, exchange, routing_key, message_type, headers, body)
SELECT gen_random_uuid(), %(exchange)s, %(queue)s, 'noop', %(headers)s::jsonb,
       convert_to('{"v":1,"job_id":"' || gen_random_uuid() || '","attempt":1,"type":"noop"}',
                  'UTF8')
FROM generate_series(1, %(n)s)
"""


def steps(options: Any) -> int:
    return int(options.runs) + 1


async def fill_outbox(conn: psycopg.AsyncConnection[Any], topology: Topology, rows: int) -> None:
    """``rows`` outbox rows in one transaction, and the wake-up the API would send."""
    async with conn.transaction():
        await conn.execute(
            FILL_SQL,
            {
                "exchange": topology.jobs_exchange,
                "queue": QUEUE,
                "headers": orjson.dumps({"traceparent": TRACEPARENT}).decode(),
                "n": rows,
            },
        )
        await conn.execute("SELECT pg_notify(%s, '')", (OUTBOX_CHANNEL,))


async def until_empty(conn: psycopg.AsyncConnection[Any], poll: float = 0.01) -> None:
    while True:
        cur = await conn.execute("SELECT EXISTS (SELECT 1 FROM jobcore.outbox)")
        row = await cur.fetchone()
        if row is not None and not row[0]:
            return
        await asyncio.sleep(poll)  # the poll interval of the drain clock


def _raw_headers() -> dict[str, Any]:
    return {"traceparent": TRACEPARENT, "x-envelope-version": 1}


def _raw_body() -> bytes:
    return JobMessage(job_id=uuid.uuid4(), attempt=1, type="noop").encode()


async def raw_publish(
    channel: aio_pika.abc.AbstractChannel, exchange: str, n: int, window: int
) -> float:
    """aio-pika: ``window`` publishes gathered, their confirms awaited together, again."""
    target = await channel.get_exchange(exchange, ensure=False)
    headers = _raw_headers()
    started = time.perf_counter()
    for start in range(0, n, window):
        await asyncio.gather(
            *(
                target.publish(
                    aio_pika.Message(
                        _raw_body(),
                        message_id=str(uuid.uuid4()),
                        type="noop",
                        content_type="application/json",
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        headers=headers,
                    ),
                    QUEUE,
                    mandatory=True,
                )
                for _ in range(min(window, n - start))
            )
        )
    return time.perf_counter() - started


async def raw_publish_aiormq(channel: aiormq.Channel, exchange: str, n: int, window: int) -> float:
    """aiormq: a sliding window of ``window`` unconfirmed publishes; each publish is
    queued for the socket without waiting for its write (``wait=False``), the fastest way
    aiormq's public API offers. Raises if any message was not confirmed."""
    headers = _raw_headers()
    room = asyncio.Semaphore(window)
    failures: list[BaseException] = []

    def settled(task: asyncio.Task[Any]) -> None:
        room.release()
        if not task.cancelled() and task.exception() is not None:
            failures.append(task.exception())  # type: ignore[arg-type]

    async def publish_one() -> Any:
        return await channel.basic_publish(
            _raw_body(),
            exchange=exchange,
            routing_key=QUEUE,
            properties=Basic.Properties(
                content_type="application/json",
                delivery_mode=2,
                message_id=str(uuid.uuid4()),
                message_type="noop",
                headers=headers,
            ),
            mandatory=True,
            wait=False,
        )

    tasks: list[asyncio.Task[Any]] = []
    started = time.perf_counter()
    for _ in range(n):
        await room.acquire()
        task = asyncio.ensure_future(publish_one())
        task.add_done_callback(settled)
        tasks.append(task)
    await asyncio.gather(*tasks, return_exceptions=True)
    seconds = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} raw aiormq publishes failed: {failures[0]!r}")
    return seconds


async def purge(channel: aio_pika.abc.AbstractChannel, topology: Topology) -> None:
    queue = await channel.declare_queue(topology.queue_name(QUEUE), passive=True)
    await queue.purge()


class Arrivals:
    """Consumes the noop queue here and notes when each job's message arrived."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.event = asyncio.Event()

    async def on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        self.at[str(orjson.loads(message.body)["job_id"])] = time.perf_counter()
        self.event.set()
        await message.ack()

    async def wait_for(self, key: str, timeout: float = 10) -> float:
        deadline = time.monotonic() + timeout
        while key not in self.at:
            self.event.clear()
            await asyncio.wait_for(self.event.wait(), max(0.01, deadline - time.monotonic()))
        return self.at[key]


async def idle_latency(
    config: Settings,
    topology: Topology,
    channel: aio_pika.abc.AbstractChannel,
    samples: int,
) -> tuple[list[float], list[float]]:
    """Commit→consumed through the relay, and publish→consumed straight through the broker."""
    noop = load_job_modules(config.job_modules).get("noop")
    queue = await channel.declare_queue(topology.queue_name(QUEUE), passive=True)
    exchange = await channel.get_exchange(topology.jobs_exchange, ensure=False)
    arrivals = Arrivals()
    tag = await queue.consume(arrivals.on_message)
    through_relay, raw = [], []
    db = Database(config, min_size=1, max_size=1, name="bench-idle")
    await db.open(wait=True)
    try:
        for _ in range(samples):
            async with db.unit_of_work() as uow:
                result = await enqueue(
                    uow,
                    topology,
                    EnqueueRequest(tenant="bench", job_type=noop, payload=NoopPayload()),
                )
                await uow.commit()
            committed = time.perf_counter()
            through_relay.append(await arrivals.wait_for(str(result.job_id)) - committed)
            job_id = uuid.uuid4()
            sent = time.perf_counter()
            await exchange.publish(
                aio_pika.Message(
                    JobMessage(job_id=job_id, attempt=1, type="noop").encode(),
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                QUEUE,
            )
            raw.append(await arrivals.wait_for(str(job_id)) - sent)
            # Idle is what is measured: let the relay go back to waiting for a wake-up.
            await asyncio.sleep(0.01)
    finally:
        await queue.cancel(tag)
        await db.close()
    return through_relay, raw


def cpu_us_per_message(used_pct: float, seconds: float, messages: int) -> float:
    """Microseconds of CPU per message, from a process's % of one core over ``seconds``."""
    return round(used_pct / 100 * seconds / messages * 1e6, 1)


async def run(bench: Bench) -> Section:
    options = bench.options
    relay_options = RelayOptions()
    lanes = relay_options.lanes
    rows = options.relay_rows
    async with (
        bench.scratch("relay") as config,
        bench.stack(config, "relay", relays=1, workers=0, api=False, env=UNLIMITED_QUEUES) as stack,
    ):
        section = Section(
            "relay",
            TITLE,
            f"{rows:,} outbox rows per run drained by one `jobcore relay` (batch "
            f"{relay_options.batch_size}, {lanes} lanes), from the fill's commit until the "
            f"outbox is empty; baseline: the same number of persistent, mandatory messages "
            f"to the same quorum queue published by raw aio-pika and raw aiormq with "
            f"confirms, {RAW_WINDOW:,} in flight, the faster of the two (median); CPU per "
            f"message is the publishing process's alone; {options.runs} interleaved runs. "
            f"Idle latency: {LATENCY_SAMPLES} single jobs, commit→consumed.",
        )
        await relays_ready(stack)
        topology = Topology.from_settings(config)
        relay_pids = pids(stack)
        connection = await connect_broker(config)
        rates: dict[str, list[float]] = {"relay": [], **{name: [] for name in RAW_PUBLISHERS}}
        cpu_us: dict[str, list[float]] = {name: [] for name in rates}
        cpu: dict[str, list[dict[str, float]]] = {name: [] for name in rates}
        try:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            raw_channel = cast(aiormq.Channel, await channel.get_underlay_channel())
            async with await psycopg.AsyncConnection.connect(
                config.database_url, autocommit=True
            ) as conn:
                for run_number in range(options.runs):
                    bench.step(f"relay: run {run_number + 1} of {options.runs}")
                    for name in RAW_PUBLISHERS:
                        used: dict[str, float] = {}
                        with cpu_of({}, used):
                            if name == "aio-pika":
                                seconds = await raw_publish(
                                    channel, topology.jobs_exchange, rows, RAW_WINDOW
                                )
                            else:
                                seconds = await raw_publish_aiormq(
                                    raw_channel, topology.jobs_exchange, rows, RAW_WINDOW
                                )
                        rates[name].append(round(rows / seconds, 1))
                        cpu_us[name].append(cpu_us_per_message(used["bench"], seconds, rows))
                        cpu[name].append(used)
                        await purge(channel, topology)

                    await fill_outbox(conn, topology, rows)
                    started = time.perf_counter()
                    used = {}
                    last = run_number == options.runs - 1
                    async with bench.profiled(section, "drain", relay_pids if last else {}):
                        with cpu_of(relay_pids, used):
                            await until_empty(conn)
                    seconds = time.perf_counter() - started
                    rates["relay"].append(round(rows / seconds, 1))
                    cpu_us["relay"].append(
                        cpu_us_per_message(sum(used[name] for name in relay_pids), seconds, rows)
                    )
                    cpu["relay"].append(used)
                    await purge(channel, topology)
            bench.step("relay: idle latency")
            through_relay, raw = await idle_latency(config, topology, channel, LATENCY_SAMPLES)
        finally:
            await connection.close()
    strongest = max(RAW_PUBLISHERS, key=lambda name: statistics.median(rates[name]))
    section.add(
        Figure(
            f"{rows:,} rows",
            "messages/s",
            rates["relay"],
            f"strongest raw publisher ({strongest}, {RAW_WINDOW:,} in flight)",
            rates[strongest],
        )
    )
    # CPU time comes in clock ticks (10 ms): a run too short to register any gives none.
    if all(cpu_us["relay"]) and all(cpu_us[strongest]):
        section.add(
            Figure(
                f"{rows:,} rows",
                "CPU µs/message",
                cpu_us["relay"],
                f"{strongest}, publishing process",
                cpu_us[strongest],
                better="lower",
            )
        )
    for name in RAW_PUBLISHERS:
        if name != strongest:
            section.add(
                Figure(f"{rows:,} rows", "messages/s", rates["relay"], f"raw {name}", rates[name])
            )
    relay_ms, raw_ms = latency_ms(through_relay), latency_ms(raw)
    for q in ("p50", "p99"):
        section.add(
            Figure(
                "idle, one job",
                f"{q} ms",
                [relay_ms[q]],
                f"broker publish→consume {q}",
                [raw_ms[q]],
                better="lower",
            )
        )
    section.cpu_pct = {
        "relay drain": merge_cpu(cpu["relay"]),
        **{f"raw {name} publish": merge_cpu(cpu[name]) for name in RAW_PUBLISHERS},
    }
    section.details["idle_latency_ms"] = {"through_relay": relay_ms, "raw_broker": raw_ms}
    section.details["rates"] = rates
    section.details["cpu_us_per_message"] = cpu_us
    section.details["strongest_raw_publisher"] = strongest
    return section
