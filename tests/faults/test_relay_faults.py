"""The relay under kills and outages: nothing accepted into the outbox is ever lost."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aio_pika
import httpx
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.chaos import broker_stopped, postgres_stopped
from jobcore.testing.processes import jobcore_process
from jobcore.testing.tcpproxy import Mode, TcpProxy
from jobcore.testing.waiting import eventually
from tests.integration.relay.helpers import (
    Collector,
    collect,
    fill_outbox,
    health_port,
    log_records,
    messages_logged,
    outbox_count,
    outbox_message_ids,
    relay_env,
    wait_drained,
    wait_received,
)


async def readiness(port: int) -> dict[str, object]:
    """The relay's /readyz answer (status 0 when it does not answer at all)."""
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            response = await http.get(f"http://127.0.0.1:{port}/readyz")
    except httpx.HTTPError:
        return {"status_code": 0}
    return {**response.json(), "status_code": response.status_code}


async def unlocked_due_rows(db: Database) -> int:
    """Due rows no session holds a lock on (what a relay could claim right now)."""
    async with db.connection() as conn, conn.transaction():
        cur = await conn.execute(
            "SELECT count(*) AS n FROM (SELECT id FROM jobcore.outbox WHERE available_at <= now() "
            "FOR UPDATE SKIP LOCKED) AS free"
        )
        row = await cur.fetchone()
        return int(row["n"]) if row else 0


@contextlib.asynccontextmanager
async def fresh_collector(settings: Settings, topology: Topology) -> AsyncIterator[Collector]:
    """A consumer on its own connection, and the test's topology removed afterwards (for
    tests whose broker restarts, which would break the `amqp_channel` fixture)."""
    connection = await aio_pika.connect(settings.amqp_url, timeout=10)
    try:
        yield await collect(await connection.channel(), topology)
        cleanup = await connection.channel()
        await topology.delete(cleanup, default_registry.queues())
    finally:
        await connection.close()


async def test_relay_killed_mid_batch_then_restarted_loses_nothing(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
    tmp_path: Path,
) -> None:
    collector = await collect(amqp_channel, topology)
    rows = await fill_outbox(db, topology, 20_000)
    expected = {r["message_id"] for r in rows}
    # One big batch at a time, so the kill lands between its publishes and its commit.
    env = relay_env(JOBCORE_RELAY_BATCH_SIZE="5000", JOBCORE_RELAY_LANES="1")
    with jobcore_process(settings, "relay", log_path=tmp_path / "killed.log", **env) as relay:

        async def flowing() -> bool:
            return bool(collector.ids)

        await eventually(flowing, timeout=20, interval=0.002, what="the first message")
        relay.send_signal(signal.SIGKILL)
        relay.wait(timeout=10)

    assert not messages_logged(tmp_path / "killed.log", "relay stopped")
    assert await outbox_count(db) > 0

    async def published_but_not_marked_done() -> set[str]:
        return collector.distinct & await outbox_message_ids(db)

    # Proof that the kill hit mid-batch: messages the broker has whose rows are still there.
    orphans = await eventually(published_but_not_marked_done, what="messages of the killed batch")

    log = tmp_path / "restarted.log"
    with jobcore_process(settings, "relay", log_path=log, **relay_env()) as relay:
        await wait_drained(db)
        await wait_received(collector, expected)
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=settings.shutdown_grace + 5) == 0

    assert collector.distinct == expected
    assert collector.duplicates >= len(orphans) > 0
    print(
        f"\nSIGKILL mid-batch: {len(orphans)} messages of the killed batch were published "
        f"again after the restart; {collector.duplicates} duplicates in all, none lost"
    )


