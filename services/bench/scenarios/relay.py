"""relay: drain a pre-filled outbox, next to aio-pika publishing the same messages.

Each run fills the outbox with ``relay_rows`` rows in one transaction while one `jobcore
relay` process idles, and times from that commit until the outbox is empty (every row
published, confirmed and deleted). The baseline publishes the same number of messages,
same size, headers and routing, straight from this process with aio-pika and publisher
confirms, ``batch size × lanes`` in flight (what the relay keeps in flight). Runs are
interleaved; the queue is purged between them. Then the idle latency: single jobs
enqueued while the relay idles, from commit to consumed here, next to a message published
and consumed straight through the broker.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import aio_pika
import orjson
import psycopg

from jobcore.amqp.topology import Topology
from jobcore.channels import OUTBOX_CHANNEL
from jobcore.db import Database
from jobcore.enqueue import enqueue
from jobcore.envelope import JobMessage
from jobcore.jobtypes import NoopPayload
from jobcore.registry import load_job_modules
from jobcore.settings import RelayOptions, Settings
from services.bench.harness import UNLIMITED_QUEUES, Bench, pids, relays_ready
from services.bench.measure import cpu_of, latency_ms, merge_cpu
from services.bench.report import Figure, Section

TITLE = "Outbox relay vs raw publishing with confirms"
QUEUE = "default"  # the queue of the `noop` job type
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
LATENCY_SAMPLES = 200

FILL_SQL = """
INSERT INTO outbox (message_id, exchange, routing_key, message_type, headers, body)
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
        cur = await conn.execute("SELECT EXISTS (SELECT 1 FROM outbox)")
        row = await cur.fetchone()
        if row is not None and not row[0]:
            return
        await asyncio.sleep(poll)  # the poll interval of the drain clock


async def raw_publish(
    channel: aio_pika.abc.AbstractChannel, exchange: str, n: int, window: int
) -> float:
    target = await channel.get_exchange(exchange, ensure=False)
    headers: dict[str, Any] = {"traceparent": TRACEPARENT, "x-envelope-version": 1}
    started = time.perf_counter()
    for start in range(0, n, window):
        await asyncio.gather(
            *(
                target.publish(
                    aio_pika.Message(
                        JobMessage(job_id=uuid.uuid4(), attempt=1, type="noop").encode(),
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
                    uow, topology, tenant="bench", job_type=noop, payload=NoopPayload()
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


async def run(bench: Bench) -> Section:
    options = bench.options
    lanes = RelayOptions().lanes
    rows = options.relay_rows
    async with (
        bench.scratch("relay") as config,
        bench.stack(config, "relay", relays=1, workers=0, env=UNLIMITED_QUEUES) as stack,
    ):
        window = config.relay_batch_size * lanes
        section = Section(
            "relay",
            TITLE,
            f"{rows:,} outbox rows per run drained by one `jobcore relay` (batch "
            f"{config.relay_batch_size}, {lanes} lanes), from the fill's commit until the "
            f"outbox is empty; baseline: the same number of persistent messages published "
            f"by aio-pika with confirms, {window} in flight; {options.runs} interleaved runs. "
            f"Idle latency: {LATENCY_SAMPLES} single jobs, commit→consumed.",
        )
        await relays_ready(stack)
        topology = Topology(config.amqp_prefix, config.amqp_delivery_limit)
        relay_pids = pids(stack)
        relay_pids.pop("api", None)
        connection = await aio_pika.connect(config.amqp_url)
        rates: dict[str, list[float]] = {"relay": [], "raw": []}
        cpu: dict[str, list[dict[str, float]]] = {"relay": [], "raw": []}
        try:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            async with await psycopg.AsyncConnection.connect(
                config.database_url, autocommit=True
            ) as conn:
                for run_number in range(options.runs):
                    bench.step(f"relay: run {run_number + 1} of {options.runs}")
                    used: dict[str, float] = {}
                    with cpu_of({}, used):
                        seconds = await raw_publish(channel, topology.jobs_exchange, rows, window)
                    rates["raw"].append(round(rows / seconds, 1))
                    cpu["raw"].append(used)
                    await purge(channel, topology)

                    await fill_outbox(conn, topology, rows)
                    started = time.perf_counter()
                    used = {}
                    last = run_number == options.runs - 1
                    async with bench.profiled(section, "drain", relay_pids if last else {}):
                        with cpu_of(relay_pids, used):
                            await until_empty(conn)
                    rates["relay"].append(round(rows / (time.perf_counter() - started), 1))
                    cpu["relay"].append(used)
                    await purge(channel, topology)
            bench.step("relay: idle latency")
            through_relay, raw = await idle_latency(config, topology, channel, LATENCY_SAMPLES)
        finally:
            await connection.close()
    section.add(
        Figure(f"{rows:,} rows", "messages/s", rates["relay"], "aio-pika, confirms", rates["raw"])
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
    section.cpu_pct = {"relay drain": merge_cpu(cpu["relay"]), "raw publish": merge_cpu(cpu["raw"])}
    section.details["idle_latency_ms"] = {"through_relay": relay_ms, "raw_broker": raw_ms}
    return section
