"""Bad input is answered with problem JSON and a 4xx, never a 500, and writes nothing.

The client raises on any unhandled exception in the app (httpx's ASGITransport default),
so reaching the catch-all 500 handler would fail these tests; the metric of 500s is
checked as well.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobcore.database.gateway import Database
from services.api import problems
from tests.integration.api.support import assert_problem, counts

LIMIT = 256 * 1024  # the default JOBCORE_MAX_BODY_BYTES


def post(client: httpx.AsyncClient, auth: dict[str, str], **kwargs: object) -> object:
    headers = {**auth, **kwargs.pop("headers", {})}  # type: ignore[dict-item]
    return client.post("/jobs/echo", headers=headers, **kwargs)  # type: ignore[arg-type]


async def test_malformed_bodies_are_400(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    json_type = {"Content-Type": "application/json"}
    bodies = [
        b"",
        b"{",
        b'{"text": "a",}',
        b'{"text": "\xff\xfe"}',  # not UTF-8
        b'{"text": "\\ud800"}',  # a lone surrogate
        b"NaN",
        b"[" * 5000 + b"]" * 5000,  # deeper than the parser allows
        b'{"text": "a"} trailing',
    ]
    for body in bodies:
        response = await api_client.post("/jobs/echo", content=body, headers={**auth, **json_type})
        assert_problem(response, 400, "malformed-json")
    assert (await counts(db))["jobs"] == 0


async def test_wrong_content_type_is_415(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    for content_type in (None, "text/plain", "application/x-www-form-urlencoded", "json"):
        headers = dict(auth)
        if content_type:
            headers["Content-Type"] = content_type
        response = await api_client.post("/jobs/echo", content=b'{"text": "a"}', headers=headers)
        assert_problem(response, 415, "unsupported-media-type")
    for accepted in ("application/json; charset=utf-8", "APPLICATION/JSON", "application/x+json"):
        response = await api_client.post(
            "/jobs/echo", content=b'{"text": "a"}', headers={**auth, "Content-Type": accepted}
        )
        assert response.status_code == 202, (accepted, response.text)


async def test_oversized_bodies_are_413_whatever_the_client_declares(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    json_type = {**auth, "Content-Type": "application/json"}
    big = b'{"text": "' + b"a" * LIMIT + b'"}'
    declared = await api_client.post("/jobs/echo", content=big, headers=json_type)
    assert_problem(declared, 413, "body-too-large")

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"text": "'
        for _ in range(LIMIT // 1024 + 1):
            yield b"a" * 1024
        yield b'"}'

    # Chunked, no Content-Length: counted while it streams in.
    streamed = await api_client.post("/jobs/echo", content=chunks(), headers=json_type)
    assert "content-length" not in streamed.request.headers
    assert_problem(streamed, 413, "body-too-large")

    # A Content-Length that lies about the size.
    lying = httpx.Request(
        "POST",
        "http://jobcore.test/jobs/echo",
        content=big,
        headers={**json_type, "Content-Length": "20"},
    )
    assert_problem(await api_client.send(lying), 413, "body-too-large")

    bad_length = httpx.Request(
        "POST",
        "http://jobcore.test/jobs/echo",
        content=b'{"text": "a"}',
        headers={**json_type, "Content-Length": "-1"},
    )
    assert (await api_client.send(bad_length)).status_code == 400
    assert (await counts(db))["jobs"] == 0


async def test_values_the_database_cannot_store_are_422(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    response = await api_client.post("/jobs/echo", json={"text": "a\x00b"}, headers=auth)
    body = assert_problem(response, 422, "invalid-payload")
    assert body["errors"][0]["loc"] == ["body", "text"]
    assert (await counts(db))["jobs"] == 0


async def test_unknown_paths_and_methods_are_problem_json(
    api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    assert_problem(await api_client.get("/nowhere", headers=auth), 404, "not-found")
    response = await api_client.delete("/jobs", headers=auth)
    assert_problem(response, 405, "method-not-allowed")
    assert response.headers["allow"] == "GET"
    response = await api_client.put("/jobs/echo", headers=auth, json={})
    assert_problem(response, 405, "method-not-allowed")


async def test_a_405_allows_exactly_the_methods_of_its_path(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    """/jobs/{job_id} (GET, PATCH) and /jobs/{type} (POST) share one segment: each path lists
    its own methods only, whatever the route order (OPTIONS answered Allow: POST for a
    job, from the enqueue catch-all)."""
    job = str(uuid.uuid4())
    for method, path, allowed in [
        ("OPTIONS", f"/jobs/{job}", "GET, PATCH"),
        ("POST", f"/jobs/{job}", "GET, PATCH"),
        ("DELETE", f"/jobs/{job}", "GET, PATCH"),
        ("OPTIONS", "/jobs/echo", "POST"),
        ("GET", "/jobs/echo", "POST"),
        ("OPTIONS", "/jobs", "GET"),
        ("OPTIONS", f"/jobs/{job}/cancel", "POST"),
        ("PUT", f"/jobs/{job}/result", "GET"),
        # Matched by both: an unregistered type for POST, a malformed id for GET.
        ("OPTIONS", "/jobs/Not_A_Type", "GET, PATCH, POST"),
    ]:
        response = await api_client.request(method, path, headers=auth)
        assert_problem(response, 405, "method-not-allowed")
        assert response.headers["allow"] == allowed, (method, path)
    # A malformed id is still the job route's (authenticated, then 422), and any other
    # name an unknown type.
    response = await api_client.get("/jobs/not-a-uuid", headers=auth)
    assert_problem(response, 422, "invalid-request")
    response = await api_client.post("/jobs/Not_A_Type", headers=auth, json={})
    assert_problem(response, 404, "unknown-job-type")
    assert (await counts(db))["jobs"] == 0


async def test_a_405_lists_every_route_on_a_shared_path() -> None:
    """Starlette names only the first route whose path matched."""
    app = FastAPI()
    problems.install(app)

    @app.get("/things/{name}")
    async def read(name: str) -> None: ...

    @app.put("/things/{name}")
    async def replace(name: str) -> None: ...

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://jobcore.test"
    ) as client:
        response = await client.delete("/things/a")
    assert_problem(response, 405, "method-not-allowed")
    assert response.headers["allow"] == "GET, PUT"


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
_header_text = st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=300)


@settings(
    max_examples=150,
    deadline=None,
    # One app and database for all examples is the point: they must not disturb each other.
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    job_type=st.sampled_from(["echo", "noop", "missing"]),
    body=st.one_of(_json.map(lambda v: httpx.Request("POST", "/", json=v).read()), st.binary()),
    content_type=st.sampled_from(["application/json", "text/plain", "application/x+json"]),
    idempotency_key=st.none() | _header_text,
    params=st.dictionaries(
        st.sampled_from(["entity_id", "max_attempts", "run_at", "delay", "x"]),
        st.text(max_size=40),
        max_size=3,
    ),
)
async def test_arbitrary_requests_never_fail_the_server(
    api_client: httpx.AsyncClient,
    api_app: FastAPI,
    auth: dict[str, str],
    job_type: str,
    body: bytes,
    content_type: str,
    idempotency_key: str | None,
    params: dict[str, str],
) -> None:
    headers = {**auth, "Content-Type": content_type}
    raw_headers = [(k.encode(), v.encode()) for k, v in headers.items()]
    if idempotency_key is not None:
        raw_headers.append((b"Idempotency-Key", idempotency_key.encode("latin-1")))
    response = await api_client.post(
        f"/jobs/{job_type}", content=body, headers=raw_headers, params=params
    )
    assert response.status_code in (202, 400, 404, 413, 415, 422), response.text
    if response.status_code != 202:
        assert response.headers["content-type"] == "application/problem+json"
    metrics = (await api_client.get("/metrics")).text
    assert "jobcore_api_internal_errors_total 0.0" in metrics
