"""The console over plain HTTP (in-process, httpx over ASGI, on the test's database):
who may sign in, the session cookie, the CSRF and Origin checks, an action audited with
the session's actor, and no key (nor its hash) in any page or log line."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from jobcore.access import apikeys
from jobcore.database.gateway import Database, fetch_all
from jobcore.database.sql.audit_log import AUDIT_LOG_LIST
from jobcore.kernel.scopes import Scope
from jobcore.kernel.settings import Settings
from jobcore.usecases import keys as key_usecases
from services.ui.app import SIGN_IN_REFUSED, create_app
from services.ui.sessions import COOKIE_NAME

BASE = "http://console.test"
ORIGIN = {"Origin": BASE}
HTML = {"Accept": "text/html"}


@pytest.fixture
async def console_app(settings: Settings) -> AsyncIterator[FastAPI]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        yield app


@pytest.fixture
async def client(console_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(console_app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as http:
        yield http


@pytest.fixture
async def admin_key(db: Database) -> str:
    created = await key_usecases.create_key(
        db, "ops", "operators", scopes=[Scope.ADMIN], actor="tests"
    )
    return created.key


async def sign_in(client: httpx.AsyncClient, key: str) -> httpx.Response:
    return await client.post("/login", data={"key": key}, headers={**ORIGIN, **HTML})


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "no CSRF field on the page"
    return found.group(1)


async def test_a_tenant_key_and_a_made_up_key_get_the_same_refusal(
    client: httpx.AsyncClient, db: Database, admin_key: str
) -> None:
    tenant_key = (await key_usecases.create_key(db, "acme", "client", actor="tests")).key
    refusals = [await sign_in(client, key) for key in (tenant_key, apikeys.generate_key(), "x")]
    assert [r.status_code for r in refusals] == [401, 401, 401]
    assert len({r.text for r in refusals}) == 1, "the answers tell the keys apart"
    assert SIGN_IN_REFUSED in refusals[0].text
    assert all(COOKIE_NAME not in r.headers.get("set-cookie", "") for r in refusals)
    assert tenant_key not in refusals[0].text
    # Refused keys reach no page.
    assert (await client.get("/jobs", headers=HTML)).headers["location"].endswith("/login")
    # An admin key signs in.
    assert (await sign_in(client, admin_key)).status_code == 303


async def test_the_session_cookie_is_httponly_strict_expiring_and_opaque(
    client: httpx.AsyncClient, admin_key: str
) -> None:
    answer = await sign_in(client, admin_key)
    assert answer.status_code == 303
    cookie = answer.headers["set-cookie"]
    flags = [part.strip().lower() for part in cookie.split(";")]
    assert "httponly" in flags
    assert "samesite=strict" in flags
    assert any(f.startswith("max-age=") and int(f.split("=")[1]) > 0 for f in flags)
    session_id = cookie.split(";")[0].split("=", 1)[1]
    assert admin_key not in cookie
    assert apikeys.hash_key(admin_key) not in cookie
    assert len(session_id) >= 40
    page = await client.get("/", headers=HTML)
    assert page.status_code == 200
    assert "Overview" in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    # Signing out ends the session on the server: the old cookie reaches nothing.
    out = await client.post(
        "/logout", data={"csrf": csrf_of(page.text)}, headers={**ORIGIN, **HTML}
    )
    assert out.status_code == 303
    client.cookies.set(COOKIE_NAME, session_id)
    assert (await client.get("/", headers=HTML)).status_code == 303


async def test_a_post_without_the_form_token_or_from_another_origin_is_refused(
    client: httpx.AsyncClient, db: Database, admin_key: str
) -> None:
    await sign_in(client, admin_key)
    job_id = uuid.uuid4()
    page = await client.get("/jobs", headers=HTML)
    token = csrf_of(page.text)

    missing = await client.post(f"/jobs/{job_id}/cancel", data={}, headers=ORIGIN)
    assert missing.status_code == 403
    assert missing.headers["content-type"] == "application/problem+json"
    wrong = await client.post(f"/jobs/{job_id}/cancel", data={"csrf": "x" * 43}, headers=ORIGIN)
    assert wrong.status_code == 403
    elsewhere = await client.post(
        f"/jobs/{job_id}/cancel", data={"csrf": token}, headers={"Origin": "http://evil.test"}
    )
    assert elsewhere.status_code == 403
    no_origin = await client.post(f"/jobs/{job_id}/cancel", data={"csrf": token})
    assert no_origin.status_code == 403
    login_elsewhere = await client.post(
        "/login", data={"key": admin_key}, headers={"Origin": "http://evil.test"}
    )
    assert login_elsewhere.status_code == 403
    # None of them reached the use case: nothing audited.
    assert not await audit_entries(db, "job.cancel")

    # With both, the action runs (refused here: no such job) and is audited as the key.
    done = await client.post(f"/jobs/{job_id}/cancel", data={"csrf": token}, headers=ORIGIN)
    assert done.status_code == 303
    shown = await client.get(done.headers["location"].removeprefix(BASE), headers=HTML)
    assert shown.status_code == 404
    [entry] = await audit_entries(db, "job.cancel")
    key_id = (await key_usecases.list_keys(db, "ops"))[0].id
    assert entry["actor"] == f"ui:key:{key_id}"
    assert entry["outcome"] == "refused"


async def test_no_key_or_hash_in_pages_or_log_lines(
    client: httpx.AsyncClient, db: Database, admin_key: str, caplog: pytest.LogCaptureFixture
) -> None:
    tenant_key = (await key_usecases.create_key(db, "acme", "client", actor="tests")).key
    caplog.set_level(logging.DEBUG)
    answers = [await sign_in(client, tenant_key), await sign_in(client, admin_key)]
    for path in ("/", "/overview/live", "/jobs", "/outbox", "/dlq", "/webhooks", "/tenants"):
        answer = await client.get(path, headers=HTML)
        assert answer.status_code == 200, (path, answer.text[:500])
        answers.append(answer)
    secrets = [admin_key, tenant_key, apikeys.hash_key(admin_key), apikeys.hash_key(tenant_key)]
    logged = "\n".join(f"{r.getMessage()} {r.__dict__}" for r in caplog.records)
    assert "console sign-in" in logged
    for secret in secrets:
        assert secret not in logged
        for answer in answers:
            assert secret not in answer.text
            assert secret not in str(answer.headers)
    # The keys page shows each key's prefix only.
    tenants = answers[-1].text
    assert admin_key[: apikeys.DISPLAY_PREFIX_LENGTH] in tenants


async def audit_entries(db: Database, action: str) -> list[dict[str, object]]:
    async with db.session() as session:
        rows = await fetch_all(
            session,
            AUDIT_LOG_LIST(
                {"action": action, "actor": None, "tenant": None, "since": None, "limit": 10}
            ),
        )
    return [dict(r) for r in rows]
