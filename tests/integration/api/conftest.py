"""The API in-process (httpx over ASGI, lifespan opened here) on the test's database,
with API keys for two tenants."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.usecases import keys as key_usecases
from services.api.app import create_app

TENANT = "acme"
OTHER_TENANT = "globex"


@pytest.fixture
async def api_app(settings: Settings) -> AsyncIterator[FastAPI]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
async def api_client(api_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    # raise_app_exceptions (the default): an unhandled error fails the test outright,
    # so a test passing also shows its inputs never reached the 500 handler.
    transport = httpx.ASGITransport(api_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://jobcore.test") as client:
        yield client


@pytest.fixture
async def api_key(db: Database) -> str:
    return (await key_usecases.create_key(db, TENANT, "tests", actor="tests")).key


@pytest.fixture
async def other_api_key(db: Database) -> str:
    return (await key_usecases.create_key(db, OTHER_TENANT, "tests", actor="tests")).key


@pytest.fixture
def auth(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"}


@pytest.fixture
def other_auth(other_api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {other_api_key}"}
