"""Fixtures for the webhook and long-poll tests: webhook settings, the API in-process, an
API key, and the test's broker names deleted afterwards."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import aio_pika
import httpx
import pytest
from fastapi import FastAPI

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.usecases import keys as key_usecases
from services.api.app import create_app
from tests.integration.webhooks.support import webhook_settings

TENANT = "acme"
OTHER_TENANT = "globex"


@pytest.fixture
def hsettings(settings: Settings) -> Settings:
    return webhook_settings(settings)


@pytest.fixture
async def broker_cleanup(hsettings: Settings, topology: Topology) -> AsyncIterator[None]:
    yield
    with contextlib.suppress(Exception):
        connection = await aio_pika.connect(hsettings.amqp_url, timeout=5)
        async with connection:
            await topology.delete(await connection.channel(), default_registry.queues())


@pytest.fixture
async def api_app(hsettings: Settings) -> AsyncIterator[FastAPI]:
    app = create_app(hsettings)
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
async def api_client(api_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(api_app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://jobcore.test", timeout=30
    ) as client:
        yield client


@pytest.fixture
async def auth(db: Database) -> dict[str, str]:
    key = (await key_usecases.create_key(db, TENANT, "webhook tests", actor="tests")).key
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
async def other_auth(db: Database) -> dict[str, str]:
    key = (await key_usecases.create_key(db, OTHER_TENANT, "webhook tests", actor="tests")).key
    return {"Authorization": f"Bearer {key}"}
