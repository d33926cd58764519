"""Authentication comes first (docs/design.md, invariant 13): a request whose key is made up,
revoked or expired is answered 401 before its body is read, its parameters validated or
its callback URL resolved, so an unauthenticated caller learns nothing from error texts
(not even whether an internal host name resolves); the same key with the right scope
gets the validation errors, which shows each request below would have got them.

A key without the route's scope is answered 403 naming the scope, also before anything
else; unknown, revoked and expired keys get byte-identical answers.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.routing import BaseRoute

from jobcore.access import apikeys
from jobcore.database.gateway import Database, execute
from jobcore.database.sql import Query
from jobcore.execution import completion_webhooks as webhooks
from jobcore.kernel.scopes import Scope
from jobcore.kernel.settings import Settings
from jobcore.usecases import keys as key_usecases
from services.api.app import create_app
from services.api.auth import AuthenticatedRoute
from tests.integration.api.conftest import TENANT
from tests.integration.api.support import assert_problem, counts

JOB = str(uuid.UUID(int=7))
# Everything wrong at once: a bad query (unknown status, negative limit, a non-UUID id,
# run_at and delay together), a body that is not JSON, and a callback URL naming an
# internal host, which a validating route would resolve and refuse naming its address.
BAD_QUERY = {
    "callback_url": "http://db.internal.example:5432/hook",
    "limit": "-3",
    "status": "exploded",
    "max_attempts": "nope",
    "run_at": "yesterday",
    "delay": "-1",
    "wait": "forever",
}
BAD_BODY = b'{"text": unterminated'
# method, path, the scope a key needs for it
ROUTES = [
    ("POST", "/jobs/echo", Scope.ENQUEUE),
    ("POST", "/jobs/no_such_type", Scope.ENQUEUE),
    ("GET", "/jobs", Scope.READ),
    ("GET", f"/jobs/{JOB}", Scope.READ),
    ("GET", "/jobs/not-a-uuid", Scope.READ),
    ("GET", f"/jobs/{JOB}/result", Scope.READ),
    ("GET", f"/jobs/{JOB}/payload", Scope.READ),
    ("GET", f"/jobs/{JOB}/deliveries", Scope.READ),
    ("POST", f"/jobs/{JOB}/cancel", Scope.CANCEL),
    ("POST", "/jobs/not-a-uuid/cancel", Scope.CANCEL),
    ("GET", "/admin/jobs", Scope.ADMIN),
    ("GET", f"/admin/jobs/{JOB}", Scope.ADMIN),
    ("POST", "/admin/jobs/not-a-uuid/cancel", Scope.ADMIN),
    ("POST", f"/admin/jobs/{JOB}/retry", Scope.ADMIN),
    ("GET", "/admin/outbox/quarantined", Scope.ADMIN),
    ("POST", "/admin/outbox/not-a-row/requeue", Scope.ADMIN),
    ("POST", "/admin/outbox/1/discard", Scope.ADMIN),
    ("GET", "/admin/keys", Scope.ADMIN),
]


@pytest.fixture
def resolver_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every host the callback check resolves (the real resolver still answers)."""
    calls: list[str] = []
    real = webhooks.resolve

    async def counting(target: webhooks.CallbackTarget, **kwargs: Any) -> Any:
        calls.append(target.host)
        return await real(target, **kwargs)

    monkeypatch.setattr(webhooks, "resolve", counting)
    return calls


async def hostile(
    client: httpx.AsyncClient, method: str, path: str, key: str | None
) -> httpx.Response:
    headers = {"Content-Type": "application/json", "Idempotency-Key": "\x7f" * 300}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return await client.request(method, path, params=BAD_QUERY, content=BAD_BODY, headers=headers)


async def key_with(db: Database, *scopes: Scope) -> str:
    return (await key_usecases.create_key(db, TENANT, "tests", scopes=scopes, actor="tests")).key


