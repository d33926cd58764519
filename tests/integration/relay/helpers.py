"""What the relay tests share: filling the outbox, collecting what reached the broker, and
running relays in-process or as real processes."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import orjson

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.settings import RelayOptions, Settings
from jobcore.testing.processes import ROOT, jobcore_command, settings_env
from jobcore.testing.waiting import eventually
from services.relay.metrics import RelayMetrics
from services.relay.relay import Relay, build_publisher

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

# One statement however many rows: the tests fill thousands at once.
FILL_SQL = """
INSERT INTO jobcore.outbox (message_id, exchange, routing_key, message_type, headers, body,
                    tenant, available_at)
SELECT gen_random_uuid(), %(exchange)s, %(routing_key)s, 'echo', %(headers)s::jsonb,
       coalesce(%(body)s::bytea, convert_to(
           '{"v":1,"job_id":"' || gen_random_uuid() || '","attempt":1,"type":"echo"}', 'UTF8'
       )),
       %(tenant)s, now() + make_interval(secs => %(delay)s)
FROM generate_series(1, %(n)s)
RETURNING id, message_id::text AS message_id
"""

# Fast reconnects and retries, a short poll, and a health port the OS picks.
FAST_RELAY_ENV = {
    "JOBCORE_RELAY_HEALTH_PORT": "0",
    "JOBCORE_RELAY_POLL_INTERVAL": "0.2",
    "JOBCORE_RELAY_RECONNECT_BASE_DELAY": "0.05",
    "JOBCORE_RELAY_RECONNECT_MAX_DELAY": "0.5",
    "JOBCORE_RELAY_RETRY_BASE_DELAY": "0.05",
    "JOBCORE_RELAY_RETRY_MAX_DELAY": "0.2",
}


def relay_env(**overrides: str) -> dict[str, str]:
    return {**FAST_RELAY_ENV, **overrides}


async def fill_outbox(
    db: Database,
    topology: Topology,
    n: int,
    *,
    routing_key: str = "testq",
    exchange: str | None = None,
    delay: float = 0.0,
    notify: bool = True,
    headers: dict[str, Any] | None = None,
    body: bytes | None = None,
    tenant: str = "t",
) -> list[dict[str, Any]]:
    """Insert ``n`` outbox rows in one statement; return their ids and message ids."""
    async with db.connection() as conn, conn.transaction():
        cur = await conn.execute(
            FILL_SQL,
            {
                "exchange": topology.jobs_exchange if exchange is None else exchange,
                "routing_key": routing_key,
                # The standard library's encoder: headers may hold numbers JSON allows and
                # AMQP cannot carry (orjson refuses integers over 64 bits).
                "headers": json.dumps(headers or {"traceparent": TRACEPARENT}),
                "delay": delay,
                "body": body,
                "tenant": tenant,
                "n": n,
            },
        )
        rows = await cur.fetchall()
        if notify:
            await conn.execute("SELECT pg_notify(%s, '')", (OUTBOX_CHANNEL,))
    return [dict(r) for r in rows]


async def outbox_count(db: Database) -> int:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM jobcore.outbox")
        row = await cur.fetchone()
        return int(row["n"]) if row else 0


async def outbox_message_ids(db: Database) -> set[str]:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT message_id::text AS m FROM jobcore.outbox")
        return {r["m"] for r in await cur.fetchall()}


async def outbox_row(db: Database, outbox_id: int) -> dict[str, Any] | None:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT * FROM jobcore.outbox WHERE id = %s", (outbox_id,))
        row = await cur.fetchone()
        return dict(row) if row else None


class Collector:
    """Every message consumed from a queue, duplicates kept, in arrival order."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.messages: list[aio_pika.abc.AbstractIncomingMessage] = []

    async def on_message(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        self.ids.append(str(message.message_id))
        if len(self.messages) < 100:
            self.messages.append(message)

    @property
    def distinct(self) -> set[str]:
        return set(self.ids)

    @property
    def duplicates(self) -> int:
        return len(self.ids) - len(self.distinct)


async def collect(
    channel: aio_pika.abc.AbstractChannel, topology: Topology, queue: str = "testq"
) -> Collector:
    """Declare the test's topology on ``channel`` and consume ``queue`` into a Collector."""
    await channel.set_qos(prefetch_count=2000)
    queues = await topology.declare(channel, default_registry.queues())
    collector = Collector()
    await queues[queue].consume(collector.on_message, no_ack=True)
    return collector


async def wait_drained(db: Database, *, timeout: float = 30.0) -> None:
    async def empty() -> bool:
        return await outbox_count(db) == 0

    await eventually(empty, timeout=timeout, interval=0.05, what="the outbox to be empty")


async def wait_received(collector: Collector, ids: set[str], *, timeout: float = 30.0) -> None:
    async def arrived() -> bool:
        return ids <= collector.distinct

    await eventually(
        arrived, timeout=timeout, interval=0.05, what=f"{len(ids)} messages on the broker"
    )


def log_records(path: Path) -> list[dict[str, Any]]:
    """The JSON log lines a relay process wrote (other lines are ignored)."""
    records = []
    for line in path.read_bytes().splitlines():
        with contextlib.suppress(orjson.JSONDecodeError):
            record = orjson.loads(line)
            if isinstance(record, dict):
                records.append(record)
    return records


def messages_logged(path: Path, msg: str) -> list[dict[str, Any]]:
    return [r for r in log_records(path) if r.get("msg") == msg]


async def health_port(path: Path, *, timeout: float = 20.0) -> int:
    async def port() -> int | None:
        starting = messages_logged(path, "relay starting") if path.exists() else []
        return starting[0]["health_port"] if starting else None

    return await eventually(port, timeout=timeout, interval=0.05, what="the relay's health port")


def run_cli(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobcore_command(*args),
        env=settings_env(settings, **env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@contextlib.asynccontextmanager
async def running_relay(settings: Settings, db: Database, **options: Any) -> AsyncIterator[Relay]:
    """A relay in this process (for tests that look at it from inside)."""
    relay_options = RelayOptions(
        **{
            "reconnect_base_delay": 0.05,
            "reconnect_max_delay": 0.5,
            "retry_base_delay": 0.05,
            "retry_max_delay": 0.2,
            **options,
        }
    )
    metrics = RelayMetrics()
    relay = Relay(
        settings,
        db,
        build_publisher(settings, relay_options, metrics),
        options=relay_options,
        metrics=metrics,
    )
    await relay.start()
    try:
        yield relay
    finally:
        await relay.stop(settings.shutdown_grace)


async def wait_idle(relay: Relay) -> None:
    async def idle() -> bool:
        return relay.publisher.connected and relay.running and relay.idle

    await eventually(idle, what="the relay to be connected and idle")
