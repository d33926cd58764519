"""The bench's unauthenticated no-op route (services/api/routes/bench.py) is served only
when the settings ask for it (JOBCORE_BENCH_ROUTES, which only `jobcore bench` sets), never
because of some other variable in the process's environment."""

from __future__ import annotations

import httpx
import pytest

from jobcore.kernel.settings import Settings
from services.api.app import create_app


async def _post_noop(settings: Settings) -> httpx.Response:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://jobcore.test") as c:
            return await c.post("/bench/noop", json={})


async def test_a_default_api_does_not_serve_the_bench_route(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The variable that used to turn the route on, read straight from os.environ.
    monkeypatch.setenv("JOBCORE_BENCH_NOOP", "1")
    assert settings.bench_routes is False
    response = await _post_noop(settings)
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/problem+json")


async def test_the_bench_setting_serves_it(settings: Settings) -> None:
    response = await _post_noop(settings.model_copy(update={"bench_routes": True}))
    assert response.status_code == 202
    assert response.json()["job_id"] == "00000000-0000-0000-0000-000000000000"
