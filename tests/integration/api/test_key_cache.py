"""JOBCORE_API_KEY_CACHE_SECONDS: an API process remembers verified keys for that long.

Off by default (every request looks its key up, so a revocation takes effect at once:
test_tenants.py). On, a revoked key keeps reading on the process for at most that long,
an expired one stops at its expiry, and an unknown key is always looked up. Enqueues stop
at once either way: the enqueue statement checks the key (test_enqueue_key_memory.py). The cache
is long enough that a loaded machine cannot make the remembered request miss it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from jobcore.access.apikeys import Principal
from jobcore.database.gateway import Database
from jobcore.kernel.scopes import Scope
from jobcore.kernel.settings import Settings
from jobcore.usecases import keys as key_usecases
from services.api.app import create_app
from services.api.auth import KeyCache
from tests.integration.api.conftest import TENANT
from tests.integration.api.support import assert_problem, counts, enqueue

CACHE_SECONDS = 10.0
POLL = 0.05  # seconds between the polls of a key's state


@pytest.fixture
async def cached_client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"api_key_cache_seconds": CACHE_SECONDS}))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://jobcore.test") as c:
            yield c


async def test_a_revoked_key_reads_for_at_most_the_cache_time_and_enqueues_no_more(
    cached_client: httpx.AsyncClient, db: Database
) -> None:
    created = await key_usecases.create_key(db, TENANT, "tests", actor="tests")
    headers = {"Authorization": f"Bearer {created.key}"}
    started = time.monotonic()
    assert (await enqueue(cached_client, headers)).status_code == 202
    assert (await cached_client.get("/jobs?limit=1", headers=headers)).status_code == 200
    await key_usecases.revoke_key(db, created.record.id, actor="tests")
    # The enqueue statement checks the key itself: refused at once, nothing written.
    assert_problem(await enqueue(cached_client, headers), 401, "invalid-api-key")
    # Remembered for reads: the revocation has not reached this process yet.
    assert (await cached_client.get("/jobs?limit=1", headers=headers)).status_code == 200
    deadline = started + CACHE_SECONDS + 30
    while time.monotonic() < deadline:
        response = await cached_client.get("/jobs?limit=1", headers=headers)
        if response.status_code == 401:
            break
        await asyncio.sleep(POLL)
    assert_problem(response, 401, "invalid-api-key")
    # Not before the key, remembered after the first request, was due to be looked up.
    assert time.monotonic() - started >= CACHE_SECONDS
    assert_problem(await enqueue(cached_client, headers), 401, "invalid-api-key")
    assert (await counts(db))["jobs"] == 1


async def test_an_unknown_key_is_never_remembered(cached_client: httpx.AsyncClient) -> None:
    unknown = {"Authorization": "Bearer jc_" + "A" * 43}
    for _ in range(2):
        assert_problem(await enqueue(cached_client, unknown), 401, "invalid-api-key")


def test_an_expired_key_is_forgotten_at_its_expiry() -> None:
    cache = KeyCache(60)
    principal = Principal(uuid.uuid4(), TENANT, frozenset({Scope.ENQUEUE}))
    now = datetime.now(UTC)
    cache.put("expired", principal, now - timedelta(seconds=1))
    cache.put("later", principal, now + timedelta(hours=1))
    cache.put("never", principal, None)
    assert cache.get("expired") is None
    assert cache.get("later") is principal
    assert cache.get("never") is principal
    no_time = KeyCache(0.0)
    no_time.put("never", principal, None)
    assert no_time.get("never") is None


def test_the_cache_is_bounded() -> None:
    cache = KeyCache(60)
    principal = Principal(uuid.uuid4(), TENANT, frozenset({Scope.ENQUEUE}))
    for n in range(KeyCache.MAX_KEYS + 1):
        cache.put(str(n), principal, None)
    assert cache.get("0") is None
    assert cache.get(str(KeyCache.MAX_KEYS)) is principal
