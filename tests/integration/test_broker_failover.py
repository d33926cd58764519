"""Several brokers in JOBCORE_AMQP_URL: a connection goes to the first that answers, and the
worker's robust connection moves on to the next broker when its own goes away.

The "other broker" is the shared RabbitMQ reached directly; the first is the same broker
behind a proxy the test cuts (the three-node cluster has its own fault test,
tests/faults/test_rabbit_cluster.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from jobcore.amqp.connection import connect, connect_robust, connected_to
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import via_port
from jobcore.testing.tcpproxy import Mode, TcpProxy
from tests.support.services import ServiceUrls

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def proxy(service_urls: ServiceUrls) -> AsyncIterator[TcpProxy]:
    direct = Settings(environment="test", amqp_url=service_urls.amqp_url)
    parts = direct.amqp_urls[0].split("@")[-1].strip("/").split(":")
    running = TcpProxy(parts[0], int(parts[1]) if len(parts) > 1 else 5672)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


def brokers(service_urls: ServiceUrls, proxy: TcpProxy) -> Settings:
    """The proxied broker first, the direct one second."""
    url = service_urls.amqp_url
    return Settings(environment="test", amqp_url=f"{via_port(url, proxy.port)},{url}")


async def test_connect_skips_a_broker_that_refuses(
    service_urls: ServiceUrls, proxy: TcpProxy
) -> None:
    proxy.set_mode(Mode.REFUSE)
    connection = await connect(brokers(service_urls, proxy), timeout=5)
    try:
        assert f":{proxy.port}/" not in connected_to(connection)
        assert not connection.is_closed
    finally:
        await connection.close()


async def test_the_robust_connection_moves_on_to_the_next_broker_when_its_own_drops(
    service_urls: ServiceUrls, proxy: TcpProxy
) -> None:
    connection = await connect_robust(brokers(service_urls, proxy), timeout=5)
    try:
        assert f":{proxy.port}/" in connected_to(connection)
        channel = await connection.channel()
        queue = await channel.declare_queue(exclusive=True)
        reconnected = asyncio.Event()
        connection.reconnect_callbacks.add(lambda *_: reconnected.set())

        proxy.set_mode(Mode.REFUSE)  # closes the connection through it, refuses new ones
        await asyncio.wait_for(reconnected.wait(), timeout=20)

        assert f":{proxy.port}/" not in connected_to(connection)
        # The channel and its queue were restored on the other broker.
        declared = await channel.declare_queue(queue.name, passive=True)
        assert declared.name == queue.name
    finally:
        await connection.close()
