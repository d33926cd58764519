"""Tenants, keys and what leaves the API: isolation in every job state, revocation across
server processes, no key in any log, nothing but the envelope on the wire.

The API's own tenant tests (tests/integration/api/test_tenants.py) cover a pending job of
another tenant, listing by entity, and revocation in-process. These add: another tenant's
jobs in every state (a result that exists, a running job a cancel would reach), every
listing filter followed page by page, a cursor positioned at another tenant's job;
revocation seen at once by every process of a multi-process `jobcore api` when done with
`jobcore keys revoke`; the logs of real API (with access logs) and relay processes never
holding a key or its hash; and the AMQP message of a job carrying only the envelope and
trace headers — no payload, no key, no tenant.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import orjson

from jobcore.access import apikeys
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import Stack
from jobcore.testing.processes import ROOT, jobcore_command, settings_env
from jobcore.testing.waiting import eventually
from jobcore.usecases import keys as key_usecases
from services.api.cursor import encode_cursor
from tests.integration.api.support import assert_problem, enqueue, finish_job, job_row, start_job

STATES = ("pending", "running", "succeeded", "failed", "cancelled")
ENVELOPE_FIELDS = {"v", "job_id", "attempt", "type"}
# What the relay sends (x-jobcore-published: when its claim began, and its id), and the
# count the quorum queue adds on delivery.
ALLOWED_HEADERS = {
    "traceparent",
    "tracestate",
    "x-envelope-version",
    "x-delivery-count",
    "x-jobcore-published",
}
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def all_pages(client: httpx.AsyncClient, auth: dict[str, str], **params: Any) -> list[str]:
    """Every job id a listing shows, following ``links.next`` to the end."""
    ids: list[str] = []
    url: str | None = "/jobs"
    query: dict[str, Any] | None = params
    while url is not None:
        response = await client.get(url, params=query, headers=auth)
        assert response.status_code == 200, response.text
        page = response.json()
        ids += [item["id"] for item in page["items"]]
        url, query = page["links"]["next"], None
    return ids


async def test_a_key_never_reaches_another_tenants_jobs_in_any_state(
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    other_auth: dict[str, str],
    db: Database,
) -> None:
    secret = f"their-secret-{uuid.uuid4()}"
    theirs: dict[str, str] = {}
    for state in STATES:
        created = await enqueue(
            api_client, other_auth, payload={"text": secret}, params={"entity_id": "shared"}
        )
        job_id = created.json()["job_id"]
        if state != "pending":
            await start_job(db, job_id)
        if state in ("succeeded", "failed", "cancelled"):
            result = {"secret": secret} if state == "succeeded" else None
            await finish_job(db, job_id, state, result=result)
        theirs[state] = job_id
    mine = [
        (await enqueue(api_client, auth, params={"entity_id": "shared"})).json()["job_id"]
        for _ in range(3)
    ]

    unknown = str(uuid.uuid4())
    for state, job_id in theirs.items():
        for method, suffix in (("GET", ""), ("GET", "/result"), ("POST", "/cancel")):
            foreign = await api_client.request(method, f"/jobs/{job_id}{suffix}", headers=auth)
            missing = await api_client.request(method, f"/jobs/{unknown}{suffix}", headers=auth)
            # Not 409 "result not ready" or "not cancellable": those would say it exists.
            assert_problem(foreign, 404, "job-not-found")
            assert (foreign.content, foreign.headers) == (missing.content, missing.headers), state
            assert secret not in foreign.text
    # Nothing we did reached their jobs.
    for state, job_id in theirs.items():
        row = await job_row(db, job_id)
        assert (row["status"], row["cancel_requested_at"]) == (state, None)

    filters: list[dict[str, Any]] = [
        {},
        {"entity_id": "shared"},
        {"type": "echo"},
        {"limit": 1},
        {"entity_id": "shared", "limit": 1},
        *({"status": state} for state in STATES),
    ]
    for params in filters:
        listed = await all_pages(api_client, auth, **params)
        expected = [] if params.get("status", "pending") != "pending" else mine[::-1]
        assert listed == expected, params
    # A cursor positioned at their newest job pages through our jobs only.
    newest = await job_row(db, theirs["cancelled"])
    cursor = encode_cursor(newest["created_at"], newest["id"])
    for params in ({"cursor": cursor}, {"cursor": cursor, "entity_id": "shared"}):
        assert set(await all_pages(api_client, auth, **params)) <= set(mine)
    # And their key still sees all of theirs.
    assert set(await all_pages(api_client, other_auth)) == set(theirs.values())


def jobcore(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobcore_command(*args),
        env=settings_env(settings),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def published_message(settings: Settings) -> aio_pika.abc.AbstractIncomingMessage:
    """The first message the relay put on the test's job queue (no worker takes it)."""
    topology = Topology.from_settings(settings)
    connection = await aio_pika.connect(settings.amqp_url, timeout=10)
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue(topology.queue_name("testq"), ensure=True)

        async def first() -> aio_pika.abc.AbstractIncomingMessage | None:
            return await queue.get(no_ack=True, fail=False)

        message = await eventually(first, timeout=30, interval=0.1, what="the published message")
        await topology.delete(channel, default_registry.queues())
        return message


