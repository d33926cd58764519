"""Property tests of everything the HTTP API parses: whatever arrives, the answer is never a
500, and every error is problem JSON.

The API's own property test (tests/integration/api/test_bad_input.py) sends arbitrary
bodies, content types, printable Idempotency-Keys and query strings to the enqueue routes.
These go further: arbitrary header names and values (control characters, non-ASCII bytes,
Authorization garbage), every job type with payloads shaped like its own, the reading
routes with arbitrary ids, filters and cursors — including cursors that decode (valid
base64 of valid JSON) but hold nonsense, which get past the outer checks.

The client raises on an unhandled error in the app (httpx's ASGITransport default), so a
passing run also shows no input reached the catch-all 500 handler; the metric of
internal errors is checked as well.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any
from urllib.parse import quote

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PROBLEM = "application/problem+json"
EXAMPLES = settings(
    max_examples=120,
    deadline=None,
    # One app and database for all examples is the point: they must not disturb each other.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=50),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=15,
)

# Payloads shaped like each type's own model (right keys, any values), so validation,
# not the parser, is what gets exercised.
payloads = st.one_of(
    st.tuples(
        st.just("echo"),
        st.fixed_dictionaries({"text": json_values}, optional={"count": json_values}),
    ),
    st.tuples(
        st.just("effect"),
        st.fixed_dictionaries({}, optional={"n": json_values, "seconds": json_values}),
    ),
    st.tuples(
        st.just("export_csv"),
        st.fixed_dictionaries(
            {}, optional={"rows": json_values, "columns": json_values, "seed": json_values}
        ),
    ),
    st.tuples(
        st.just("send_email"),
        st.fixed_dictionaries(
            {"to": st.emails() | json_values, "subject": json_values},
            optional={"body": json_values},
        ),
    ),
    st.tuples(st.just("noop"), st.dictionaries(st.text(max_size=5), json_values, max_size=2)),
)

# Bytes a header value can carry on the wire (HTTP forbids CR, LF and NUL; httpx refuses
# them), as latin-1 text.
header_values = st.text(
    st.characters(min_codepoint=1, max_codepoint=255, exclude_characters="\r\n"), max_size=300
)
header_names = st.from_regex(r"\A[A-Za-z0-9!#$%&'*+.^_`|~-]{1,40}\Z")


def assert_no_server_error(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.headers["content-type"] == PROBLEM, response.headers
        body = response.json()
        assert body["status"] == response.status_code
        assert body["type"].startswith("https://jobcore.dev/problems/")


async def no_internal_errors(client: httpx.AsyncClient) -> None:
    metrics = (await client.get("/metrics")).text
    assert "jobcore_api_internal_errors_total 0.0" in metrics


@EXAMPLES
@given(
    job_and_payload=payloads,
    extra_headers=st.lists(st.tuples(header_names, header_values), max_size=4),
)
async def test_payloads_shaped_like_each_type_and_arbitrary_headers(
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    job_and_payload: tuple[str, Any],
    extra_headers: list[tuple[str, str]],
) -> None:
    job_type, payload = job_and_payload
    headers = [(b"content-type", b"application/json")]
    headers += [(name.encode(), value.encode("latin-1")) for name, value in extra_headers]
    # Our own Authorization last, so a generated one cannot stand in for it... unless the
    # generated set holds a second one, which must then not crash the server either.
    headers.append((b"authorization", auth["Authorization"].encode()))
    response = await api_client.post(
        f"/jobs/{job_type}", content=json.dumps(payload).encode(), headers=headers
    )
    assert response.status_code in (202, 400, 401, 413, 415, 422), response.text
    assert_no_server_error(response)
    await no_internal_errors(api_client)


@EXAMPLES
@given(
    authorization=header_values,
    method_and_path=st.sampled_from(
        [
            ("GET", "/jobs"),
            ("POST", "/jobs/echo"),
            ("GET", f"/jobs/{uuid.UUID(int=1)}"),
            ("POST", f"/jobs/{uuid.UUID(int=1)}/cancel"),
            ("GET", f"/jobs/{uuid.UUID(int=1)}/result"),
        ]
    ),
)
async def test_arbitrary_authorization_headers_are_401(
    api_client: httpx.AsyncClient, authorization: str, method_and_path: tuple[str, str]
) -> None:
    method, path = method_and_path
    response = await api_client.request(
        method,
        path,
        content=b'{"text": "a"}',
        headers=[
            (b"authorization", authorization.encode("latin-1")),
            (b"content-type", b"application/json"),
        ],
    )
    assert response.status_code == 401, response.text
    assert_no_server_error(response)
    # Whatever was sent as a key is not echoed back: the answer is one of the two fixed
    # ones (no key, a key that is not valid). A substring check alone fails on values that
    # happen to be part of the fixed text ("Authoriza" is in "Authorization: Bearer").
    fixed = [
        (
            await api_client.request(
                method,
                path,
                content=b'{"text": "a"}',
                headers={"content-type": "application/json", **key},
            )
        ).json()
        for key in ({}, {"authorization": "Bearer jc_" + "x" * 43})
    ]
    assert [body["status"] for body in fixed] == [401, 401]
    assert response.json() in fixed


def _cursor(raw: object) -> str:
    # json, not orjson: the generated values include integers beyond 64 bits.
    return base64.urlsafe_b64encode(json.dumps(raw).encode()).rstrip(b"=").decode()


# Cursors that decode: a version, a timestamp and an id, each possibly wrong.
structured_cursors = st.builds(
    lambda version, when, ident: _cursor([version, when, ident]),
    st.integers(-2, 3) | json_values,
    st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat())
    | st.datetimes().map(lambda d: d.isoformat())
    | st.text(max_size=40),
    st.uuids().map(str) | st.text(max_size=40) | json_values,
)
cursors = structured_cursors | st.text(max_size=250) | json_values.map(_cursor)
statuses = st.sampled_from(["pending", "running", "succeeded", "failed", "cancelled"]) | st.text(
    max_size=20
)


@EXAMPLES
@given(
    params=st.fixed_dictionaries(
        {},
        optional={
            "cursor": cursors,
            "status": statuses,
            "type": st.sampled_from(["echo", "effect"]) | st.text(max_size=70),
            "entity_id": st.text(max_size=300),
            "limit": st.integers(-5, 300).map(str) | st.text(max_size=5),
        },
    )
)
async def test_listing_with_arbitrary_filters_and_cursors(
    api_client: httpx.AsyncClient, auth: dict[str, str], params: dict[str, str]
) -> None:
    response = await api_client.get("/jobs", params=params, headers=auth)
    assert response.status_code in (200, 400, 422), response.text
    assert_no_server_error(response)
    if response.status_code == 200:
        assert response.json()["items"] == []  # this tenant has no jobs
    await no_internal_errors(api_client)


@EXAMPLES
@given(
    job_id=st.uuids().map(str) | st.text(min_size=1, max_size=80),
    suffix=st.sampled_from(["", "/result", "/cancel"]),
)
async def test_reading_and_cancelling_arbitrary_job_ids(
    api_client: httpx.AsyncClient, auth: dict[str, str], job_id: str, suffix: str
) -> None:
    method = "POST" if suffix == "/cancel" else "GET"
    response = await api_client.request(
        method, f"/jobs/{quote(job_id, safe='')}{suffix}", headers=auth
    )
    # 307: an id that decodes to a path ending in "/" is redirected (FastAPI's redirect_slashes).
    assert response.status_code in (200, 307, 404, 405, 422), response.text
    assert_no_server_error(response)
    await no_internal_errors(api_client)
