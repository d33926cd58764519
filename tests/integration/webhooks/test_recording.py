"""Where deliveries are recorded: only with the state change that ends the job, in its
transaction, and callback URLs checked at enqueue (SSRF)."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, fetch_all
from jobcore.database.sql.webhook_deliveries import WEBHOOK_DELIVERY_LIST_FOR_JOB
from jobcore.execution.completion_webhooks import completion_params
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.maintenance import Maintainer, Reaper
from jobcore.usecases import keys as key_usecases
from jobcore.usecases.jobs import cancel_job
from jobcore.usecases.webhooks import set_endpoint
from services.api.app import create_app
from services.worker.metrics import WorkerMetrics
from tests.integration.webhooks.conftest import TENANT
from tests.integration.webhooks.support import deliveries, webhook_outbox_rows

REFUSED = [
    "http://127.0.0.1:9/hook",
    "http://10.1.2.3/hook",
    "http://192.168.0.10/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://[::1]/hook",
    "http://[fd00:ec2::254]/latest",
    "http://[::ffff:127.0.0.1]/hook",
    "http://0.0.0.0/hook",
    "http://100.64.0.1/hook",
    "http://224.0.0.1/hook",
    "http://localhost:8080/hook",
    "http://2130706433/hook",  # 127.0.0.1 as one number
    "http://0x7f.0.0.1/hook",
    "http://127.1/hook",
    "ftp://example.com/hook",
    "file:///etc/passwd",
    "http://user:pass@127.0.0.1/hook",
    "/relative/hook",
    "http:///no-host",
    "http://127.0.0.1:99999/hook",
]


async def job_count(db: Database) -> int:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM jobs")
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


@pytest.fixture
async def strict_client(settings: Settings) -> Any:
    """The API with no allowed hosts: the default."""
    app: FastAPI = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://jobcore.test") as c:
            yield c


@pytest.mark.parametrize("url", REFUSED)
async def test_a_callback_to_a_private_or_odd_address_is_refused_at_enqueue(
    strict_client: httpx.AsyncClient, auth: dict[str, str], db: Database, url: str
) -> None:
    response = await strict_client.post(
        "/jobs/echo", params={"callback_url": url}, json={"text": "x"}, headers=auth
    )
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["type"] == "https://jobcore.dev/problems/invalid-request"
    assert body["errors"][0]["loc"] == ["query", "callback_url"]
    assert await job_count(db) == 0


async def test_an_allowed_host_is_accepted_and_stored(
    api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    url = "http://127.0.0.1:8123/hooks?x=1"
    response = await api_client.post(
        "/jobs/echo", params={"callback_url": url}, json={"text": "x"}, headers=auth
    )
    assert response.status_code == 202, response.text
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT callback_url FROM jobs WHERE id = %s", (uuid.UUID(response.json()["job_id"]),)
        )
        row = await cur.fetchone()
    assert row is not None
    assert row["callback_url"] == url
    # Allowed by host, not by range: another loopback address stays refused.
    other = await api_client.post(
        "/jobs/echo",
        params={"callback_url": "http://127.0.0.2/hooks"},
        json={"text": "x"},
        headers=auth,
    )
    assert other.status_code == 422


async def test_a_tenants_default_endpoint_applies_when_no_callback_is_given(
    hsettings: Settings, api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    await set_endpoint(
        db, hsettings, default_registry, TENANT, "*", "http://127.0.0.1:1/any", actor="tests"
    )
    await set_endpoint(
        db, hsettings, default_registry, TENANT, "echo", "http://127.0.0.1:1/echo", actor="tests"
    )
    echo = (await api_client.post("/jobs/echo", json={"text": "x"}, headers=auth)).json()
    effect = (await api_client.post("/jobs/effect", json={}, headers=auth)).json()
    given = await api_client.post(
        "/jobs/echo",
        params={"callback_url": "http://127.0.0.1:1/given"},
        json={"text": "y"},
        headers=auth,
    )
    async with db.connection() as conn:
        cur = await conn.execute("SELECT id::text, callback_url FROM jobs")
        urls = {row["id"]: row["callback_url"] for row in await cur.fetchall()}
    assert urls == {
        echo["job_id"]: "http://127.0.0.1:1/echo",
        effect["job_id"]: "http://127.0.0.1:1/any",
        given.json()["job_id"]: "http://127.0.0.1:1/given",
    }


async def test_a_rolled_back_cancel_records_no_delivery(
    hsettings: Settings, api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    response = await api_client.post(
        "/jobs/echo",
        params={"callback_url": "http://127.0.0.1:1/hook"},
        json={"text": "x"},
        headers=auth,
    )
    job_id = uuid.UUID(response.json()["job_id"])
    completion = completion_params(Topology.from_settings(hsettings), hsettings)
    async with db.unit_of_work() as uow:
        outcome = await cancel_job(uow, TENANT, job_id, completion=completion)
        assert outcome.status == "cancelled"
        # Inside the transaction the delivery and its message exist ...
        seen = await fetch_all(
            uow, WEBHOOK_DELIVERY_LIST_FOR_JOB({"job_id": job_id, "tenant": TENANT})
        )
        assert seen[0]["id"] is not None
        await uow.rollback()
    # ... and went away with it.
    assert await deliveries(db, job_id) == []
    assert await webhook_outbox_rows(db) == []
    # Committed, they stay: one delivery, one message naming it.
    async with db.unit_of_work() as uow:
        await cancel_job(uow, TENANT, job_id, completion=completion)
        await uow.commit()
    [delivery] = await deliveries(db, job_id)
    [message] = await webhook_outbox_rows(db)
    assert delivery["event"] == "job.cancelled"
    assert delivery["status"] == "pending"
    assert delivery["max_attempts"] == hsettings.webhook_max_attempts
    assert message["routing_key"] == "webhooks"
    assert message["exchange"] == f"{hsettings.amqp_prefix}.jobs"
    assert message["tenant"] == TENANT
    assert str(delivery["id"]) in bytes(message["body"]).decode()


async def test_the_reaper_records_the_webhook_of_a_job_it_fails(
    hsettings: Settings, api_client: httpx.AsyncClient, auth: dict[str, str], db: Database
) -> None:
    response = await api_client.post(
        "/jobs/echo",
        params={"callback_url": "http://127.0.0.1:1/hook", "max_attempts": 1},
        json={"text": "x"},
        headers=auth,
    )
    job_id = uuid.UUID(response.json()["job_id"])
    # Its worker claimed it and died: attempts used up, lease expired.
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE jobs SET status = 'running', attempts = 1, lease_token = gen_random_uuid(),"
            " lease_expires_at = now() - interval '1 second' WHERE id = %s",
            (job_id,),
        )
    reaper = Reaper.from_settings(hsettings, registry=default_registry, metrics=WorkerMetrics())
    assert (await Maintainer(db, [reaper], owner="test").tick())["reaper"] == 1
    [delivery] = await deliveries(db, job_id)
    assert delivery["event"] == "job.failed"
    assert len(await webhook_outbox_rows(db)) == 1


async def test_a_revoked_key_cannot_list_deliveries(
    api_client: httpx.AsyncClient, db: Database
) -> None:
    created = await key_usecases.create_key(db, TENANT, "to revoke", actor="tests")
    await key_usecases.revoke_key(db, created.record.id, actor="tests")
    response = await api_client.get(
        f"/jobs/{uuid.uuid4()}/deliveries", headers={"Authorization": f"Bearer {created.key}"}
    )
    assert response.status_code == 401
