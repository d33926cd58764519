"""`jobcore api --ui`: the console mounted at /ui inside the API process, its lifespan run
by the API's; and `--ui` refused with several server processes (sessions live in one)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from jobcore.database.gateway import Database
from jobcore.kernel.scopes import Scope
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import FAST_ENV, Process, free_port
from jobcore.testing.processes import jobcore_command, settings_env
from jobcore.testing.waiting import eventually
from jobcore.usecases import keys as key_usecases


async def test_the_api_serves_the_console_at_ui(
    settings: Settings, db: Database, tmp_path: Path
) -> None:
    admin = await key_usecases.create_key(db, "ops", "ops", scopes=[Scope.ADMIN], actor="t")
    tenant = await key_usecases.create_key(db, "acme", "client", actor="t")
    port = free_port()
    api = Process(
        "api", ("api", "--port", str(port), "--ui"), settings_env(settings, **FAST_ENV), tmp_path
    )
    api.start()
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=5) as http:

            async def ready() -> bool:
                assert api.alive, api.all_logs()[-3000:]
                try:
                    return (await http.get("/ui/login")).status_code == 200
                except httpx.HTTPError:
                    return False

            await eventually(ready, timeout=90, interval=0.1, what="the API with its console")
            # The API itself still answers, and its keys still work there.
            enqueued = await http.post(
                "/jobs/echo",
                json={"text": "hi"},
                headers={"Authorization": f"Bearer {tenant.key}"},
            )
            assert enqueued.status_code == 202
            origin = {"Origin": base}
            refused = await http.post("/ui/login", data={"key": tenant.key}, headers=origin)
            assert refused.status_code == 401
            signed_in = await http.post("/ui/login", data={"key": admin.key}, headers=origin)
            assert signed_in.status_code == 303
            assert signed_in.headers["location"] == "/ui/"
            assert "path=/ui" in signed_in.headers["set-cookie"].lower()
            overview = await http.get("/ui/", headers={"Accept": "text/html"})
            assert overview.status_code == 200
            assert 'href="/ui/static/ui.css"' in overview.text
            assert (await http.get("/ui/static/ui.js")).status_code == 200
            jobs = await http.get("/ui/jobs", params={"tenant": "acme"})
            assert enqueued.json()["job_id"] in jobs.text
    finally:
        await api.stop(15)
    assert admin.key not in api.all_logs()


def test_ui_with_several_workers_is_refused(settings: Settings) -> None:
    done = subprocess.run(
        jobcore_command("api", "--ui", "--workers", "2"),
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "--ui runs in one process" in done.stderr
