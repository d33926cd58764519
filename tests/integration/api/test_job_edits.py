"""PATCH /jobs/{id}: a pending job's run_at, priority and payload changed in place,
compare-and-set on the version read (If-Match: the ETag of GET /jobs/{id})."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from jobcore.database.gateway import Database
from jobcore.kernel.priorities import Priority
from services.api.schemas import JobView
from tests.integration.api.support import (
    assert_problem,
    enqueue,
    job_row,
    outbox_rows,
    start_job,
)


async def scheduled_job(client: httpx.AsyncClient, auth: dict[str, str]) -> tuple[str, str]:
    """A job due in an hour (its message waits in the outbox), and its ETag."""
    response = await enqueue(client, auth, params={"delay": 3600})
    assert response.status_code == 202, response.text
    job_id = response.json()["job_id"]
    read = await client.get(f"/jobs/{job_id}", headers=auth)
    assert read.status_code == 200
    etag = read.headers["ETag"]
    assert etag == f'"{read.json()["version"]}"'
    return job_id, etag


async def audit_rows(db: Database, job_id: str) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT actor, action, outcome, tenant, details FROM audit_log "
            "WHERE target_type = 'job' AND target_id = %s ORDER BY id",
            (job_id,),
        )
        return [dict(r) for r in await cur.fetchall()]


async def edited_events(db: Database, job_id: str) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT attempt, detail FROM job_events WHERE job_id = %s AND kind = 'edited'",
            (job_id,),
        )
        return [dict(r) for r in await cur.fetchall()]


async def test_an_edit_with_the_version_read_changes_the_job_and_moves_its_message(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    job_id, etag = await scheduled_job(api_client, auth)
    run_at = (datetime.now(UTC) + timedelta(hours=2)).replace(microsecond=0)
    response = await api_client.patch(
        f"/jobs/{job_id}",
        json={"run_at": run_at.isoformat(), "priority": "high", "payload": {"text": "changed"}},
        headers={**auth, "If-Match": etag},
    )
    assert response.status_code == 200, response.text
    view = JobView.model_validate(response.json())
    assert view.payload == {"text": "changed", "count": 1}  # validated, defaults filled in
    assert (view.priority, view.run_at) == ("high", run_at)
    assert response.headers["ETag"] != etag
    assert response.headers["ETag"] == f'"{view.version}"'

    row = await job_row(db, job_id)
    high = int(Priority.parse("high"))
    assert (row["status"], row["payload"]["text"], row["priority"]) == ("pending", "changed", high)
    assert row["not_before"] == run_at
    [message] = await outbox_rows(db, job_id)  # moved, not doubled
    assert (message["available_at"], message["priority"]) == (run_at, row["priority"])
    [event] = await edited_events(db, job_id)
    assert event["attempt"] == 1
    assert event["detail"]["fields"] == ["run_at", "priority", "payload"]
    assert event["detail"]["message"] == "moved"
    [entry] = await audit_rows(db, job_id)
    assert (entry["action"], entry["outcome"], entry["tenant"]) == ("job.edit", "succeeded", "acme")
    assert entry["actor"].startswith("key:")
    assert entry["details"]["fields"] == ["run_at", "priority", "payload"]
    assert "changed" not in str(entry["details"])  # never the values

    # The new ETag is the next edit's version.
    again = await api_client.patch(
        f"/jobs/{job_id}",
        json={"priority": "low"},
        headers={**auth, "If-Match": response.headers["ETag"]},
    )
    assert again.status_code == 200, again.text


async def test_an_edit_without_if_match_is_428(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    job_id, _ = await scheduled_job(api_client, auth)
    for headers in ({}, {"If-Match": "*"}, {"If-Match": 'W/"1"'}):
        assert_problem(
            await api_client.patch(
                f"/jobs/{job_id}", json={"priority": "high"}, headers={**auth, **headers}
            ),
            428,
            "if-match-required",
        )
    assert (await job_row(db, job_id))["priority"] != int(Priority.parse("high"))


async def test_an_edit_of_a_version_no_longer_current_is_412(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    job_id, etag = await scheduled_job(api_client, auth)
    first = await api_client.patch(
        f"/jobs/{job_id}", json={"payload": {"text": "first"}}, headers={**auth, "If-Match": etag}
    )
    assert first.status_code == 200, first.text
    stale = await api_client.patch(
        f"/jobs/{job_id}", json={"payload": {"text": "second"}}, headers={**auth, "If-Match": etag}
    )
    assert_problem(stale, 412, "job-version-mismatch")
    assert (await job_row(db, job_id))["payload"]["text"] == "first"
    outcomes = [(e["outcome"], e["details"].get("refused")) for e in await audit_rows(db, job_id)]
    assert outcomes == [("succeeded", None), ("refused", "JobVersionMismatch")]


async def test_a_job_claimed_since_it_was_read_is_409(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    job_id, etag = await scheduled_job(api_client, auth)
    await start_job(db, job_id)
    body = assert_problem(
        await api_client.patch(
            f"/jobs/{job_id}",
            json={"payload": {"text": "late"}},
            headers={**auth, "If-Match": etag},
        ),
        409,
        "job-not-editable",
    )
    assert body["job_status"] == "running"
    row = await job_row(db, job_id)
    assert (row["status"], row["payload"]["text"]) == ("running", "hello")
    assert await edited_events(db, job_id) == []


async def test_a_payload_is_validated_like_an_enqueues(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    job_id, etag = await scheduled_job(api_client, auth)
    body = assert_problem(
        await api_client.patch(
            f"/jobs/{job_id}", json={"payload": {"text": 3}}, headers={**auth, "If-Match": etag}
        ),
        422,
        "invalid-payload",
    )
    assert body["errors"][0]["loc"][-1] == "text"
    assert_problem(
        await api_client.patch(f"/jobs/{job_id}", json={}, headers={**auth, "If-Match": etag}),
        422,
        "invalid-request",
    )
    assert (await job_row(db, job_id))["payload"]["text"] == "hello"


async def test_another_tenants_job_is_404(
    api_client: httpx.AsyncClient, auth: dict[str, str], other_auth: dict[str, str]
) -> None:
    job_id, etag = await scheduled_job(api_client, auth)
    assert_problem(
        await api_client.patch(
            f"/jobs/{job_id}", json={"priority": "high"}, headers={**other_auth, "If-Match": etag}
        ),
        404,
        "job-not-found",
    )


async def test_a_payload_may_not_change_the_jobs_unique_key(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    response = await enqueue(
        api_client, auth, "sync_account", {"account": "a-1"}, params={"delay": 3600}
    )
    assert response.status_code == 202, response.text
    job_id = response.json()["job_id"]
    etag = (await api_client.get(f"/jobs/{job_id}", headers=auth)).headers["ETag"]
    body = assert_problem(
        await api_client.patch(
            f"/jobs/{job_id}",
            json={"payload": {"account": "a-2"}},
            headers={**auth, "If-Match": etag},
        ),
        422,
        "invalid-request",
    )
    assert body["errors"][0]["loc"] == ["payload", "account"]
    # The rest of the payload may change while the key stays.
    kept = await api_client.patch(
        f"/jobs/{job_id}",
        json={"payload": {"account": "a-1", "note": "n"}},
        headers={**auth, "If-Match": etag},
    )
    assert kept.status_code == 200, kept.text
    assert (await job_row(db, job_id))["unique_key"] == "a-1"
