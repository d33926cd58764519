"""The relay loop in this process: wire format, waking (NOTIFY, polling, scheduled rows),
quarantine, and what it reports to operators."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import aio_pika
import orjson

from jobcore.amqp.topology import Topology
from jobcore.db import Database
from jobcore.settings import Settings
from services.relay.relay import Relay
from tests.integration.relay.helpers import (
    TRACEPARENT,
    collect,
    fill_outbox,
    outbox_count,
    outbox_message_ids,
    outbox_row,
    running_relay,
    wait_drained,
    wait_received,
)
from tests.support.waiting import eventually


async def test_a_row_becomes_a_persistent_mandatory_message_per_the_wire_contract(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    collector = await collect(amqp_channel, topology)
    headers = {"traceparent": TRACEPARENT, "tracestate": "vendor=1"}
    [row] = await fill_outbox(db, topology, 1, headers=headers)
    stored = await outbox_row(db, row["id"])
    assert stored is not None

    async with running_relay(settings, db):
        await wait_received(collector, {row["message_id"]})
        await wait_drained(db)

    [message] = collector.messages
    assert message.message_id == row["message_id"]
    assert message.type == "echo"
    assert message.content_type == "application/json"
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert message.exchange == topology.jobs_exchange
    assert message.routing_key == "testq"
    assert message.headers == {**headers, "x-envelope-version": 1}
    assert message.body == stored["body"]
    assert orjson.loads(message.body)["v"] == 1


async def test_notify_wakes_an_idle_relay_long_before_its_poll_interval(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    collector = await collect(amqp_channel, topology)
    slow_poll = settings.model_copy(update={"relay_poll_interval": 60.0})
    async with running_relay(slow_poll, db) as relay:
        # Let the relay finish its first (empty) pass and go to sleep for a minute.
        await wait_idle(relay)
        rows = await fill_outbox(db, topology, 20, notify=True)
        await wait_received(collector, {r["message_id"] for r in rows}, timeout=10)
        await wait_drained(db, timeout=10)


async def test_without_listen_the_relay_finds_rows_by_polling(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    collector = await collect(amqp_channel, topology)
    fast_poll = settings.model_copy(update={"relay_poll_interval": 0.1})
    async with running_relay(fast_poll, db, listen=False) as relay:
        await wait_idle(relay)
        # No NOTIFY at all: as behind PgBouncer in transaction mode.
        rows = await fill_outbox(db, topology, 300, notify=False)
        await wait_received(collector, {r["message_id"] for r in rows}, timeout=10)
        await wait_drained(db, timeout=10)


async def test_a_scheduled_row_is_published_when_due_not_at_the_next_poll(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    collector = await collect(amqp_channel, topology)
    slow_poll = settings.model_copy(update={"relay_poll_interval": 60.0})
    async with running_relay(slow_poll, db) as relay:
        await wait_idle(relay)
        [row] = await fill_outbox(db, topology, 1, delay=1.5, notify=True)
        stored = await outbox_row(db, row["id"])
        assert stored is not None
        await wait_received(collector, {row["message_id"]}, timeout=10)
        arrived = datetime.now(UTC)
    # Not before it was due (one clock: PostgreSQL runs on this machine).
    assert arrived >= stored["available_at"]


async def test_an_unroutable_row_is_retried_then_quarantined_while_others_flow(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    collector = await collect(amqp_channel, topology)
    config = settings.model_copy(
        update={"relay_max_publish_attempts": 3, "relay_poll_interval": 0.1}
    )
    [bad] = await fill_outbox(db, topology, 1, routing_key="nowhere")
    good = await fill_outbox(db, topology, 200)
    async with running_relay(config, db) as relay:
        await wait_received(collector, {r["message_id"] for r in good})

        async def quarantined() -> bool:
            row = await outbox_row(db, bad["id"])
            return row is not None and row["quarantined_at"] is not None

        await eventually(quarantined, timeout=15, what="the unroutable row to be quarantined")
        more = await fill_outbox(db, topology, 50)
        await wait_received(collector, {r["message_id"] for r in more})
        text = await relay.metrics_text()
        ready, details = await relay.probe()

    row = await outbox_row(db, bad["id"])
    assert row is not None
    assert row["attempts"] == 3
    assert "returned" in row["last_error"]
    assert "NO_ROUTE" in row["last_error"]
    assert bad["message_id"] not in collector.distinct
    assert await outbox_count(db) == 1  # only the quarantined row is left
    assert 'jobcore_relay_publish_failures_total{reason="returned"} 3.0' in text
    assert "jobcore_relay_quarantined_total 1.0" in text
    assert "jobcore_relay_published_total 250.0" in text
    assert ready is True
    assert details["backlog"]["quarantined"] == 1
    assert details["backlog"]["due"] == 0
    assert details["broker_connected"] is True
    assert details["last_publish_at"] is not None


async def test_a_row_naming_a_missing_exchange_is_quarantined_without_breaking_the_batch(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    collector = await collect(amqp_channel, topology)
    config = settings.model_copy(update={"relay_max_publish_attempts": 2})
    [bad] = await fill_outbox(db, topology, 1, exchange=f"{settings.amqp_prefix}.nope")
    good = await fill_outbox(db, topology, 100)
    async with running_relay(config, db):
        await wait_received(collector, {r["message_id"] for r in good})

        async def quarantined() -> bool:
            row = await outbox_row(db, bad["id"])
            return row is not None and row["quarantined_at"] is not None

        await eventually(quarantined, timeout=15, what="the row to be quarantined")
    row = await outbox_row(db, bad["id"])
    assert row is not None
    assert row["last_error"].startswith("no_exchange")


async def test_stop_commits_the_batch_in_flight_and_claims_no_more(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    collector = await collect(amqp_channel, topology)
    rows = await fill_outbox(db, topology, 20_000)
    config = settings.model_copy(update={"relay_batch_size": 1000})
    async with running_relay(config, db, lanes=1) as relay:

        async def flowing() -> bool:
            return bool(collector.ids)

        await eventually(flowing, what="the first message")
        started = time.monotonic()
        await relay.stop(config.shutdown_grace)
        assert time.monotonic() - started < config.shutdown_grace
        assert not relay.running

    left = await outbox_message_ids(db)
    assert 0 < len(left) < len(rows), "stopped mid-drain"
    assert relay.totals["unconfirmed"] == 0
    published = relay.totals["published"]
    assert published == len(rows) - len(left)

    async def all_arrived() -> bool:
        return len(collector.distinct) >= published

    await eventually(all_arrived, what="every confirmed message")
    # The batch in flight was committed: no published message left its row behind, and
    # nothing was lost between the two.
    assert not (collector.distinct & left)
    assert collector.distinct | left == {r["message_id"] for r in rows}


async def wait_idle(relay: Relay) -> None:
    async def idle() -> bool:
        return relay.publisher.connected and relay.running and relay.idle

    await eventually(idle, what="the relay to be connected and idle")
