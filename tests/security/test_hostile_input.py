"""Hostile input, case by case: never a 500, always problem JSON, nothing half written.

Extends the API's own bad-input tests (tests/integration/api/test_bad_input.py covers
malformed, oversized and mistyped bodies, NUL characters, 5000-deep nesting; the
idempotency, reading and enqueue tests cover the 255-character key limit, garbage cursors
and unknown type names) with what an attacker tries next: nesting around the parser's own
limit, very wide documents just under the size limit, invalid UTF-8 in the path, query and
headers, SQL-looking strings in every field (stored verbatim, never executed), megabyte
idempotency keys, and cursors that decode but point nowhere sensible.
"""

from __future__ import annotations

import base64
import uuid

import httpx
import orjson

from jobcore.database.gateway import Database
from tests.integration.api.support import assert_problem, counts, enqueue

PROBLEM = "application/problem+json"

SQL_LOOKING = [
    "'; DROP TABLE jobcore.jobs; --",
    "' OR '1'='1",
    '" OR ""="',
    "1); DELETE FROM jobcore.outbox WHERE (1=1",
    "$$; TRUNCATE jobcore.api_keys; $$",
    "\\'; SELECT pg_sleep(10); --",
    "%' UNION SELECT key_hash, tenant FROM jobcore.api_keys --",
]


def assert_client_error(response: httpx.Response, *statuses: int) -> None:
    assert response.status_code in statuses, response.text
    assert response.headers["content-type"] == PROBLEM, response.headers


