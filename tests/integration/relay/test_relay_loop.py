"""The relay loop in this process: wire format, waking (NOTIFY, polling, scheduled rows),
rows the broker refuses, and what it reports to operators."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime
from typing import Any

import aio_pika
import orjson
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, execute, fetch_one
from jobcore.database.sql.outbox import OUTBOX_DROP_WAKE_LEASE, OUTBOX_TAKE_WAKE_LEASE
from jobcore.kernel.envelope import PUBLISHED_HEADER, read_published
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from services.relay import low_water, room
from services.relay import relay as relay_module
from services.relay.relay import Relay
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

    async with running_relay(settings, db) as relay:
        await wait_received(collector, {row["message_id"]})
        await wait_drained(db)

    [message] = collector.messages
    assert message.message_id == row["message_id"]
    assert message.type == "echo"
    assert message.content_type == "application/json"
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert message.exchange == topology.jobs_exchange
    assert message.routing_key == "testq"
    got = dict(message.headers or {})
    # When this relay took the row and which relay it is, for the claim to keep on the
    # job row as its `published` event (migration 0041).
    published_at, published_by = read_published({PUBLISHED_HEADER: got.pop(PUBLISHED_HEADER)})
    assert published_at is not None
    assert stored["created_at"] <= published_at
    assert published_by == relay.relay_id
    assert got == {**headers, "x-envelope-version": 1}
    assert message.body == stored["body"]
    assert orjson.loads(message.body)["v"] == 1


async def test_notify_wakes_an_idle_relay_long_before_its_poll_interval(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    collector = await collect(amqp_channel, topology)
    async with running_relay(settings, db, poll_interval=60.0) as relay:
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
    async with running_relay(settings, db, poll_interval=0.1, listen=False) as relay:
        await wait_idle(relay)
        # No NOTIFY at all: as behind PgBouncer in transaction mode.
        rows = await fill_outbox(db, topology, 300, notify=False)
        await wait_received(collector, {r["message_id"] for r in rows}, timeout=10)
        await wait_drained(db, timeout=10)


async def test_a_notify_heard_during_a_drain_is_answered_without_a_wait_query(
    settings: Settings, db: Database, topology: Topology
) -> None:
    # Under a steady trickle a NOTIFY arrives during nearly every batch: the next claim
    # must follow at once, not after asking when the next scheduled row is due.
    asked: list[str] = []
    async with running_relay(settings, db, poll_interval=0.2) as relay:
        await wait_idle(relay)
        await relay.stop(settings.shutdown_grace)  # its loop is out of the way
        relay.stopping.clear()
        relay.answers_notifies = True  # the lease holder, which asks for the next due row
        fetch = relay._fetch_one

        async def counted(read: Any) -> dict[str, Any] | None:
            asked.append(read.__name__)
            return await fetch(read)

        relay._fetch_one = counted  # type: ignore[method-assign]
        relay._wake.set()
        await relay._wait_for_work()
        assert asked == []
        relay._wake.clear()
        await relay._wait_for_work()  # the poll interval passes
        assert asked == ["seconds_until_next_due"]


async def test_a_scheduled_row_is_published_when_due_not_at_the_next_poll(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    collector = await collect(amqp_channel, topology)
    async with running_relay(settings, db, poll_interval=60.0) as relay:
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
    [bad] = await fill_outbox(db, topology, 1, routing_key="nowhere")
    good = await fill_outbox(db, topology, 200)
    async with running_relay(settings, db, max_publish_attempts=3, poll_interval=0.1) as relay:
        await wait_received(collector, {r["message_id"] for r in good})

        async def past_max_attempts() -> dict[str, Any] | None:
            row = await outbox_row(db, bad["id"])
            return row if row is not None and row["attempts"] > 5 else None

        row = await eventually(past_max_attempts, timeout=15, what="attempts past the maximum")
        more = await fill_outbox(db, topology, 50)
        await wait_received(collector, {r["message_id"] for r in more})

        # A consumer can hold a message before the relay has counted its confirm.
        async def counted_all() -> str | None:
            text = await relay.metrics_text()
            return text if "jobcore_relay_published_messages_total 250.0" in text else None

        text = await eventually(counted_all, timeout=15, what="the 250 confirms counted")
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
    exchange = f"{settings.amqp_prefix}.late"
    [bad] = await fill_outbox(db, topology, 1, exchange=exchange)
    good = await fill_outbox(db, topology, 100)
    async with running_relay(settings, db, max_publish_attempts=2):
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
    async with running_relay(settings, db, batch_size=1000, lanes=1) as relay:

        async def flowing() -> bool:
            return bool(collector.ids)

        await eventually(flowing, what="the first message")
        started = time.monotonic()
        await relay.stop(settings.shutdown_grace)
        assert time.monotonic() - started < settings.shutdown_grace
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


async def test_one_relay_answers_notifies_and_the_other_stands_by(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    collector = await collect(amqp_channel, topology)
    # Polls a minute apart: within the test, only a NOTIFY moves a row.
    async with running_relay(settings, db, poll_interval=60.0) as first:
        await wait_idle(first)
        await eventually(lambda: _answers(first), what="the first relay to take the wake lease")
        async with running_relay(settings, db, poll_interval=60.0) as second:
            await wait_idle(second)
            rows = await fill_outbox(db, topology, 20, notify=True)
            await wait_received(collector, {r["message_id"] for r in rows}, timeout=10)
            await wait_drained(db, timeout=10)
            assert first.answers_notifies
            assert not second.answers_notifies
            assert first.totals["published"] == 20
            assert second.totals["published"] == 0


async def test_a_standby_relay_takes_the_wake_lease_when_its_holder_stops(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    collector = await collect(amqp_channel, topology)
    # The standby tries for the lease every poll interval.
    async with contextlib.AsyncExitStack() as stack:
        async with running_relay(settings, db, poll_interval=60.0) as holder:
            await eventually(lambda: _answers(holder), what="the first relay to take the lease")
            standby = await stack.enter_async_context(
                running_relay(settings, db, poll_interval=0.2)
            )
            await wait_idle(standby)
            assert not standby.answers_notifies
        # The holder stopped, and gave the lease back with its pooled connection.
        await eventually(lambda: _answers(standby), what="the standby to take the wake lease")
        await wait_idle(standby)
        rows = await fill_outbox(db, topology, 5, notify=True)
        await wait_received(collector, {r["message_id"] for r in rows}, timeout=10)
        await wait_drained(db, timeout=10)


async def _answers(relay: Relay) -> bool:
    return relay.answers_notifies


async def test_a_standby_relay_publishes_rows_the_lease_holder_leaves_overdue(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    """A holder that publishes nothing (stuck, or its broker gone): the standby's polls
    find the rows overdue and drain them."""
    collector = await collect(amqp_channel, topology)
    async with db.connection() as holder:
        taken = await fetch_one(holder, OUTBOX_TAKE_WAKE_LEASE({}))
        assert taken is not None
        assert taken["held"]
        try:
            async with running_relay(settings, db, poll_interval=0.2) as standby:
                await wait_idle(standby)
                assert not standby.answers_notifies
                rows = await fill_outbox(db, topology, 50, notify=True)
                await wait_received(collector, {r["message_id"] for r in rows}, timeout=10)
                await wait_drained(db, timeout=10)
                assert not standby.answers_notifies
        finally:
            await execute(holder, OUTBOX_DROP_WAKE_LEASE({}))


async def test_with_overlap_a_row_notified_during_a_confirm_wait_is_published_meanwhile(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    # Under a steady trickle, rows committed while a batch waits for its confirms go out
    # in a batch of their own at once, not after that batch's commit.
    collector = await collect(amqp_channel, topology)
    async with running_relay(settings, db, poll_interval=60.0, lanes=2, overlap=True) as relay:
        await wait_idle(relay)
        held = asyncio.Event()
        entered = asyncio.Event()
        publish = relay.publisher.publish_batch

        async def first_held(messages: Any) -> Any:
            if not entered.is_set():
                entered.set()
                await held.wait()  # the first batch's confirms are slow to come
            return await publish(messages)

        relay.publisher.publish_batch = first_held  # type: ignore[method-assign]
        [first] = await fill_outbox(db, topology, 1, notify=True)
        await asyncio.wait_for(entered.wait(), timeout=10)
        [second] = await fill_outbox(db, topology, 1, notify=True)
        await wait_received(collector, {second["message_id"]}, timeout=10)
        assert first["message_id"] not in collector.distinct  # still held
        held.set()
        await wait_received(collector, {first["message_id"]}, timeout=10)
        await wait_drained(db, timeout=10)
    assert collector.duplicates == 0


async def test_without_overlap_a_trickles_batches_go_one_at_a_time(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    collector = await collect(amqp_channel, topology)
    async with running_relay(settings, db, poll_interval=60.0, lanes=2, overlap=False) as relay:
        await wait_idle(relay)
        in_flight = 0
        most = 0
        publish = relay.publisher.publish_batch

        async def counted(messages: Any) -> Any:
            nonlocal in_flight, most
            in_flight += 1
            most = max(most, in_flight)
            try:
                return await publish(messages)
            finally:
                in_flight -= 1

        relay.publisher.publish_batch = counted  # type: ignore[method-assign]
        rows = []
        for _ in range(20):
            rows += await fill_outbox(db, topology, 1, notify=True)
        await wait_received(collector, {r["message_id"] for r in rows}, timeout=10)
        await wait_drained(db, timeout=10)
    assert most == 1


async def test_a_trickles_claims_find_the_mark_and_the_depths_done_while_the_relay_waited(
    settings: Settings,
    db: Database,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both are due long after they were done (so a claim never does them on its way
    unless nothing did them ahead) and always within the look ahead: every wait does
    them, and no claim waits for them."""
    monkeypatch.setattr(low_water, "LOOK_EVERY", 3600.0)
    monkeypatch.setattr(room, "DEPTH_REUSE_SECONDS", 3600.0)
    monkeypatch.setattr(relay_module, "AHEAD_SECONDS", 7200.0)
    collector = await collect(amqp_channel, topology)
    async with running_relay(settings, db, poll_interval=60.0) as relay:
        await wait_idle(relay)
        in_claim = False
        on_claims_way: list[str] = []
        looks_before = relay.low_water.looks
        look, read, batch = relay.low_water.look, relay.room._read_depths, relay.relay_batch

        async def counted_look(conn: Any) -> float:
            if in_claim:
                on_claims_way.append("look")
            return await look(conn)

        async def counted_read(connection: Any) -> dict[str, int]:
            if in_claim:
                on_claims_way.append("depths")
            return await read(connection)

        async def flagged_batch() -> tuple[int, bool]:
            nonlocal in_claim
            in_claim = True
            try:
                return await batch()
            finally:
                in_claim = False

        relay.low_water.look = counted_look  # type: ignore[method-assign]
        relay.room._read_depths = counted_read  # type: ignore[method-assign]
        relay.relay_batch = flagged_batch  # type: ignore[method-assign]
        rows = []
        for _ in range(5):
            rows += await fill_outbox(db, topology, 1, notify=True)
            await wait_received(collector, {rows[-1]["message_id"]}, timeout=10)
            await wait_idle(relay)
        await wait_drained(db, timeout=10)
    assert on_claims_way == []
    assert relay.low_water.looks - looks_before >= 5
