"""Completion webhooks end to end: the API enqueues with a callback URL, a real relay and
a real worker process run the job and send the signed webhook to a receiver on 127.0.0.1."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import standardwebhooks
from standardwebhooks.webhooks import WebhookVerificationError

from jobcore.database.gateway import Database
from jobcore.execution.completion_webhooks import new_secret
from jobcore.kernel.settings import Settings
from jobcore.testing.processes import jobcore_command, settings_env
from jobcore.testing.waiting import eventually
from tests.integration.webhooks.conftest import TENANT
from tests.integration.webhooks.support import (
    BACKOFF_BASE,
    Answer,
    Receiver,
    deliveries,
    delivery_in,
    receiving,
    service_process,
    webhook_outbox_rows,
)

TIMEOUT = 60.0  # process start-up on a loaded 2-core machine included


def cli(settings: Settings, *args: str) -> Any:
    """Run `jobcore ARGS --json` and return its parsed output."""
    done = subprocess.run(
        jobcore_command(*args, "--json"),
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout)


async def enqueue_with_callback(
    client: httpx.AsyncClient,
    auth: dict[str, str],
    url: str,
    job_type: str = "echo",
    **payload: Any,
) -> str:
    response = await client.post(
        f"/jobs/{job_type}",
        params={"callback_url": url},
        json=payload or {"text": "hi"},
        headers=auth,
    )
    assert response.status_code == 202, response.text
    return str(response.json()["job_id"])


async def test_a_finished_jobs_webhook_arrives_once_with_a_valid_signature(
    hsettings: Settings,
    db: Database,
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    broker_cleanup: None,
    tmp_path: Path,
) -> None:
    async with receiving() as receiver:
        job_id = await enqueue_with_callback(
            api_client, auth, receiver.url(), text="secret-payload"
        )
        with (
            service_process(hsettings, "relay", tmp_path),
            service_process(hsettings, "worker", tmp_path),
        ):
            delivery = await eventually(
                delivery_in(db, job_id, "delivered"), timeout=TIMEOUT, what="the delivery"
            )
        assert len(receiver.requests) == 1
        request = receiver.requests[0]

    assert delivery["attempts"] == 1
    assert delivery["last_status_code"] == 200
    assert delivery["delivered_at"] is not None
    assert delivery["event"] == "job.succeeded"
    assert await webhook_outbox_rows(db) == []  # no further attempt is waiting

    assert request.method == "POST"
    assert request.path == "/hooks/jobs"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["webhook-id"] == str(delivery["id"])
    assert abs(int(request.headers["webhook-timestamp"]) - time.time()) < 60
    secret = cli(hsettings, "webhooks", "secret", "--tenant", TENANT)["secret"]
    assert standardwebhooks.Webhook(secret).verify(request.body, request.headers) == orjson.loads(
        request.body
    )
    with pytest.raises(WebhookVerificationError):
        standardwebhooks.Webhook(secret).verify(request.body + b" ", request.headers)
    with pytest.raises(WebhookVerificationError):
        standardwebhooks.Webhook(new_secret()).verify(request.body, request.headers)

    body = orjson.loads(request.body)
    assert body["id"] == str(delivery["id"])
    assert body["event"] == "job.succeeded"
    job = body["job"]
    assert job["id"] == job_id
    assert job["type"] == "echo"
    assert job["status"] == "succeeded"
    assert job["attempts"] == 1
    assert job["finished_at"] is not None
    assert job["links"]["result"] == f"/jobs/{job_id}/result"
    # The job view, never its payload or result.
    assert "payload" not in job
    assert "result" not in job
    assert b"secret-payload" not in request.body

    # The API shows the same delivery.
    listed = (await api_client.get(f"/jobs/{job_id}/deliveries", headers=auth)).json()
    assert [item["id"] for item in listed["items"]] == [str(delivery["id"])]
    assert listed["items"][0]["status"] == "delivered"


async def test_500_twice_then_200_takes_three_attempts_with_growing_delays(
    hsettings: Settings,
    db: Database,
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    broker_cleanup: None,
    tmp_path: Path,
) -> None:
    async with receiving(Answer(500), Answer(500), Answer(200)) as receiver:
        job_id = await enqueue_with_callback(api_client, auth, receiver.url())
        with (
            service_process(hsettings, "relay", tmp_path),
            service_process(hsettings, "worker", tmp_path),
        ):
            delivery = await eventually(
                delivery_in(db, job_id, "delivered", "failed"), timeout=TIMEOUT, what="delivery"
            )
        requests = list(receiver.requests)

    assert delivery["status"] == "delivered"
    assert delivery["attempts"] == 3
    assert len(requests) == 3
    assert {r.headers["webhook-id"] for r in requests} == {str(delivery["id"])}
    first_gap = requests[1].monotonic - requests[0].monotonic
    second_gap = requests[2].monotonic - requests[1].monotonic
    # Waits are drawn from [0.6c, c] with c = base, then 2 * base: the second is at least
    # 1.2 * base, above the first's ceiling. Only lower bounds are checked: a gap is its
    # wait plus the time each retry took to go out, and comparing the two gaps would let a
    # slow first retry (a loaded machine) outweigh a close pair of draws.
    assert first_gap >= 0.6 * BACKOFF_BASE - 0.05, first_gap
    assert second_gap >= 1.2 * BACKOFF_BASE - 0.05, second_gap
    # Every attempt is signed afresh (its own timestamp), over the same body.
    assert len({r.body for r in requests}) == 1


async def test_a_400_is_final_after_one_attempt_and_redeliver_sends_it_again(
    hsettings: Settings,
    db: Database,
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    broker_cleanup: None,
    tmp_path: Path,
) -> None:
    async with receiving(Answer(400, body=b"no such hook")) as receiver:
        job_id = await enqueue_with_callback(api_client, auth, receiver.url())
        with (
            service_process(hsettings, "relay", tmp_path),
            service_process(hsettings, "worker", tmp_path),
        ):
            failed = await eventually(
                delivery_in(db, job_id, "failed"), timeout=TIMEOUT, what="the failed delivery"
            )
            assert failed["attempts"] == 1
            assert failed["last_status_code"] == 400
            assert failed["last_error"] == "HTTP 400: no such hook"
            assert failed["next_attempt_at"] is None
            assert await webhook_outbox_rows(db) == []
            assert len(receiver.requests) == 1

            listed = cli(hsettings, "webhooks", "list", "--status", "failed")
            assert [row["id"] for row in listed] == [str(failed["id"])]

            # An operator sends it again: a new attempt, same delivery id.
            cli(hsettings, "webhooks", "redeliver", str(failed["id"]))
            delivered = await eventually(
                delivery_in(db, job_id, "delivered"), timeout=TIMEOUT, what="the redelivery"
            )
        requests = list(receiver.requests)
    assert delivered["attempts"] == 2
    assert len(requests) == 2
    assert requests[1].headers["webhook-id"] == str(failed["id"])


async def test_failed_and_cancelled_jobs_send_their_own_events(
    hsettings: Settings,
    db: Database,
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    broker_cleanup: None,
    tmp_path: Path,
) -> None:
    async with receiving() as receiver:
        failing = await enqueue_with_callback(
            api_client, auth, receiver.url(), "wt_gate", permanent=True
        )
        # Cancelled while pending, by the API (its own terminal statement).
        scheduled = await api_client.post(
            "/jobs/echo",
            params={"callback_url": receiver.url(), "delay": 3600},
            json={"text": "later"},
            headers=auth,
        )
        cancelled = scheduled.json()["job_id"]
        answer = await api_client.post(f"/jobs/{cancelled}/cancel", headers=auth)
        assert answer.json()["status"] == "cancelled"
        with (
            service_process(hsettings, "relay", tmp_path),
            service_process(hsettings, "worker", tmp_path),
        ):
            await eventually(delivery_in(db, failing, "delivered"), timeout=TIMEOUT)
            await eventually(delivery_in(db, cancelled, "delivered"), timeout=TIMEOUT)
        events = {
            orjson.loads(r.body)["job"]["id"]: orjson.loads(r.body)["event"]
            for r in receiver.requests
        }
    assert events == {failing: "job.failed", cancelled: "job.cancelled"}


async def test_killing_the_worker_mid_delivery_still_delivers_with_the_same_id(
    hsettings: Settings,
    db: Database,
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    broker_cleanup: None,
    tmp_path: Path,
) -> None:
    async with receiving(Answer(hold=asyncio.Event()), Answer(200)) as receiver:
        job_id = await enqueue_with_callback(api_client, auth, receiver.url())
        with service_process(hsettings, "relay", tmp_path):
            with service_process(hsettings, "worker", tmp_path, "worker-1") as first:
                # The first worker's request is in flight (the receiver holds it): kill it.
                await eventually(_requests(receiver, 1), timeout=TIMEOUT, what="request 1")
                first.kill()
                first.wait(timeout=10)
            in_flight = await deliveries(db, job_id)
            assert in_flight[0]["status"] == "pending"
            assert in_flight[0]["attempts"] == 0  # the killed attempt recorded nothing
            with service_process(hsettings, "worker", tmp_path, "worker-2"):
                delivered = await eventually(
                    delivery_in(db, job_id, "delivered"), timeout=TIMEOUT, what="redelivery"
                )
        requests = list(receiver.requests)
    assert len(requests) == 2
    assert requests[0].headers["webhook-id"] == requests[1].headers["webhook-id"]
    assert requests[1].headers["webhook-id"] == str(delivered["id"])
    assert delivered["attempts"] == 1


def _requests(receiver: Receiver, n: int) -> Any:
    async def probe() -> bool:
        return len(receiver.requests) >= n

    return probe


async def test_no_delivery_for_a_job_without_a_callback(
    hsettings: Settings,
    db: Database,
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
) -> None:
    response = await api_client.post("/jobs/echo", json={"text": "x"}, headers=auth)
    job_id = response.json()["job_id"]
    assert (await api_client.post(f"/jobs/{job_id}/cancel", headers=auth)).status_code == 200
    assert await deliveries(db, job_id) == []
    listed = await api_client.get(f"/jobs/{job_id}/deliveries", headers=auth)
    assert listed.status_code == 200
    assert listed.json() == {"job_id": job_id, "items": []}


async def test_deliveries_of_another_tenants_job_are_not_found(
    api_client: httpx.AsyncClient, auth: dict[str, str], other_auth: dict[str, str]
) -> None:
    response = await api_client.post("/jobs/echo", json={"text": "x"}, headers=auth)
    job_id = response.json()["job_id"]
    theirs = await api_client.get(f"/jobs/{job_id}/deliveries", headers=other_auth)
    assert theirs.status_code == 404
    assert theirs.json()["type"].endswith("/job-not-found")
    missing = await api_client.get(f"/jobs/{uuid.uuid4()}/deliveries", headers=auth)
    assert missing.status_code == 404
