"""The enqueue bench's baseline app (services/bench/minimal_app.py) writes trigger-free
copies of jobs and outbox by default: on jobcore's own tables the quota trigger locked one
tenant_usage row per insert until COMMIT, and the baseline queued on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import psycopg
import pytest

from jobcore.kernel.settings import Settings
from services.bench.minimal_app import OWN_TABLES, TENANT, create_app


@asynccontextmanager
async def serving(url: str, tables: str = "own") -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(url, tables)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            yield client


def counts(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        found = {
            # What the quota trigger writes per job added: a +1 delta of the tenant's usage.
            "usage_deltas": conn.execute(
                "SELECT count(*) FROM tenant_usage_deltas WHERE tenant = %s", (TENANT,)
            ).fetchone(),
            "jobs": conn.execute("SELECT count(*) FROM jobs").fetchone(),
            "outbox": conn.execute("SELECT count(*) FROM outbox").fetchone(),
        }
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (OWN_TABLES["jobs"],))
        row = exists.fetchone()
        if row is not None and row[0]:
            for name, table in OWN_TABLES.items():
                found[table] = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
                assert name in ("jobs", "outbox")
    return {k: int(v[0]) if v else 0 for k, v in found.items()}


async def test_the_baseline_writes_its_own_tables_without_jobcore_triggers(
    settings: Settings,
) -> None:
    async with serving(settings.database_url) as client:
        for _ in range(3):
            assert (await client.post("/jobs/noop", json={})).status_code == 202
    found = counts(settings.database_url)
    assert found[OWN_TABLES["jobs"]] == 3
    assert found[OWN_TABLES["outbox"]] == 3
    # Neither jobcore's tables nor the quota trigger's usage were touched.
    assert (found["jobs"], found["outbox"], found["usage_deltas"]) == (0, 0, 0)


async def test_on_jobcores_tables_the_quota_trigger_counts_the_baselines_jobs(
    settings: Settings,
) -> None:
    # The old baseline, kept selectable: what the trigger does to it.
    async with serving(settings.database_url, "jobcore") as client:
        assert (await client.post("/jobs/noop", json={})).status_code == 202
    found = counts(settings.database_url)
    assert (found["jobs"], found["outbox"], found["usage_deltas"]) == (1, 1, 1)


def test_an_unknown_table_choice_is_refused() -> None:
    with pytest.raises(ValueError, match="own or jobcore"):
        create_app("postgresql:///nowhere", "theirs")
