"""The operators' routes under /admin: every tenant's jobs, quarantined outbox rows and
keys, for a key with the admin scope only (the scope checks themselves are in
tests/security/test_authentication_first.py)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from jobcore.database.gateway import Database, execute
from jobcore.database.sql import Query
from jobcore.kernel.scopes import Scope
from jobcore.usecases import keys as key_usecases
from tests.integration.api.support import (
    assert_problem,
    enqueue,
    finish_job,
    job_row,
    outbox_rows,
    start_job,
)

QUARANTINE = Query(
    "test_quarantine",
    "Quarantine a job's outbox rows as the relay would on an unpublishable message.",
    """
    UPDATE outbox SET quarantined_at = now(), attempts = 1, failing_since = now(),
                      last_error = 'refused by the broker'
    WHERE job_id = %(id)s
    """,
)


@pytest.fixture
async def admin(db: Database) -> dict[str, str]:
    created = await key_usecases.create_key(
        db, "ops", "operators", scopes=[Scope.ADMIN], actor="tests"
    )
    return {"Authorization": f"Bearer {created.key}"}


async def test_jobs_of_every_tenant_listed_shown_cancelled_and_retried(
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    other_auth: dict[str, str],
    admin: dict[str, str],
    db: Database,
) -> None:
    mine = (await enqueue(api_client, auth, payload={"text": "a"})).json()["job_id"]
    theirs = (await enqueue(api_client, other_auth, payload={"text": "b"})).json()["job_id"]

    listed = await api_client.get("/admin/jobs", headers=admin)
    assert listed.status_code == 200, listed.text
    assert [(j["id"], j["tenant"]) for j in listed.json()["items"]] == [
        (theirs, "globex"),
        (mine, "acme"),
    ]
    only_acme = await api_client.get("/admin/jobs", params={"tenant": "acme"}, headers=admin)
    assert [j["id"] for j in only_acme.json()["items"]] == [mine]
    limited = await api_client.get("/admin/jobs", params={"limit": 1}, headers=admin)
    assert len(limited.json()["items"]) == 1

    shown = await api_client.get(f"/admin/jobs/{theirs}", headers=admin)
    assert shown.status_code == 200
    view = shown.json()
    assert (view["tenant"], view["payload"]) == ("globex", {"text": "b", "count": 1})
    missing = await api_client.get(f"/admin/jobs/{uuid.uuid4()}", headers=admin)
    assert_problem(missing, 404, "job-not-found")

    # Cancel: pending, cancelled now; running, the worker is asked; finished, refused.
    cancelled = await api_client.post(f"/admin/jobs/{theirs}/cancel", headers=admin)
    assert (cancelled.status_code, cancelled.json()["status"]) == (200, "cancelled")
    assert (await job_row(db, theirs))["status"] == "cancelled"
    await start_job(db, mine)
    requested = await api_client.post(f"/admin/jobs/{mine}/cancel", headers=admin)
    assert (requested.status_code, requested.json()["cancel_requested"]) == (202, True)
    again = await api_client.post(f"/admin/jobs/{theirs}/cancel", headers=admin)
    assert_problem(again, 409, "job-not-cancellable")

    # Retry: a new job for the same tenant with the same payload; only when finished badly.
    running = await api_client.post(f"/admin/jobs/{mine}/retry", headers=admin)
    assert_problem(running, 409, "job-not-retryable")
    retried = await api_client.post(f"/admin/jobs/{theirs}/retry", headers=admin)
    assert retried.status_code == 201, retried.text
    copy = retried.json()
    assert (copy["retried"], copy["status"]) == (theirs, "pending")
    row = await job_row(db, copy["job_id"])
    assert (row["tenant"], row["payload"]) == ("globex", {"text": "b", "count": 1})
    await finish_job(db, mine, "failed", last_error="boom")
    assert (await api_client.post(f"/admin/jobs/{mine}/retry", headers=admin)).status_code == 201


async def test_quarantined_rows_listed_requeued_and_discarded(
    api_client: httpx.AsyncClient, auth: dict[str, str], admin: dict[str, str], db: Database
) -> None:
    first = (await enqueue(api_client, auth, payload={"text": "a"})).json()["job_id"]
    second = (await enqueue(api_client, auth, payload={"text": "b"})).json()["job_id"]
    async with db.unit_of_work() as uow:
        for job_id in (first, second):
            await execute(uow, QUARANTINE({"id": uuid.UUID(job_id)}))
        await uow.commit()

    listed = await api_client.get("/admin/outbox/quarantined", headers=admin)
    assert listed.status_code == 200, listed.text
    items = listed.json()["items"]
    assert {item["job_id"] for item in items} == {first, second}
    assert all(item["last_error"] == "refused by the broker" for item in items)
    by_job = {item["job_id"]: item for item in items}

    requeued = await api_client.post(f"/admin/outbox/{by_job[first]['id']}/requeue", headers=admin)
    assert requeued.status_code == 200, requeued.text
    [row] = await outbox_rows(db, first)
    assert row["quarantined_at"] is None
    # By message id as well as by numeric id.
    discarded = await api_client.post(
        f"/admin/outbox/{by_job[second]['message_id']}/discard", headers=admin
    )
    assert discarded.status_code == 200, discarded.text
    assert await outbox_rows(db, second) == []
    assert (await api_client.get("/admin/outbox/quarantined", headers=admin)).json()["items"] == []

    not_quarantined = await api_client.post(
        f"/admin/outbox/{by_job[first]['id']}/discard", headers=admin
    )
    assert_problem(not_quarantined, 409, "outbox-row-not-quarantined")
    for unknown in ("999999999", str(uuid.uuid4()), "not-a-row", "9" * 30):
        gone = await api_client.post(f"/admin/outbox/{unknown}/requeue", headers=admin)
        assert_problem(gone, 404, "outbox-row-not-found")


async def test_keys_listed_without_keys_or_hashes(
    api_client: httpx.AsyncClient, api_key: str, admin: dict[str, str], db: Database
) -> None:
    listed = await api_client.get("/admin/keys", headers=admin)
    assert listed.status_code == 200, listed.text
    items = listed.json()["items"]
    assert {(k["tenant"], tuple(k["scopes"])) for k in items} == {
        ("acme", ("enqueue", "read", "cancel")),
        ("ops", ("admin",)),
    }
    assert api_key not in listed.text
    assert "key_hash" not in listed.text
    # The admin key's own use is recorded; the tenant key was never used.
    used = {k["tenant"]: k["last_used_at"] for k in items}
    assert used["ops"] is not None
    assert used["acme"] is None
    acme = await api_client.get("/admin/keys", params={"tenant": "acme"}, headers=admin)
    assert [k["tenant"] for k in acme.json()["items"]] == ["acme"]
