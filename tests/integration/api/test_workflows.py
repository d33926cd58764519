"""POST /workflows, GET /workflows/{id}, cancel and retry over HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from jobcore.database.gateway import Database
from tests.integration.api.support import assert_problem


def job(name: str, *deps: Any, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "type": "echo",
        "payload": {"text": name},
        "depends_on": list(deps),
        **extra,
    }


async def outbox_jobs(db: Database) -> set[str]:
    async with db.connection() as conn:
        cursor = await conn.execute("SELECT job_id::text AS id FROM outbox")
        return {row["id"] for row in await cursor.fetchall()}


async def test_a_workflow_is_created_whole_and_read_back(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    body = {
        "name": "report",
        "jobs": [
            job("a"),
            job("b", "a"),
            job("c", {"name": "a", "policy": "on_complete"}),
            job("d", "b", "c"),
            job("tidy", **{"finally": True}),
        ],
    }
    response = await api_client.post("/workflows", json=body, headers=auth)
    assert response.status_code == 201, response.text
    created = response.json()
    assert set(created["jobs"]) == {"a", "b", "c", "d", "tidy"}
    # Only the job with no dependency has a message; the others are held.
    assert await outbox_jobs(db) == {created["jobs"]["a"]}
    view = await api_client.get(f"/workflows/{created['id']}", headers=auth)
    assert view.status_code == 200, view.text
    workflow = view.json()
    assert (workflow["status"], workflow["jobs_total"], workflow["open_jobs"]) == ("running", 5, 5)
    by_name = {j["name"]: j for j in workflow["jobs"]}
    assert by_name["a"]["waiting_for_dependencies"] is False
    assert by_name["d"]["waiting_for_dependencies"] is True
    assert {(e["name"], e["policy"], e["state"]) for e in by_name["d"]["depends_on"]} == {
        ("b", "on_success", "waiting"),
        ("c", "on_success", "waiting"),
    }
    assert by_name["tidy"]["is_finally"] is True
    # A held job reads as pending, held for its dependencies.
    single = await api_client.get(f"/jobs/{created['jobs']['d']}", headers=auth)
    assert single.status_code == 200, single.text
    assert single.json()["held_reason"] == "dependencies"


async def test_a_cycle_is_refused_with_422_and_nothing_is_written(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    body = {"jobs": [job("a", "c"), job("b", "a"), job("c", "b")]}
    response = await api_client.post("/workflows", json=body, headers=auth)
    problem = assert_problem(response, 422, "invalid-workflow")
    assert "cycle" in problem["detail"]
    for bad in (
        {"jobs": [job("a"), job("a")]},
        {"jobs": [job("a", "missing")]},
        {"jobs": [{"name": "a", "type": "no_such_type"}]},
        {"jobs": [{"name": "a", "type": "echo", "payload": {"not_a_field": 1}}]},
        {"jobs": [job("a"), job("z", **{"finally": True, "depends_on": ["a"]})]},
    ):
        refused = await api_client.post("/workflows", json=bad, headers=auth)
        assert refused.status_code == 422, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
    async with db.connection() as conn:
        cursor = await conn.execute("SELECT count(*) AS n FROM jobs")
        assert await cursor.fetchone() == {"n": 0}


async def test_cancel_and_another_tenants_workflow(
    api_client: httpx.AsyncClient, auth: dict[str, str], other_auth: dict[str, str]
) -> None:
    created = (
        await api_client.post("/workflows", json={"jobs": [job("a"), job("b", "a")]}, headers=auth)
    ).json()
    hidden = await api_client.get(f"/workflows/{created['id']}", headers=other_auth)
    assert_problem(hidden, 404, "workflow-not-found")
    cancelled = await api_client.post(f"/workflows/{created['id']}/cancel", headers=auth)
    assert cancelled.status_code == 202, cancelled.text
    assert cancelled.json()["cancelled"] == 2
    workflow = (await api_client.get(f"/workflows/{created['id']}", headers=auth)).json()
    assert workflow["status"] == "cancelled"
    assert {j["status"] for j in workflow["jobs"]} == {"cancelled"}
    retry = await api_client.post(f"/workflows/{created['id']}/jobs/a/retry", headers=auth)
    assert_problem(retry, 409, "job-not-retryable")
    missing = await api_client.post(f"/workflows/{created['id']}/jobs/zz/retry", headers=auth)
    assert_problem(missing, 404, "workflow-job-not-found")


async def count_rows(db: Database) -> tuple[int, int]:
    async with db.connection() as conn:
        cursor = await conn.execute(
            "SELECT (SELECT count(*) FROM workflows) AS w, (SELECT count(*) FROM jobs) AS j"
        )
        row = await cursor.fetchone()
    assert row is not None
    return int(row["w"]), int(row["j"])


async def test_an_idempotency_key_replays_the_first_answer_and_refuses_another_request(
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    other_auth: dict[str, str],
    db: Database,
) -> None:
    body = {"name": "diamond", "jobs": [job("a"), job("b", "a"), job("c", "a"), job("d", "b", "c")]}
    keyed = {**auth, "Idempotency-Key": "order-17"}
    first = await api_client.post("/workflows", json=body, headers=keyed)
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    again = await api_client.post("/workflows", json=body, headers=keyed)
    assert again.status_code == 201, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert await count_rows(db) == (1, 4)
    # Another request under the key: the documented 422, naming the workflow; nothing new.
    changed = {**body, "jobs": [*body["jobs"][:3], job("d", "b")]}
    refused = await api_client.post("/workflows", json=changed, headers=keyed)
    problem = assert_problem(refused, 422, "idempotency-key-reused")
    assert first.json()["id"] in problem["detail"]
    assert await count_rows(db) == (1, 4)
    # The key is the tenant's: another tenant's request with it is its own workflow.
    other = await api_client.post(
        "/workflows", json=body, headers={**other_auth, "Idempotency-Key": "order-17"}
    )
    assert other.status_code == 201, other.text
    assert other.json()["id"] != first.json()["id"]
    # A key that is not 1 to 255 printable ASCII characters is a 400, as for a job.
    bad = await api_client.post(
        "/workflows", json=body, headers={**auth, "Idempotency-Key": "x" * 256}
    )
    assert_problem(bad, 400, "invalid-idempotency-key")


async def test_two_requests_at_once_with_one_key_make_one_workflow(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    body = {"jobs": [job("a"), job("b", "a")]}
    keyed = {**auth, "Idempotency-Key": "at-once"}
    answers = await asyncio.gather(
        *(api_client.post("/workflows", json=body, headers=keyed) for _ in range(2))
    )
    assert [a.status_code for a in answers] == [201, 201], [a.text for a in answers]
    assert answers[0].json() == answers[1].json()
    assert sorted(a.headers.get("idempotent-replayed", "") for a in answers) == ["", "true"]
    assert await count_rows(db) == (1, 2)


async def test_retrying_a_workflows_job_is_audited_with_the_key(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    created = (
        await api_client.post("/workflows", json={"jobs": [job("a"), job("b", "a")]}, headers=auth)
    ).json()
    # The tenant's own cancel is not audited (as for a job); the retry always is.
    cancelled = await api_client.post(f"/workflows/{created['id']}/cancel", headers=auth)
    assert cancelled.status_code == 202, cancelled.text
    refused = await api_client.post(f"/workflows/{created['id']}/jobs/a/retry", headers=auth)
    assert_problem(refused, 409, "job-not-retryable")
    async with db.connection() as conn:
        cursor = await conn.execute(
            "SELECT actor, action, target_id, tenant, outcome FROM audit_log"
            " WHERE action LIKE 'workflow.%' ORDER BY id"
        )
        entries = await cursor.fetchall()
        cursor = await conn.execute("SELECT id FROM api_keys WHERE tenant = 'acme'")
        key = await cursor.fetchone()
    assert key is not None
    assert [dict(e) for e in entries] == [
        {
            "actor": f"key:{key['id']}",
            "action": "workflow.retry",
            "target_id": created["id"],
            "tenant": "acme",
            "outcome": "refused",
        }
    ]
