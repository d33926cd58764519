"""Payloads are validated strictly on every route that takes one: ``{"rows": "5"}`` where
``export_csv``'s model says ``rows: int`` is a 422 naming the field, and nothing is
written (no job, no outbox row, no quota drawn); ``{"rows": 5}`` is accepted."""

from __future__ import annotations

import re
from typing import Any

import httpx

from jobcore.database.gateway import Database, fetch_one
from jobcore.database.sql import Query
from jobcore.kernel.settings import Settings
from tests.integration.api.conftest import TENANT
from tests.integration.api.support import api, assert_problem, counts, enqueue, job_row

LOOSE = {"rows": "5"}
VALID = {"rows": 5}

UNFINISHED = Query(
    "test_unfinished_of_tenant",
    "A tenant's count of unfinished jobs, as its quota sees it (row and deltas).",
    """
    SELECT coalesce((SELECT unfinished FROM tenant_usage WHERE tenant = %(t)s), 0)
           + (SELECT coalesce(sum(delta), 0) FROM tenant_usage_deltas WHERE tenant = %(t)s)
           AS unfinished
    """,
)


def remaining(response: httpx.Response) -> int:
    """The tenant's enqueue tokens left, as the answer's RateLimit header says."""
    match = re.fullmatch(r'"enqueue";r=(\d+);t=(\d+)', response.headers["RateLimit"])
    assert match, response.headers["RateLimit"]
    return int(match.group(1))


async def unfinished(db: Database) -> int:
    async with db.connection() as conn:
        row = await fetch_one(conn, UNFINISHED({"t": TENANT}))
    assert row is not None
    return int(row["unfinished"])


def single(payload: Any) -> tuple[str, Any]:
    return "/jobs/export_csv", payload


def batch(payload: Any) -> tuple[str, Any]:
    return "/jobs/export_csv/batch", {"items": [{"payload": VALID}, {"payload": payload}]}


def batches(payload: Any) -> tuple[str, Any]:
    jobs = [{"type": "export_csv", "payload": VALID}, {"type": "export_csv", "payload": payload}]
    return "/batches", {"jobs": jobs}


def workflow(payload: Any) -> tuple[str, Any]:
    jobs = [
        {"name": "first", "type": "export_csv", "payload": VALID},
        {"name": "second", "type": "export_csv", "payload": payload},
    ]
    return "/workflows", {"jobs": jobs}


# Each route: how it locates the field, and the problem type it answers (the route's own,
# as for any other invalid payload there).
ROUTES = [
    (single, ["rows"], "invalid-payload"),
    (batch, ["items", 1, "rows"], "invalid-request"),
    (batches, ["body", "jobs", 1, "payload", "rows"], "invalid-request"),
    (workflow, ["jobs", 1, "rows"], "invalid-payload"),
]


async def test_a_string_integer_is_a_422_naming_the_field_on_every_route(
    settings: Settings, db: Database, auth: dict[str, str]
) -> None:
    limited = settings.model_copy(
        update={"quota_enqueue_rate": 0.01, "quota_enqueue_burst": 50, "quota_max_unfinished": 50}
    )
    async with api(limited) as (_, client):
        for route, loc, slug in ROUTES:
            path, body = route(LOOSE)
            refused = await client.post(path, json=body, headers=auth)
            problem = assert_problem(refused, 422, slug)
            assert [(e["loc"], e["type"]) for e in problem["errors"]] == [(loc, "int_type")], (
                path,
                problem,
            )
        # Nothing written, nothing drawn from the tenant's quotas.
        assert (await counts(db))["jobs"] == 0
        assert (await counts(db))["outbox"] == 0
        assert await unfinished(db) == 0

        first = await client.post("/jobs/export_csv", json=VALID, headers=auth)
        assert first.status_code == 202, first.text
        # Every token but this request's is still there: the 422s took none.
        assert remaining(first) == 49
        assert (await job_row(db, first.json()["job_id"]))["payload"]["rows"] == 5

        for route, _, _ in ROUTES[1:]:
            path, body = route(VALID)
            accepted = await client.post(path, json=body, headers=auth)
            assert accepted.status_code in (200, 201), (path, accepted.text)
    # 1 + 2 per batch route and the workflow.
    assert (await counts(db))["jobs"] == 7
    assert (await counts(db))["jobs_without_message"] == 0


async def test_the_payloads_error_reads_as_the_models_own(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    """A boolean, a float with a fraction and a string are not integers either (an
    integral float is: JSON Schema's integer); a valid payload of the route is stored as
    sent."""
    for payload in ({"rows": True}, {"rows": 5.5}, {"rows": "five"}):
        response = await enqueue(api_client, auth, "export_csv", payload)
        body = assert_problem(response, 422, "invalid-payload")
        assert [e["loc"] for e in body["errors"]] == [["rows"]]
        assert body["errors"][0]["msg"] == "Input should be a valid integer"
    assert (await counts(db))["jobs"] == 0
    accepted = await enqueue(api_client, auth, "export_csv", {"rows": 5, "seed": 7})
    assert accepted.status_code == 202, accepted.text


async def test_an_edit_of_a_payload_is_as_strict_as_an_enqueue(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    created = await enqueue(api_client, auth, params={"delay": 3600})
    assert created.status_code == 202, created.text
    job_id = created.json()["job_id"]
    read = await api_client.get(f"/jobs/{job_id}", headers=auth)
    etag = read.headers["ETag"]
    refused = await api_client.patch(
        f"/jobs/{job_id}",
        json={"payload": {"text": "hi", "count": "2"}},
        headers={**auth, "If-Match": etag},
    )
    body = assert_problem(refused, 422, "invalid-payload")
    assert [e["loc"][-1] for e in body["errors"]] == ["count"]
    row = await job_row(db, job_id)
    assert row["payload"] == {"text": "hello", "count": 1}
    edited = await api_client.patch(
        f"/jobs/{job_id}",
        json={"payload": {"text": "hi", "count": 2}},
        headers={**auth, "If-Match": etag},
    )
    assert edited.status_code == 200, edited.text
    assert (await job_row(db, job_id))["payload"] == {"text": "hi", "count": 2}
