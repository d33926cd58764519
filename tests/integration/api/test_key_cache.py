"""JOBCORE_API_KEY_CACHE_SECONDS: an API process remembers verified keys for that long.

Off by default (every request looks its key up, so a revocation takes effect at once:
test_tenants.py). On, a revoked key keeps working on the process for at most that long,
an expired one stops at its expiry, and an unknown key is always looked up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from jobcore.db import Database, execute
from jobcore.settings import Settings
from jobcore.sql import Query
from jobcore.usecases import keys as key_usecases
from services.api.app import create_app
from services.api.auth import KeyCache
from tests.integration.api.conftest import TENANT
from tests.integration.api.support import assert_problem, counts, enqueue

CACHE_SECONDS = 2.0
POLL = 0.05  # seconds between the polls of a key's state

EXPIRE_SOON = Query[dict[str, object]](
    "expire_soon",
    "Tests: a key expires in a moment.",
    "UPDATE api_keys SET expires_at = now() + interval '1 second' WHERE id = %(id)s",
)


@pytest.fixture
async def cached_client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"api_key_cache_seconds": CACHE_SECONDS}))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://jobcore.test") as c:
            yield c


async def test_a_revoked_key_works_for_at_most_the_cache_time(
    cached_client: httpx.AsyncClient, db: Database
) -> None:
    created = await key_usecases.create_key(db, TENANT, "tests", actor="tests")
    headers = {"Authorization": f"Bearer {created.key}"}
    assert (await enqueue(cached_client, headers)).status_code == 202
    await key_usecases.revoke_key(db, created.record.id, actor="tests")
    revoked_at = time.monotonic()
    # Remembered: the revocation has not reached this process yet.
    assert (await enqueue(cached_client, headers)).status_code == 202
    deadline = revoked_at + CACHE_SECONDS + 5
    while time.monotonic() < deadline:
        response = await cached_client.get("/jobs?limit=1", headers=headers)
        if response.status_code == 401:
            break
        await asyncio.sleep(POLL)
    assert_problem(response, 401, "invalid-api-key")
    assert time.monotonic() - revoked_at >= CACHE_SECONDS * 0.9
    assert (await counts(db))["jobs"] == 2
    assert_problem(await enqueue(cached_client, headers), 401, "invalid-api-key")


async def test_an_expiry_and_an_unknown_key_are_not_remembered(
    cached_client: httpx.AsyncClient, db: Database
) -> None:
    created = await key_usecases.create_key(db, TENANT, "tests", actor="tests")
    headers = {"Authorization": f"Bearer {created.key}"}
    async with db.unit_of_work() as uow:
        await execute(uow, EXPIRE_SOON({"id": created.record.id}))
        await uow.commit()
    assert (await enqueue(cached_client, headers)).status_code == 202
    expiry = datetime.now(UTC) + timedelta(seconds=1)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        response = await cached_client.get("/jobs?limit=1", headers=headers)
        if response.status_code == 401:
            break
        await asyncio.sleep(POLL)
    assert_problem(response, 401, "invalid-api-key")
    # Refused at its expiry (the database's clock against ours: within a cache period).
    assert datetime.now(UTC) - expiry < timedelta(seconds=CACHE_SECONDS)
    unknown = {"Authorization": "Bearer jc_" + "A" * 43}
    for _ in range(2):
        assert_problem(await enqueue(cached_client, unknown), 401, "invalid-api-key")


def test_the_cache_is_bounded() -> None:
    cache = KeyCache(60)
    principal = object()
    for n in range(KeyCache.MAX_KEYS + 1):
        cache.put(str(n), principal, None)  # type: ignore[arg-type]
    assert cache.get("0") is None
    assert cache.get(str(KeyCache.MAX_KEYS)) is principal