async def test_keys_stay_out_of_logs_revocation_is_immediate_and_messages_carry_no_secrets(
    settings: Settings, tmp_path: Path
) -> None:
    payload_secret = f"payload-secret-{uuid.uuid4()}"
    stack = Stack(
        settings,
        tmp_path / "logs",
        relays=1,
        workers=0,  # the message stays on the queue for the test to read
        api_args=("--workers", "2", "--access-log"),
    )
    async with stack:
        key = stack.api_key
        other = (
            await key_usecases.create_key(stack.db, "other-tenant", "tests", actor="tests")
        ).key
        auth = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=10) as client:
            created = await client.post(
                "/jobs/echo",
                json={"text": payload_secret},
                params={"entity_id": "order-1"},
                headers={**auth, "Idempotency-Key": "order-1", "traceparent": TRACEPARENT},
            )
            assert created.status_code == 202, created.text
            job_id = created.json()["job_id"]
            for path in (f"/jobs/{job_id}", "/jobs", f"/jobs/{job_id}/result"):
                assert (await client.get(path, headers=auth)).status_code in (200, 409)
                foreign = await client.get(path, headers={"Authorization": f"Bearer {other}"})
                assert foreign.status_code in (200, 404)
            for wrong in (key + "x", key[:-1], key.upper(), apikeys.hash_key(key)):
                response = await client.get("/jobs", headers={"Authorization": f"Bearer {wrong}"})
                assert_problem(response, 401, "invalid-api-key")

        message = await published_message(settings)

        # Revoked with the CLI while two server processes run: the next requests, on new
        # connections (so both processes answer some), are all refused.
        [record] = [k for k in await key_usecases.list_keys(stack.db, stack.tenant)]
        revoked = jobcore(settings, "keys", "revoke", str(record.id))
        assert revoked.returncode == 0, revoked.stderr
        for _ in range(20):
            async with httpx.AsyncClient(base_url=stack.api_url, timeout=10) as fresh:
                assert_problem(await fresh.get("/jobs", headers=auth), 401, "invalid-api-key")
        async with httpx.AsyncClient(base_url=stack.api_url, timeout=10) as fresh:
            still = await fresh.get("/jobs", headers={"Authorization": f"Bearer {other}"})
            assert still.status_code == 200
        api = stack.api
        assert api is not None
    codes = await stack.stop()
    assert codes["api"] == 0

    # The message: the envelope and trace context, nothing else.
    body = orjson.loads(message.body)
    assert set(body) == ENVELOPE_FIELDS
    assert (body["job_id"], body["type"], body["attempt"]) == (job_id, "echo", 1)
    headers = dict(message.headers or {})
    assert set(headers) <= ALLOWED_HEADERS, headers
    assert headers["x-envelope-version"] == 1
    assert message.content_type == "application/json"
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert message.type == "echo"
    assert uuid.UUID(str(message.message_id))
    for unused in ("user_id", "app_id", "reply_to", "correlation_id", "expiration"):
        assert getattr(message, unused) is None, unused
    wire = message.body + repr(headers).encode() + repr(message.info()).encode()
    for secret in (payload_secret, key, other, apikeys.hash_key(key), stack.tenant, "order-1"):
        assert secret.encode() not in wire, secret

    # The logs: requests were logged (access log on, both server processes started)...
    api_log = api.all_logs()
    assert api_log.count("api started") == 2
    assert "GET /jobs" in api_log
    # ... and no key, no key hash, no payload is in any of them.
    logs = api_log + "".join(relay.all_logs() for relay in stack.relays)
    for secret in (key, other, apikeys.hash_key(key), apikeys.hash_key(other), payload_secret):
        assert secret not in logs, secret