async def test_a_silently_dead_connection_is_detected_and_replaced(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
    tmp_path: Path,
) -> None:
    """A blackholed connection (no FIN, no RST) is noticed by the publish timeout."""
    collector = await collect(amqp_channel, topology)
    rows = await fill_outbox(db, topology, 20_000)
    proxy = TcpProxy("127.0.0.1", 5672)
    await proxy.start()
    log = tmp_path / "relay.log"
    env = relay_env(
        JOBCORE_AMQP_URL=f"amqp://guest:guest@127.0.0.1:{proxy.port}/",
        JOBCORE_RELAY_PUBLISH_TIMEOUT="1",
        JOBCORE_RELAY_CONNECT_TIMEOUT="1",
        JOBCORE_RELAY_BATCH_SIZE="1000",
    )
    try:
        with jobcore_process(settings, "relay", log_path=log, **env) as relay:
            port = await health_port(log)

            async def flowing() -> bool:
                return bool(collector.ids)

            await eventually(flowing, timeout=20, what="the first message")
            proxy.set_mode(Mode.BLACKHOLE)

            async def down() -> bool:
                state = await readiness(port)
                return state["status_code"] == 503 and state.get("broker_connected") is False

            await eventually(down, timeout=15, interval=0.1, what="the relay to notice")
            assert await outbox_count(db) > 0
            proxy.set_mode(Mode.FORWARD)
            await wait_drained(db, timeout=60)
            await wait_received(collector, {r["message_id"] for r in rows})
            relay.send_signal(signal.SIGTERM)
            assert relay.wait(timeout=settings.shutdown_grace + 5) == 0
    finally:
        await proxy.stop()

    # The blackhole is noticed by whichever silent request came first: a batch's confirms
    # (the batch is then left unconfirmed, and published again) or the queue-depth read
    # between batches; both are bounded by the publish timeout. On a loaded machine a slow
    # confirm may also time out once before the blackhole. Every loss is followed by a
    # reconnection.
    [stopped] = messages_logged(log, "relay stopped")
    lost = messages_logged(log, "broker connection lost")
    assert len(lost) >= 1
    by_depth_read = any("queue depths" in str(entry.get("error")) for entry in lost)
    assert stopped["unconfirmed"] > 0 or by_depth_read, lost
    assert len(messages_logged(log, "broker connected again")) == len(lost)


@pytest.mark.serial
async def test_relay_rides_out_a_broker_outage_and_drains_everything(
    settings: Settings, db: Database, topology: Topology, tmp_path: Path
) -> None:
    log = tmp_path / "relay.log"
    before = await fill_outbox(db, topology, 500)
    # Nothing consumes until the end (all 2,500 messages are read back from the queue), so
    # the relay runs without the queue depth limit, which would keep most in the outbox.
    env = relay_env(JOBCORE_RELAY_QUEUE_DEPTH_LIMIT="0")
    with jobcore_process(settings, "relay", log_path=log, **env) as relay:
        port = await health_port(log)
        await wait_drained(db)
        with broker_stopped():
            during = await fill_outbox(db, topology, 2000)

            async def reconnecting() -> bool:
                state = await readiness(port)
                failures = state.get("broker_connect_failures")
                return state["status_code"] == 503 and isinstance(failures, int) and failures >= 3

            await eventually(reconnecting, timeout=30, interval=0.1, what="reconnect attempts")
            # The rows wait in the database, and the relay holds no lock on them.
            assert await outbox_count(db) == len(during)
            assert await unlocked_due_rows(db) == len(during)
        await wait_drained(db, timeout=90)

        async def ready() -> bool:
            return (await readiness(port))["status_code"] == 200

        await eventually(ready, timeout=30, what="the relay to be ready again")
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=settings.shutdown_grace + 5) == 0

    # Logged once per state change, however many attempts the outage took.
    assert len(messages_logged(log, "broker connection lost")) == 1
    assert len(messages_logged(log, "broker connected again")) == 1
    assert not [r for r in log_records(log) if r["level"] == "error"]
    expected = {r["message_id"] for r in before + during}
    async with fresh_collector(settings, topology) as collector:
        await wait_received(collector, expected, timeout=30)
    assert collector.distinct == expected


@pytest.mark.serial
async def test_listen_comes_back_after_a_postgres_restart(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
    tmp_path: Path,
) -> None:
    collector = await collect(amqp_channel, topology)
    log = tmp_path / "relay.log"
    # Polling once a minute: only a NOTIFY can make the relay publish within the test.
    env = relay_env(JOBCORE_RELAY_POLL_INTERVAL="60")
    with jobcore_process(settings, "relay", log_path=log, **env) as relay:
        port = await health_port(log)

        async def idle() -> bool:
            state = await readiness(port)
            return state["status_code"] == 200 and state.get("idle") is True

        await eventually(idle, timeout=20, what="the relay to be idle")
        with postgres_stopped():

            async def database_down() -> bool:
                return (await readiness(port))["status_code"] == 503

            await eventually(database_down, timeout=20, interval=0.1, what="the relay to notice")

        async def listening_again() -> bool:
            return bool(messages_logged(log, "listening for outbox notifications again"))

        await eventually(listening_again, timeout=30, interval=0.1, what="LISTEN to come back")
        await eventually(idle, timeout=30, what="the relay to be idle again")
        rows = await fill_outbox(db, topology, 10, notify=True)
        await wait_received(collector, {r["message_id"] for r in rows}, timeout=15)
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=settings.shutdown_grace + 5) == 0
    assert len(messages_logged(log, "outbox LISTEN connection lost; polling until it is back")) == 1