def api_routes(routes: Iterable[BaseRoute]) -> Iterator[APIRoute]:
    """Every APIRoute, also inside included routers (FastAPI keeps those as one route
    each, holding the router it included)."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from api_routes(included.routes)


def test_every_jobs_and_admin_route_authenticates_first(settings: Settings) -> None:
    """A route added under /jobs or /admin without the authenticating route class would
    run FastAPI's validation before (or without) the key check."""
    app = create_app(settings)
    guarded = [
        route for route in api_routes(app.routes) if route.path.startswith(("/jobs", "/admin"))
    ]
    for route in guarded:
        assert isinstance(route, AuthenticatedRoute), route.path
    # path_format: the path without its convertors, as /openapi.json shows it.
    covered = {(method, route.path_format) for route in guarded for method in route.methods}
    assert {
        ("POST", "/jobs/echo"),
        ("POST", "/jobs/{job_type}"),
        ("GET", "/jobs"),
        ("GET", "/jobs/{job_id}"),
        ("GET", "/jobs/{job_id}/result"),
        ("GET", "/jobs/{job_id}/payload"),
        ("GET", "/jobs/{job_id}/deliveries"),
        ("POST", "/jobs/{job_id}/cancel"),
        ("GET", "/admin/jobs"),
        ("GET", "/admin/jobs/{job_id}"),
        ("POST", "/admin/jobs/{job_id}/cancel"),
        ("POST", "/admin/jobs/{job_id}/retry"),
        ("GET", "/admin/outbox/quarantined"),
        ("POST", "/admin/outbox/{row}/requeue"),
        ("POST", "/admin/outbox/{row}/discard"),
        ("GET", "/admin/keys"),
    } <= covered
    assert len(guarded) >= 15


async def test_a_made_up_key_gets_401_whatever_else_the_request_holds(
    api_client: httpx.AsyncClient, db: Database, resolver_calls: list[str]
) -> None:
    made_up = apikeys.generate_key()
    plain = await api_client.get("/jobs", headers={"Authorization": f"Bearer {made_up}"})
    assert_problem(plain, 401, "invalid-api-key")
    for method, path, _ in ROUTES:
        response = await hostile(api_client, method, path, made_up)
        body = assert_problem(response, 401, "invalid-api-key")
        # The same answer as a request with nothing wrong but the key: no field, no host.
        assert response.content == plain.content, (method, path, body)
        assert response.headers["www-authenticate"] == plain.headers["www-authenticate"]
        missing = await hostile(api_client, method, path, None)
        assert_problem(missing, 401, "missing-api-key")
    assert resolver_calls == []
    assert (await counts(db))["jobs"] == 0


async def test_the_same_requests_with_a_valid_key_get_their_validation_errors(
    api_client: httpx.AsyncClient, db: Database, resolver_calls: list[str]
) -> None:
    """The control: what the 401 above hid. Without it, a route that never validated
    (or never resolved) would pass the test above too."""
    key = await key_with(db, *Scope)
    enqueue = await hostile(api_client, "POST", "/jobs/echo", key)
    assert enqueue.status_code in (400, 422), enqueue.text
    listing = await hostile(api_client, "GET", "/jobs", key)
    assert_problem(listing, 422, "invalid-request")
    # With a parseable body the callback URL is checked, and so resolved.
    callback = await api_client.post(
        "/jobs/echo",
        params={"callback_url": BAD_QUERY["callback_url"]},
        json={"text": "a"},
        headers={"Authorization": f"Bearer {key}"},
    )
    assert_problem(callback, 422, "invalid-request")
    # Refused as a callback URL (the refusal names neither the host nor what it resolved to).
    assert "unsafe_callback_url" in callback.text
    assert resolver_calls == ["db.internal.example"]


async def test_unknown_revoked_and_expired_keys_get_the_same_answer(
    api_client: httpx.AsyncClient, db: Database, resolver_calls: list[str]
) -> None:
    revoked = await key_usecases.create_key(db, TENANT, "tests", actor="tests")
    await key_usecases.revoke_key(db, revoked.record.id, actor="tests")
    expired = await key_usecases.create_key(db, TENANT, "tests", actor="tests")
    # A rotation with no overlap: the old key stops at once (its successor is not used).
    await key_usecases.rotate_key(db, expired.record.id, overlap=timedelta(0), actor="tests")
    [shown] = [k for k in await key_usecases.list_keys(db) if k.id == expired.record.id]
    assert shown.state == "expired"
    for method, path, _ in ROUTES:
        answers = [
            await hostile(api_client, method, path, key)
            for key in (apikeys.generate_key(), revoked.key, expired.key)
        ]
        for answer in answers:
            assert_problem(answer, 401, "invalid-api-key")
        assert len({(a.content, a.headers["www-authenticate"]) for a in answers}) == 1
    assert resolver_calls == []


