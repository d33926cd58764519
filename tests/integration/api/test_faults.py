"""Outages: the broker never matters to the API; the database being down is a 503 with
Retry-After, never a half-written job, and the API recovers by itself."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.testing.chaos import postgres_stopped
from jobcore.testing.processes import jobcore_process
from jobcore.testing.waiting import eventually
from services.api.app import create_app
from tests.integration.api.support import assert_problem, counts, enqueue, job_row

CLOSED_PORT_URL = "postgresql://postgres@127.0.0.1:1/jobcore"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def unreachable_db_client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    broken = settings.model_copy(
        update={"database_url": CLOSED_PORT_URL, "db_connect_timeout": 1.0}
    )
    app = create_app(broken)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://jobcore.test") as client:
            yield client


async def test_database_unreachable_is_503_with_retry_after(
    unreachable_db_client: httpx.AsyncClient,
) -> None:
    client = unreachable_db_client
    auth = {"Authorization": "Bearer jc_" + "a" * 43}
    for method, path in (("POST", "/jobs/echo"), ("GET", "/jobs"), ("GET", "/readyz")):
        response = await client.request(method, path, json={"text": "a"}, headers=auth)
        body = assert_problem(response, 503, "database-unavailable")
        assert int(response.headers["retry-after"]) > 0
        assert "127.0.0.1" not in body["detail"]  # no internals in answers
    alive = await client.get("/healthz")
    assert (alive.status_code, alive.json()) == (200, {"status": "alive"})
    # A request without a key needs no database: still a 401.
    assert_problem(await client.get("/jobs"), 401, "missing-api-key")


@pytest.mark.serial
async def test_postgres_outage_is_503_then_recovers_without_restart(
    settings: Settings, db: Database, api_key: str
) -> None:
    quick = settings.model_copy(update={"db_connect_timeout": 1.0})
    app: FastAPI = create_app(quick)
    auth = {"Authorization": f"Bearer {api_key}"}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://jobcore.test") as client:
            before = await enqueue(client, auth, payload={"text": "before"})
            assert before.status_code == 202
            with postgres_stopped():
                for _ in range(3):
                    during = await enqueue(client, auth, payload={"text": "during"})
                    assert_problem(during, 503, "database-unavailable")
                    assert during.headers["retry-after"]
                assert_problem(await client.get("/readyz"), 503, "database-unavailable")

            async def accepted() -> bool:
                response = await enqueue(client, auth, payload={"text": "after"})
                return response.status_code == 202

            await eventually(accepted, timeout=30, interval=0.2, what="enqueue after recovery")
            assert (await client.get("/readyz")).status_code == 200
            view = await client.get(f"/jobs/{before.json()['job_id']}", headers=auth)
            assert view.json()["status"] == "pending"

    await eventually(lambda: _reachable(db), timeout=30, what="the test's pool reconnecting")
    rows = await counts(db)
    # Only the jobs that were answered 202 exist, each with its message; nothing partial.
    assert rows == {"jobs": 2, "outbox": 2, "jobs_without_message": 0}


async def _reachable(db: Database) -> bool:
    try:
        await db.ping()
    except Exception:
        return False
    return True


async def test_enqueue_is_202_with_the_broker_unreachable(
    settings: Settings, db: Database, api_key: str, tmp_path: Path
) -> None:
    port = free_port()
    log_path = tmp_path / "api.log"
    with jobcore_process(
        settings,
        "api",
        "--port",
        str(port),
        log_path=log_path,
        JOBCORE_AMQP_URL="amqp://guest:guest@127.0.0.1:1/",
    ) as proc:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:

            async def ready() -> bool:
                assert proc.poll() is None, log_path.read_text()
                try:
                    return (await client.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(ready, timeout=30, interval=0.1, what="jobcore api ready")
            auth = {"Authorization": f"Bearer {api_key}"}
            response = await enqueue(client, auth, payload={"text": "no broker"})
            assert response.status_code == 202, response.text
            job = await job_row(db, response.json()["job_id"])
            assert job["status"] == "pending"
            assert (await counts(db))["outbox"] == 1
            view = await client.get(response.headers["location"], headers=auth)
            assert view.json()["payload"] == {"text": "no broker", "count": 1}
        proc.terminate()
        deadline = time.monotonic() + 15
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the poll interval, bounded by the deadline
        assert proc.returncode == 0  # SIGTERM: a clean shutdown
    log = log_path.read_text()
    assert "api started" in log
    assert api_key not in log  # keys never reach the logs
