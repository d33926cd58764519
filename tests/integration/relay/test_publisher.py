"""The confirmed publisher against the real broker: every message of a batch ends confirmed,
refused (for its own reason) or unconfirmed (the connection's fault), on both write paths."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import aio_pika
import pytest

from jobcore.amqp.publisher import ConfirmedPublisher, Failure, OutgoingMessage
from jobcore.amqp.topology import Topology
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.tcpproxy import Mode, TcpProxy
from tests.integration.relay.helpers import TRACEPARENT, collect, wait_received

# A limit under the broker's (128 MiB), so a "too large" body is small enough for a test.
MAX_MESSAGE_SIZE = 64 * 1024


def message(topology: Topology, routing_key: str = "testq", **fields: object) -> OutgoingMessage:
    values: dict[str, object] = {
        "exchange": topology.jobs_exchange,
        "routing_key": routing_key,
        "message_id": str(uuid.uuid4()),
        "message_type": "echo",
        "headers": {"traceparent": TRACEPARENT},
        "body": b'{"v":1}',
        **fields,
    }
    return OutgoingMessage(**values)  # type: ignore[arg-type]


@pytest.fixture(params=[True, False], ids=["batched-writes", "publish-each"])
async def publisher(
    request: pytest.FixtureRequest, settings: Settings
) -> AsyncIterator[ConfirmedPublisher]:
    publisher = ConfirmedPublisher(
        settings,
        queues=default_registry.queues(),
        publish_timeout=20,
        batched_writes=request.param,
        max_message_size=MAX_MESSAGE_SIZE,
    )
    await publisher.connect()
    try:
        yield publisher
    finally:
        await publisher.close()


async def test_a_batch_is_confirmed_and_arrives(
    publisher: ConfirmedPublisher,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    collector = await collect(amqp_channel, topology)
    batch = [message(topology) for _ in range(2000)]
    result = await publisher.publish_batch(batch)
    assert result.confirmed == list(range(len(batch)))
    assert result.failed == []
    assert result.unconfirmed == []
    assert result.broker_error is None
    await wait_received(collector, {m.message_id for m in batch})
    # Nothing of the batch stays registered on the channel (a relay runs for months).
    raw = await publisher._channel.get_underlay_channel()  # type: ignore[union-attr]
    assert raw.confirmations == {}
    assert raw.message_id_delivery_tag == {}


async def test_each_refused_message_fails_alone_and_the_rest_are_confirmed(
    publisher: ConfirmedPublisher,
    settings: Settings,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    collector = await collect(amqp_channel, topology)
    batch = [
        message(topology),
        # Refused for now: the broker's state is to blame.
        message(topology, routing_key="nowhere"),
        message(topology, exchange=f"{settings.amqp_prefix}.missing"),
        # Never publishable: not encodable as AMQP.
        message(topology, headers={"too_big": 2**70}),
        message(topology, message_type="t" * 300),
        message(topology, routing_key="r" * 300),
        message(topology, exchange="e" * 300),
        message(topology, headers=["not", "a", "table"]),
        # Never publishable: too large. Sent, the first would make the broker close the
        # connection (501 FRAME_ERROR: its header frame is over frame_max).
        message(topology, headers={"big": "x" * 200_000}),
        message(topology, body=b"x" * (MAX_MESSAGE_SIZE + 1)),
        message(topology),
    ]
    result = await publisher.publish_batch(batch)
    assert sorted(result.confirmed) == [0, 10]
    reasons = {index: reason for index, reason, _ in result.failed}
    assert reasons == {
        1: Failure.RETURNED,
        2: Failure.NO_EXCHANGE,
        3: Failure.MALFORMED,
        4: Failure.MALFORMED,
        5: Failure.MALFORMED,
        6: Failure.MALFORMED,
        7: Failure.MALFORMED,
        8: Failure.TOO_LARGE,
        9: Failure.TOO_LARGE,
    }
    errors = {index: error for index, _, error in result.failed}
    assert "NO_ROUTE" in errors[1]
    assert "over the broker's frame_max" in errors[8]
    assert f"max_message_size of {MAX_MESSAGE_SIZE}" in errors[9]
    assert result.unconfirmed == []
    assert result.broker_error is None
    assert publisher.connected, "a refused message must not cost the connection"
    await wait_received(collector, {batch[0].message_id, batch[10].message_id})
    # The channel still works for the next batch.
    again = await publisher.publish_batch([message(topology)])
    assert again.confirmed == [0]


async def test_messages_the_broker_nacks_are_reported_as_nacked(
    publisher: ConfirmedPublisher,
    settings: Settings,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    # A queue that refuses publishes once it holds one message makes the broker nack.
    exchange = await amqp_channel.get_exchange(topology.jobs_exchange, ensure=True)
    full = await amqp_channel.declare_queue(
        f"{settings.amqp_prefix}.q.full",
        arguments={"x-max-length": 1, "x-overflow": "reject-publish"},
    )
    await full.bind(exchange, routing_key="full")
    try:
        nacked_on = publisher._raw
        result = await publisher.publish_batch([message(topology, "full") for _ in range(3)])
        assert result.confirmed == [0]
        assert [(i, reason) for i, reason, _ in result.failed] == [
            (1, Failure.NACKED),
            (2, Failure.NACKED),
        ]
        assert publisher.connected
        # The next batch goes out on a new channel of the same connection: on RabbitMQ
        # 3.10 a channel can stay refused by a quorum queue whose leader it met dead.
        assert publisher.channel_renewals == 1
        assert nacked_on is not None
        assert publisher._raw is not nacked_on
        assert nacked_on.is_closed
        again = await publisher.publish_batch([message(topology)])
        assert again.confirmed == [0]
    finally:
        await full.delete(if_unused=False, if_empty=False)


async def test_a_nacked_batch_leaves_another_lanes_batch_its_channel_until_confirmed(
    publisher: ConfirmedPublisher,
    settings: Settings,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    exchange = await amqp_channel.get_exchange(topology.jobs_exchange, ensure=True)
    full = await amqp_channel.declare_queue(
        f"{settings.amqp_prefix}.q.full",
        arguments={"x-max-length": 0, "x-overflow": "reject-publish"},
    )
    await full.bind(exchange, routing_key="full")
    try:
        shared = publisher._raw
        assert shared is not None
        # Another lane's batch in flight on the channel (held so, whatever the timing).
        publisher._in_flight[shared] += 1
        nacked = await publisher.publish_batch([message(topology, "full")])
        assert [reason for _, reason, _ in nacked.failed] == [Failure.NACKED]
        assert publisher.channel_renewals == 1
        assert publisher._raw is not shared
        # Left open for that batch's confirms, and closed once it is settled.
        assert shared in publisher._retiring
        assert not shared.is_closed
        other = await publisher.publish_batch([message(topology) for _ in range(500)])
        assert len(other.confirmed) == 500
        await publisher._batch_done(shared)
        assert shared.is_closed
        assert publisher._retiring == {}
        assert not publisher._in_flight
        # And for real: a big batch and a nacked one at once; the big one is all confirmed.
        result, nacked = await asyncio.gather(
            publisher.publish_batch([message(topology) for _ in range(3000)]),
            publisher.publish_batch([message(topology, "full")]),
        )
        assert [reason for _, reason, _ in nacked.failed] == [Failure.NACKED]
        assert len(result.confirmed) == 3000, (result.unconfirmed[:3], result.broker_error)
        assert publisher.connected
        assert publisher.channel_renewals == 2
        assert publisher._retiring == {}
        assert not publisher._in_flight
    finally:
        await full.delete(if_unused=False, if_empty=False)


async def test_publishing_while_disconnected_leaves_everything_unconfirmed(
    settings: Settings, topology: Topology
) -> None:
    publisher = ConfirmedPublisher(settings, queues=default_registry.queues())
    result = await publisher.publish_batch([message(topology), message(topology)])
    assert result.unconfirmed == [0, 1]
    assert result.broker_error == "not connected"


async def test_a_blackholed_connection_times_out_into_unconfirmed_and_disconnects(
    settings: Settings, topology: Topology, amqp_channel: aio_pika.abc.AbstractChannel
) -> None:
    await collect(amqp_channel, topology)
    proxy = TcpProxy("127.0.0.1", 5672)
    await proxy.start()
    via_proxy = settings.model_copy(
        update={"amqp_url": f"amqp://guest:guest@127.0.0.1:{proxy.port}/"}
    )
    publisher = ConfirmedPublisher(
        via_proxy, queues=default_registry.queues(), publish_timeout=0.5, connect_timeout=0.5
    )
    try:
        await publisher.connect()
        assert (await publisher.publish_batch([message(topology)])).confirmed == [0]
        proxy.set_mode(Mode.BLACKHOLE)
        result = await publisher.publish_batch([message(topology) for _ in range(50)])
        assert result.unconfirmed == list(range(50))
        assert result.broker_error is not None
        assert "no confirm within" in result.broker_error
        assert not publisher.connected
        assert publisher.lost.is_set()
        proxy.set_mode(Mode.FORWARD)
        await publisher.connect()
        assert (await publisher.publish_batch([message(topology)])).confirmed == [0]
    finally:
        await publisher.close()
        await proxy.stop()


async def test_a_channel_closed_mid_batch_ends_the_wait_at_once(
    publisher: ConfirmedPublisher,
    topology: Topology,
    amqp_channel: aio_pika.abc.AbstractChannel,
) -> None:
    """The exchange deleted under a batch in flight: the broker closes the channel (404);
    what was confirmed stays confirmed, the rest is unconfirmed, well before the timeout."""
    await collect(amqp_channel, topology)
    batch = [message(topology) for _ in range(20_000)]
    publishing = asyncio.create_task(publisher.publish_batch(batch))
    await asyncio.sleep(0)  # the batch is written; the broker takes a while to route it all
    started = time.monotonic()
    await amqp_channel.exchange_delete(topology.jobs_exchange)
    result = await publishing
    # Ended by the channel's close, not by the timeout: 20,000 messages written one at a
    # time can take the broker over 10 s to route on a loaded 2-core machine.
    assert time.monotonic() - started < publisher.publish_timeout
    assert result.unconfirmed, "the exchange went before the whole batch was routed"
    assert result.broker_error is not None
    assert "no confirm" not in result.broker_error
    # Between the binding and the exchange going, a message may be returned unroutable.
    assert {reason for _, reason, _ in result.failed} <= {Failure.RETURNED}
    assert len(result.confirmed) + len(result.failed) + len(result.unconfirmed) == len(batch)
    assert not publisher.connected
