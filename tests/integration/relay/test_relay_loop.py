"""The relay loop in this process: wire format, waking (NOTIFY, polling, scheduled rows),
rows the broker refuses, and what it reports to operators."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import aio_pika
import orjson

from jobcore.amqp.topology import Topology
from jobcore.db import Database
from jobcore.settings import Settings
from jobcore.testing.waiting import eventually
from tests.integration.relay.helpers import (
    TRACEPARENT,
    collect,
    fill_outbox,
    outbox_message_ids,
    outbox_row,
    running_relay,
    wait_drained,
    wait_idle,
    wait_received,
)


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


async def test_an_unroutable_row_is_retried_past_max_attempts_while_others_flow(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    """A row no queue takes is the broker's state, not the message: it is retried past
    JOBCORE_RELAY_MAX_PUBLISH_ATTEMPTS, never quarantined, and published once a queue is
    bound; operators see it failing meanwhile. Rows behind it are not held up."""
    collector = await collect(amqp_channel, topology)
    config = settings.model_copy(
        update={"relay_max_publish_attempts": 3, "relay_poll_interval": 0.1}
    )
    [bad] = await fill_outbox(db, topology, 1, routing_key="nowhere")
    good = await fill_outbox(db, topology, 200)
    async with running_relay(config, db) as relay:
        await wait_received(collector, {r["message_id"] for r in good})

        async def past_max_attempts() -> dict[str, Any] | None:
            row = await outbox_row(db, bad["id"])
            return row if row is not None and row["attempts"] > 5 else None

        row = await eventually(past_max_attempts, timeout=15, what="attempts past the maximum")
        more = await fill_outbox(db, topology, 50)
        await wait_received(collector, {r["message_id"] for r in more})

        # The consumer can have the last batch's messages before the relay has its
        # confirms and commits (and counts) the batch: read the counter once it has.
        async def counted() -> str | None:
            text = await relay.metrics_text()
            return text if "jobcore_relay_published_messages_total 250.0" in text else None

        counted_text = await eventually(counted, timeout=15, what="the last batch to be counted")
        assert counted_text is not None  # eventually returns a truthy answer or raises
        text = counted_text
        ready, details = await relay.probe()

        # The queue appears (as a deploy would declare it): the row goes out, untouched.
        nowhere = await amqp_channel.declare_queue(f"{settings.amqp_prefix}.q.nowhere")
        await nowhere.bind(topology.jobs_exchange, routing_key="nowhere")
        await wait_drained(db, timeout=15)
        message = await nowhere.get(timeout=5)
        await nowhere.delete(if_unused=False, if_empty=False)

    assert row["quarantined_at"] is None
    assert row["failing_since"] is not None
    assert "returned" in row["last_error"]
    assert "NO_ROUTE" in row["last_error"]
    assert message.message_id == bad["message_id"]
    assert 'jobcore_relay_publish_failures_total{reason="returned"}' in text
    assert "jobcore_relay_quarantined_rows_total 0.0" in text
    assert "jobcore_relay_outbox_failing_rows 1.0" in text
    assert "jobcore_relay_published_messages_total 250.0" in text
    assert ready is True
    assert details["backlog"]["quarantined"] == 0
    assert details["backlog"]["failing"] == 1
    assert details["backlog"]["longest_failing_seconds"] > 0
    assert details["broker_connected"] is True
    assert details["last_publish_at"] is not None


async def test_a_row_naming_a_missing_exchange_is_retried_without_breaking_the_batch(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    collector = await collect(amqp_channel, topology)
    config = settings.model_copy(update={"relay_max_publish_attempts": 2})
    exchange = f"{settings.amqp_prefix}.late"
    [bad] = await fill_outbox(db, topology, 1, exchange=exchange)
    good = await fill_outbox(db, topology, 100)
    async with running_relay(config, db):
        await wait_received(collector, {r["message_id"] for r in good})

        async def past_max_attempts() -> dict[str, Any] | None:
            row = await outbox_row(db, bad["id"])
            return row if row is not None and row["attempts"] > 3 else None

        row = await eventually(past_max_attempts, timeout=15, what="attempts past the maximum")
        # The exchange is declared (late, as by another deploy): the row goes out.
        late = await amqp_channel.declare_exchange(exchange, auto_delete=True)
        queue = await amqp_channel.declare_queue(exclusive=True)
        await queue.bind(late, routing_key="testq")
        await wait_drained(db, timeout=15)
        message = await queue.get(timeout=5)

    assert row["quarantined_at"] is None
    assert row["last_error"].startswith("no_exchange")
    assert message.message_id == bad["message_id"]


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