async def test_nesting_around_the_parsers_limit_is_a_client_error(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    json_type = {**auth, "Content-Type": "application/json"}
    for depth in (64, 500, 1023, 1024, 1025, 20_000):
        for opening, closing in ((b"[", b"]"), (b'{"a":', b"}")):
            inner = opening * depth + b"1" + closing * depth
            body = b'{"text": "a", "count": 1, "extra": ' + inner + b"}"
            response = await api_client.post("/jobs/echo", content=body, headers=json_type)
            # Parsed and refused by the model (422), or refused by the parser (400).
            assert_client_error(response, 400, 422)
            as_payload = await api_client.post("/jobs/echo", content=inner, headers=json_type)
            assert_client_error(as_payload, 400, 422)
    assert (await counts(db))["jobs"] == 0


async def test_wide_documents_under_the_size_limit_are_refused_without_echoing_values(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    json_type = {**auth, "Content-Type": "application/json"}
    wide = {
        "many keys": orjson.dumps({"text": "a", **{f"k{i}": i for i in range(15_000)}}),
        "long array": b'{"text": "a", "count": [' + b"0," * 80_000 + b"0]}",
        "long string": orjson.dumps({"text": "s" * 200_000}),
        "many errors": orjson.dumps([{"text": i} for i in range(10_000)]),
    }
    for name, body in wide.items():
        assert len(body) < 256 * 1024, name
        response = await api_client.post("/jobs/echo", content=body, headers=json_type)
        assert_client_error(response, 422)
        # Errors name locations and say what is wrong, never the values sent.
        assert b"sssssssss" not in response.content
        assert all(set(error) == {"loc", "msg", "type"} for error in response.json()["errors"])
    assert (await counts(db))["jobs"] == 0


async def test_invalid_utf8_in_path_query_headers_and_body(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    json_type = {**auth, "Content-Type": "application/json"}
    raw = "http://jobcore.test"
    in_the_path = [
        httpx.Request("GET", f"{raw}/jobs/%FF%FE", headers=auth),
        httpx.Request("GET", f"{raw}/jobs/%C0%AF/result", headers=auth),
        httpx.Request("POST", f"{raw}/jobs/%ED%A0%80/cancel", headers=auth),
        httpx.Request("POST", f"{raw}/jobs/ech%FF", headers=json_type, content=b"{}"),
        httpx.Request("GET", f"{raw}/jobs?cursor=%C0%AF", headers=auth),
        httpx.Request("GET", f"{raw}/jobs?type=%FF", headers=auth),
    ]
    for request in in_the_path:
        response = await api_client.send(request)
        assert_client_error(response, 400, 404, 422)
    # In a free-text query parameter the bytes arrive as U+FFFD (the server decodes with
    # replacement): valid text, stored and matched as such, never the raw bytes.
    created = await api_client.send(
        httpx.Request(
            "POST", f"{raw}/jobs/echo?entity_id=%ED%A0%80", headers=json_type, json={"text": "a"}
        )
    )
    assert created.status_code == 202, created.text
    view = (await api_client.get(f"/jobs/{created.json()['job_id']}", headers=auth)).json()
    assert set(view["entity_id"]) == {"\ufffd"}
    listed = await api_client.send(
        httpx.Request("GET", f"{raw}/jobs?entity_id=%FF%FE", headers=auth)
    )
    assert listed.status_code == 200

    bodies = [
        b'{"text": "\xc0\xaf"}',  # an overlong encoding of "/"
        b'{"text": "\xed\xa0\x80"}',  # a surrogate encoded as UTF-8
        b'{"text": "\xf4\x90\x80\x80"}',  # beyond U+10FFFF
        b'\xff\xfe{\x00"\x00t\x00"\x00:\x00"\x00a\x00"\x00}\x00',  # UTF-16 with a BOM
        b'{"te\xffxt": "a"}',  # in a key
    ]
    for body in bodies:
        response = await api_client.post("/jobs/echo", content=body, headers=json_type)
        assert_problem(response, 400, "malformed-json")
    for key in (b"\x80\x81", b"caf\xc3\xa9", b"\xff" * 40):
        response = await api_client.post(
            "/jobs/echo",
            json={"text": "a"},
            headers=[(b"authorization", auth["Authorization"].encode()), (b"idempotency-key", key)],
        )
        assert_problem(response, 400, "invalid-idempotency-key")
    assert (await counts(db))["jobs"] == 1  # the one above, with the U+FFFD entity id


async def test_sql_looking_strings_are_stored_verbatim_and_never_executed(
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    other_auth: dict[str, str],
    db: Database,
) -> None:
    theirs = await enqueue(api_client, other_auth, payload={"text": "secret of the other tenant"})
    assert theirs.status_code == 202
    mine: dict[str, str] = {}
    for text in SQL_LOOKING:
        response = await enqueue(
            api_client,
            auth,
            payload={"text": text},
            params={"entity_id": text},
            headers={"Idempotency-Key": text},
        )
        assert response.status_code == 202, response.text
        mine[text] = response.json()["job_id"]
    for text, job_id in mine.items():
        view = (await api_client.get(f"/jobs/{job_id}", headers=auth)).json()
        assert (view["payload"]["text"], view["entity_id"], view["idempotency_key"]) == (
            text,
            text,
            text,
        )
        listed = await api_client.get("/jobs", params={"entity_id": text}, headers=auth)
        assert [job["id"] for job in listed.json()["items"]] == [job_id]
        # The same request again (the key covers the entity_id too).
        replay = await enqueue(
            api_client,
            auth,
            payload={"text": text},
            params={"entity_id": text},
            headers={"Idempotency-Key": text},
        )
        assert replay.json()["job_id"] == job_id
        assert replay.headers["idempotent-replayed"] == "true"
    for text in SQL_LOOKING:
        for params in ({"type": text}, {"status": text}, {"cursor": text}):
            response = await api_client.get("/jobs", params=params, headers=auth)
            if response.status_code == 200:
                assert response.json()["items"] == []  # no type is called that
            else:
                assert_client_error(response, 400, 422)
        unknown = await enqueue(api_client, auth, job_type=text)
        assert_client_error(unknown, 404, 405)
    # Every table is still there and holds exactly what was written.
    assert (await counts(db)) == {
        "jobs": len(SQL_LOOKING) + 1,
        "outbox": len(SQL_LOOKING) + 1,
        "jobs_without_message": 0,
    }
    everything = (await api_client.get("/jobs", params={"limit": 200}, headers=auth)).json()
    assert len(everything["items"]) == len(SQL_LOOKING)
    assert theirs.json()["job_id"] not in {job["id"] for job in everything["items"]}


async def test_unknown_job_types_of_every_shape_are_404(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    names = [
        "еcho",  # a Cyrillic "е"
        "echo ",
        "Echo",
        "echo%00",
        "%2e%2e",
        "..%2Fjobs",
        "_private",
        "x" * 10_000,
        "jobs",
    ]
    for name in names:
        response = await api_client.post(
            f"/jobs/{name}", json={"text": "a"}, headers=auth, follow_redirects=False
        )
        assert_client_error(response, 404, 405)
    assert (await counts(db))["jobs"] == 0


async def test_huge_idempotency_keys_are_400_and_not_echoed(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    for size in (256, 4096, 64 * 1024, 1024 * 1024):
        key = "k" * size
        response = await enqueue(api_client, auth, headers={"Idempotency-Key": key})
        body = assert_problem(response, 400, "invalid-idempotency-key")
        assert key[:256] not in response.text
        assert len(body["detail"]) < 200
    assert (await counts(db))["jobs"] == 0


def _cursor(raw: object) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(raw)).rstrip(b"=").decode()


async def test_cursors_that_decode_but_point_nowhere_sensible(
    api_client: httpx.AsyncClient, auth: dict[str, str]
) -> None:
    first = await enqueue(api_client, auth)
    assert first.status_code == 202
    job = str(uuid.uuid4())
    cursors = [
        _cursor([2, "2024-01-01T00:00:00+00:00", job]),  # a version we never issued
        _cursor([1, "2024-01-01T00:00:00", job]),  # no time zone
        _cursor([1, "0001-01-01T00:00:00+14:00", job]),  # before year 1 in UTC
        _cursor([1, "9999-12-31T23:59:59.999999-14:00", job]),  # after year 9999 in UTC
        _cursor([1, "2024-01-01T00:00:00+00:00", "not-a-uuid"]),
        _cursor([1, "2024-01-01T00:00:00+00:00", job, "extra"]),
        _cursor([1, 1704067200, job]),
        _cursor({"v": 1}),
        _cursor([1, "2024-02-30T00:00:00+00:00", job]),
        _cursor([True, "2024-01-01T00:00:00+00:00", job]),
        _cursor([1.0, "2024-01-01T00:00:00+00:00", job]),
        _cursor([1, "2024-01-01T00:00:00+00:00", str(uuid.UUID(int=0))]),
    ]
    for cursor in cursors:
        response = await api_client.get("/jobs", params={"cursor": cursor}, headers=auth)
        if response.status_code == 200:
            # A well-formed position: the page is whatever comes after it, nothing else.
            assert {item["id"] for item in response.json()["items"]} <= {first.json()["job_id"]}
        else:
            assert_problem(response, 400, "invalid-cursor")
