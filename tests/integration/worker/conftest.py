"""Fixtures for the worker tests: tuned settings, a stand-in relay, in-process workers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aio_pika
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from services.worker.app import Worker
from tests.integration.worker.support import OutboxPump, running_pump, worker_settings

StartWorker = Callable[..., Awaitable[Worker]]


@pytest.fixture
def wsettings(settings: Settings) -> Settings:
    return worker_settings(settings)


@pytest.fixture
async def broker_cleanup(wsettings: Settings, topology: Topology) -> AsyncIterator[None]:
    """Delete the test's exchanges and queues afterwards (the prefix is the test's own)."""
    yield
    with contextlib.suppress(Exception):
        connection = await aio_pika.connect(wsettings.amqp_url, timeout=5)
        async with connection:
            channel = await connection.channel()
            await topology.delete(channel, default_registry.queues())


@pytest.fixture
async def outbox_pump(
    wsettings: Settings, db: Database, broker_cleanup: None
) -> AsyncIterator[OutboxPump]:
    """A stand-in relay the test drives by hand (``await pump.drain()``)."""
    pump = OutboxPump(wsettings, db)
    try:
        yield pump
    finally:
        await pump.close()


@pytest.fixture
async def pump(
    wsettings: Settings, db: Database, broker_cleanup: None
) -> AsyncIterator[OutboxPump]:
    """A stand-in relay publishing due outbox rows in the background, like the real one."""
    async with running_pump(OutboxPump(wsettings, db)) as running:
        yield running


@pytest.fixture
async def start_worker(wsettings: Settings, broker_cleanup: None) -> AsyncIterator[StartWorker]:
    """Start in-process workers (stopped at the end of the test); wait until they consume."""
    started: list[Worker] = []

    async def start(settings: Settings | None = None, **kwargs: Any) -> Worker:
        worker = Worker(settings or wsettings, **kwargs)
        started.append(worker)
        await worker.start()

        async def consuming() -> bool:
            if not worker.consumer.running and not worker.consumer.consuming:
                await worker.consumer.wait()  # it ended: raise what it raised
            return worker.consumer.consuming

        await eventually(consuming, what="the worker to consume")
        return worker

    try:
        yield start
    finally:
        for worker in reversed(started):
            await worker.stop()
