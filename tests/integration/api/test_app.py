"""The app's wiring: who owns the pool, and serving with several worker processes."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import httpx

from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.testing.processes import jobcore_process
from jobcore.testing.waiting import eventually
from services.api.app import create_app
from tests.integration.api.support import assert_problem, enqueue


async def test_a_database_passed_in_is_used_and_left_open(
    settings: Settings, db: Database, api_key: str
) -> None:
    app = create_app(settings, database=db)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://jobcore.test") as client:
            response = await enqueue(client, {"Authorization": f"Bearer {api_key}"})
            assert response.status_code == 202
    await db.ping()  # still open: the app did not close what it did not open


async def test_requests_outside_the_lifespan_are_503(settings: Settings, api_key: str) -> None:
    app = create_app(settings)
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://jobcore.test") as client:
        response = await enqueue(client, {"Authorization": f"Bearer {api_key}"})
        assert_problem(response, 503, "unavailable")
        assert response.headers["retry-after"]
        assert_problem(await client.get("/readyz"), 503, "database-unavailable")


async def test_several_worker_processes_serve_and_stop_cleanly(
    settings: Settings, api_key: str, tmp_path: Path
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log_path = tmp_path / "api.log"
    args = ("api", "--port", str(port), "--workers", "2")
    with jobcore_process(settings, *args, log_path=log_path) as proc:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:

            async def ready() -> bool:
                assert proc.poll() is None, log_path.read_text()
                try:
                    return (await client.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(ready, timeout=60, interval=0.1, what="jobcore api --workers 2")
            auth = {"Authorization": f"Bearer {api_key}"}
            ids = {(await enqueue(client, auth)).json()["job_id"] for _ in range(10)}
            assert len(ids) == 10
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the poll interval, bounded by the deadline
        assert proc.returncode == 0, log_path.read_text()
    assert log_path.read_text().count("api started") == 2
