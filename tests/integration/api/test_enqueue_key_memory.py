"""``POST /jobs/{type}`` remembers the keys it verified (services.api.routes.enqueue), so
a key in steady use costs no lookup, and its enqueue statement checks the key by id, so
a revocation or an expiry stops enqueues at once all the same, writing nothing."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI

from jobcore.access import apikeys
from jobcore.access.apikeys import CreatedKey
from jobcore.database.gateway import Database, execute
from jobcore.database.sql import Query
from jobcore.usecases import keys as key_usecases
from services.api import callbacks
from services.api.auth import KeyCache
from tests.integration.api.conftest import TENANT
from tests.integration.api.support import assert_problem, counts, enqueue

# The test's own change of a key's expiry, behind the memory's back.
_EXPIRE_NOW = Query[dict[str, str]](
    "test_expire_key",
    "Expire a key a moment ago.",
    "UPDATE api_keys SET expires_at = now() - interval '1 second' WHERE id = %(id)s::uuid",
)


def memory(app: FastAPI) -> KeyCache:
    remembered: KeyCache = app.state.api.enqueue_keys
    return remembered


async def remembered_key(
    client: httpx.AsyncClient, db: Database
) -> tuple[CreatedKey, dict[str, str]]:
    """A new key of TENANT that has enqueued once (so the route remembers it)."""
    created = await key_usecases.create_key(db, TENANT, "tests", actor="tests")
    headers = {"Authorization": f"Bearer {created.key}"}
    assert (await enqueue(client, headers)).status_code == 202
    return created, headers


async def test_a_remembered_key_enqueues_without_a_lookup(
    api_app: FastAPI, api_client: httpx.AsyncClient, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    created = await key_usecases.create_key(db, TENANT, "tests", actor="tests")
    headers = {"Authorization": f"Bearer {created.key}"}
    lookups: list[str] = []
    real_lookup = apikeys.authenticate_hash_until

    async def counted(session: object, key_hash: str) -> object:
        lookups.append(key_hash)
        return await real_lookup(session, key_hash)  # type: ignore[arg-type]

    monkeypatch.setattr(apikeys, "authenticate_hash_until", counted)
    for _ in range(3):
        assert (await enqueue(api_client, headers)).status_code == 202
    assert lookups == [apikeys.hash_key(created.key)]
    assert memory(api_app).get(apikeys.hash_key(created.key)) is not None
    # Reads are not remembered without JOBCORE_API_KEY_CACHE_SECONDS: looked up each time.
    assert (await api_client.get("/jobs?limit=1", headers=headers)).status_code == 200
    assert len(lookups) == 2


async def test_a_remembered_key_revoked_enqueues_no_more_at_once(
    api_app: FastAPI, api_client: httpx.AsyncClient, db: Database
) -> None:
    created, headers = await remembered_key(api_client, db)
    assert memory(api_app).get(apikeys.hash_key(created.key)) is not None
    await key_usecases.revoke_key(db, created.record.id, actor="tests")
    assert_problem(await enqueue(api_client, headers), 401, "invalid-api-key")
    # Forgotten: the next request looks the key up (and is refused there).
    assert memory(api_app).get(apikeys.hash_key(created.key)) is None
    assert_problem(await enqueue(api_client, headers), 401, "invalid-api-key")
    assert (await counts(db))["jobs"] == 1


async def test_a_remembered_key_expired_enqueues_no_more_at_once(
    api_app: FastAPI, api_client: httpx.AsyncClient, db: Database
) -> None:
    created, headers = await remembered_key(api_client, db)
    # The memory still holds the key as never expiring: only the statement can refuse it.
    async with db.session() as session:
        await execute(session, _EXPIRE_NOW({"id": str(created.record.id)}))
    assert memory(api_app).get(apikeys.hash_key(created.key)) is not None
    assert_problem(await enqueue(api_client, headers), 401, "invalid-api-key")
    assert (await counts(db))["jobs"] == 1


async def test_a_replay_with_a_revoked_key_is_refused(
    api_client: httpx.AsyncClient, db: Database
) -> None:
    created = await key_usecases.create_key(db, TENANT, "tests", actor="tests")
    headers = {"Authorization": f"Bearer {created.key}", "Idempotency-Key": "once"}
    assert (await enqueue(api_client, headers)).status_code == 202
    await key_usecases.revoke_key(db, created.record.id, actor="tests")
    assert_problem(await enqueue(api_client, headers), 401, "invalid-api-key")


async def test_a_remembered_key_revoked_learns_nothing_of_its_request(
    api_client: httpx.AsyncClient, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad body, a bad parameter or a callback URL: each makes the route look the key up
    before it answers or resolves anything, so a revoked key gets its 401 (invariant 13)."""
    created, headers = await remembered_key(api_client, db)
    await key_usecases.revoke_key(db, created.record.id, actor="tests")
    resolved: list[str] = []

    async def spy(url: str, allowed: object) -> None:
        resolved.append(url)

    monkeypatch.setattr(callbacks, "check_callback_url", spy)
    for response in (
        await enqueue(api_client, headers, payload={"text": 5}),
        await enqueue(api_client, headers, params={"max_attempts": "0"}),
        await enqueue(api_client, headers, params={"callback_url": "https://example.com/h"}),
    ):
        assert_problem(response, 401, "invalid-api-key")
    assert resolved == []
    assert (await counts(db))["jobs"] == 1