async def test_a_key_without_the_routes_scope_gets_403_naming_it_before_validation(
    api_client: httpx.AsyncClient, db: Database, resolver_calls: list[str]
) -> None:
    keys = {scope: await key_with(db, scope) for scope in Scope}
    for method, path, needed in ROUTES:
        for scope, key in keys.items():
            response = await hostile(api_client, method, path, key)
            if scope is needed:
                assert response.status_code not in (401, 403), (method, path, response.text)
                continue
            body = assert_problem(response, 403, "insufficient-scope")
            assert body["required_scope"] == needed.value, (method, path)
            assert needed.value in body["detail"]
            assert f'scope="{needed.value}"' in response.headers["www-authenticate"]
    # Only the enqueue key reached the enqueue route's callback check (its body is not
    # JSON, so the check never ran): nobody without the scope got that far.
    assert resolver_calls == []
    assert (await counts(db))["jobs"] == 0


ROUTE_STRATEGY = st.sampled_from(ROUTES)
header_values = st.text(
    st.characters(min_codepoint=1, max_codepoint=255, exclude_characters="\r\n"), max_size=200
)
authorizations = st.one_of(
    header_values,
    st.builds(lambda v: f"Bearer {v}", header_values),
    st.builds(lambda v: f"Bearer jc_{v}", st.from_regex(r"\A[A-Za-z0-9_-]{20,128}\Z")),
    st.builds(lambda v: f"bearer {v}", st.just(apikeys.generate_key())),
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(route=ROUTE_STRATEGY, authorization=authorizations)
async def test_arbitrary_authorization_headers_never_get_past_authentication(
    api_client: httpx.AsyncClient,
    resolver_calls: list[str],
    route: tuple[str, str, Scope],
    authorization: str,
) -> None:
    method, path, _ = route
    response = await api_client.request(
        method,
        path,
        params=BAD_QUERY,
        content=BAD_BODY,
        headers=[
            (b"authorization", authorization.encode("latin-1")),
            (b"content-type", b"application/json"),
        ],
    )
    body = assert_problem(response, 401, response.json().get("type", "").rsplit("/", 1)[-1])
    assert body["type"].endswith(("/missing-api-key", "/invalid-api-key"))
    assert set(body) == {"type", "title", "status", "detail"}
    assert resolver_calls == []


EXPIRE_NOW = Query(
    "expire_now",
    "Bring a key's expiry forward to now.",
    "UPDATE jobcore.api_keys SET expires_at = now() WHERE id = %(id)s",
)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    route=ROUTE_STRATEGY,
    scopes=st.sets(st.sampled_from(list(Scope)), min_size=1),
    state=st.sampled_from(["active", "expired", "revoked"]),
    bad_input=st.booleans(),
)
async def test_random_scopes_and_key_states_get_the_answer_their_key_deserves(
    api_client: httpx.AsyncClient,
    db: Database,
    resolver_calls: list[str],
    route: tuple[str, str, Scope],
    scopes: set[Scope],
    state: str,
    bad_input: bool,
) -> None:
    method, path, needed = route
    made = await key_usecases.create_key(db, TENANT, "fuzz", scopes=scopes, actor="tests")
    if state == "expired":
        async with db.unit_of_work() as uow:
            await execute(uow, EXPIRE_NOW({"id": made.record.id}))
            await uow.commit()
    elif state == "revoked":
        await key_usecases.revoke_key(db, made.record.id, actor="tests")
    if bad_input:
        response = await hostile(api_client, method, path, made.key)
    else:
        response = await api_client.request(
            method, path, json={"text": "a"}, headers={"Authorization": f"Bearer {made.key}"}
        )
    if state != "active":
        assert_problem(response, 401, "invalid-api-key")
        assert resolver_calls == []
    elif needed not in scopes:
        body = assert_problem(response, 403, "insufficient-scope")
        assert body["required_scope"] == needed.value
        assert resolver_calls == []
    else:
        assert response.status_code not in (401, 403, 500), response.text
