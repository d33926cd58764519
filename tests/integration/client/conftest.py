"""The client's live tests run a relay and a worker, which declare the test's queues: the
``amqp_channel`` fixture deletes them afterwards, so runs do not pile queues up."""

from __future__ import annotations

import aio_pika
import pytest


@pytest.fixture(autouse=True)
def delete_topology_afterwards(amqp_channel: aio_pika.abc.AbstractChannel) -> None:
    return None
