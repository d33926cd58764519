"""API keys and tenants: no key no access; a key sees only its tenant's jobs."""

from __future__ import annotations

import uuid

import httpx

from jobcore.access import apikeys
from jobcore.database.gateway import Database
from jobcore.usecases import keys as key_usecases
from tests.integration.api.conftest import TENANT
from tests.integration.api.support import assert_problem, counts, enqueue


async def test_job_routes_need_a_key(api_client: httpx.AsyncClient, db: Database) -> None:
    job = f"/jobs/{uuid.uuid4()}"
    requests = [
        ("POST", "/jobs/echo"),
        ("POST", "/jobs/unknown_type"),
        ("GET", "/jobs"),
        ("GET", job),
        ("GET", f"{job}/result"),
        ("POST", f"{job}/cancel"),
    ]
    for method, path in requests:
        response = await api_client.request(method, path, json={"text": "a"})
        assert_problem(response, 401, "missing-api-key")
        assert response.headers["www-authenticate"].startswith("Bearer")
    for header in ("Basic dXNlcjpwYXNz", "Bearer", "jc_abc", ""):
        response = await api_client.get("/jobs", headers={"Authorization": header})
        assert_problem(response, 401, "missing-api-key")
    assert (await counts(db))["jobs"] == 0


async def test_bad_and_revoked_keys_are_401(
    api_client: httpx.AsyncClient, api_key: str, db: Database
) -> None:
    for key in ("jc_" + "A" * 43, "not-a-key", api_key + "x", api_key[:-1], "jc_" + "é" * 30):
        response = await api_client.get(
            "/jobs", headers=[(b"Authorization", f"Bearer {key}".encode())]
        )
        body = assert_problem(response, 401, "invalid-api-key")
        assert 'error="invalid_token"' in response.headers["www-authenticate"]
        assert key not in response.text
        assert key not in body["detail"]

    headers = {"Authorization": f"Bearer {api_key}"}
    assert (await api_client.get("/jobs", headers=headers)).status_code == 200
    [record] = [k for k in await key_usecases.list_keys(db, TENANT) if api_key.startswith(k.prefix)]
    await key_usecases.revoke_key(db, record.id, actor="tests")
    # Looked up per request: the very next request is refused.
    assert_problem(await api_client.get("/jobs", headers=headers), 401, "invalid-api-key")
    assert_problem(await enqueue(api_client, headers), 401, "invalid-api-key")
    assert (await counts(db))["jobs"] == 0


async def test_keys_are_stored_as_hashes_and_listed_without_them(
    db: Database, api_key: str
) -> None:
    created = await key_usecases.create_key(db, "initech", "ci", actor="tests")
    assert created.key.startswith("jc_")
    assert len(created.key) >= 40
    assert created.key != api_key
    async with db.connection() as conn:
        cur = await conn.execute("SELECT * FROM api_keys")
        rows = await cur.fetchall()
    stored = repr(rows)
    assert created.key not in stored
    assert api_key not in stored
    assert apikeys.hash_key(created.key) in stored
    listed = await key_usecases.list_keys(db)
    assert {k.tenant for k in listed} == {TENANT, "initech"}
    assert created.key not in repr(listed)
    assert [k.prefix for k in listed if k.tenant == "initech"] == [created.key[:11]]


async def test_another_tenants_job_is_indistinguishable_from_a_missing_one(
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    other_auth: dict[str, str],
    db: Database,
) -> None:
    theirs = (await enqueue(api_client, other_auth, params={"entity_id": "shared"})).json()
    mine = (await enqueue(api_client, auth, params={"entity_id": "shared"})).json()
    missing = str(uuid.uuid4())
    for suffix, method in (("", "GET"), ("/result", "GET"), ("/cancel", "POST")):
        foreign = await api_client.request(
            method, f"/jobs/{theirs['job_id']}{suffix}", headers=auth
        )
        unknown = await api_client.request(method, f"/jobs/{missing}{suffix}", headers=auth)
        assert_problem(foreign, 404, "job-not-found")
        assert foreign.content == unknown.content
        assert foreign.headers == unknown.headers
    # Their job was not cancelled through our key.
    their_view = (await api_client.get(f"/jobs/{theirs['job_id']}", headers=other_auth)).json()
    assert their_view["status"] == "pending"

    for params in ({}, {"entity_id": "shared"}):
        listed = (await api_client.get("/jobs", headers=auth, params=params)).json()
        assert [j["id"] for j in listed["items"]] == [mine["job_id"]]
