"""The example application (examples/orders/) as its own process beside jobcore's API, relay
and worker: an order and its receipt job commit together or not at all, whether the app
is killed between its flush and its commit or rolls back after the enqueue, and a
committed order's receipt is sent exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.testing.processes import ROOT, settings_env
from tests.e2e.stack import START_TIMEOUT, E2EStack, free_port, until

EXAMPLE = ROOT / "examples" / "orders"
# The tenant of the stack's API key, so the test can follow the shop's jobs over HTTP.
TENANT = "e2e"
ORDERS = 5


def example_env(settings: Settings, **extra: str) -> dict[str, str]:
    return settings_env(
        settings,
        JOBCORE_JOB_MODULES="jobcore.examples.jobtypes,jobcore.testing.jobtypes,receipts",
        PYTHONPATH=f"{EXAMPLE}{os.pathsep}{ROOT}",
        OTEL_SDK_DISABLED="true",
        ORDERS_TENANT=TENANT,
        **extra,
    )


@asynccontextmanager
async def running_stack(settings: Settings, workdir: Path) -> AsyncIterator[E2EStack]:
    stack = E2EStack(
        settings,
        workdir,
        env={
            "JOBCORE_JOB_MODULES": "jobcore.examples.jobtypes,jobcore.testing.jobtypes,receipts",
            "PYTHONPATH": f"{EXAMPLE}{os.pathsep}{ROOT}",
            "OTEL_SDK_DISABLED": "true",
        },
    )
    try:
        await stack.start()
        yield stack
    finally:
        await stack.stop()


@contextmanager
def app_process(
    settings: Settings, workdir: Path, port: int, **extra: str
) -> Iterator[subprocess.Popen[bytes]]:
    log = open(workdir / "orders-app.log", "wb")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "orders_app:app", "--port", str(port)],
        cwd=EXAMPLE,
        env=example_env(settings, **extra),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


async def app_ready(proc: subprocess.Popen[bytes], url: str, workdir: Path) -> None:
    async def ready() -> bool:
        if proc.poll() is not None:
            log = (workdir / "orders-app.log").read_text(errors="replace")
            raise AssertionError(f"the orders app exited:\n{log[-3000:]}")
        try:
            async with httpx.AsyncClient(timeout=2) as client:
                return (await client.get(f"{url}/healthz")).status_code == 200
        except httpx.HTTPError:
            return False

    await until(ready, timeout=START_TIMEOUT, what="the orders app to be ready")


async def counts(db: Database) -> dict[str, Any]:
    """What the database holds of the shop's orders and their jobs."""
    async with db.connection() as conn:
        cur = await conn.execute(
            """
            SELECT (SELECT count(*) FROM orders) AS orders,
                   (SELECT count(*) FROM jobcore.jobs WHERE tenant = %(t)s) AS jobs,
                   (SELECT count(*) FROM jobcore.outbox WHERE tenant = %(t)s) AS outbox,
                   (SELECT count(*) FROM jobcore.tenant_usage_deltas WHERE tenant = %(t)s) AS deltas
            """,
            {"t": TENANT},
        )
        row = await cur.fetchone()
    assert row is not None
    return dict(row)


async def app_sessions(db: Database) -> int:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = 'orders-example'"
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


def stored_objects(settings: Settings) -> list[Path]:
    root = Path(settings.result_dir)
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


ORDER = {"email": "ada@example.com", "total_cents": 1200, "card": "4242424242424242"}


async def test_the_app_killed_between_its_flush_and_its_commit_leaves_neither(
    settings: Settings, db: Database, tmp_path: Path
) -> None:
    held = tmp_path / "held"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with running_stack(settings, tmp_path):
        with app_process(settings, tmp_path, port, ORDERS_HOLD_BEFORE_COMMIT=str(held)) as proc:
            await app_ready(proc, url, tmp_path)
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                posted = asyncio.create_task(client.post("/orders", json=ORDER))

                async def holding() -> bool:
                    if posted.done():
                        raise AssertionError(f"answered before the hold: {posted.result()}")
                    return held.exists()

                await until(holding, timeout=60, what="the app to hold before its commit")
                # Written (the order flushed, the job enqueued) and not committed.
                assert await counts(db) == {"orders": 0, "jobs": 0, "outbox": 0, "deltas": 0}
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
                with pytest.raises(httpx.HTTPError):
                    await posted

        async def sessions_gone() -> bool:
            return await app_sessions(db) == 0

        # The server rolls back a transaction whose connection is gone.
        await until(sessions_gone, timeout=60, what="the killed app's sessions to end")
        assert await counts(db) == {"orders": 0, "jobs": 0, "outbox": 0, "deltas": 0}


async def test_a_rollback_after_the_enqueue_leaves_nothing(
    settings: Settings, db: Database, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with running_stack(settings, tmp_path):
        with app_process(settings, tmp_path, port) as proc:
            await app_ready(proc, url, tmp_path)
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                declined = await client.post("/orders", json={**ORDER, "card": "4000000000000002"})
                assert declined.status_code == 402
                assert declined.headers["content-type"] == "application/problem+json"
                # A committed one after it: the app and the stack work, so the nothing
                # above is the rollback's.
                placed = await client.post("/orders", json=ORDER)
                assert placed.status_code == 201, placed.text
        placed_job = uuid.UUID(placed.json()["job_id"])
        async with db.connection() as conn:
            cur = await conn.execute(
                """
                SELECT (SELECT count(*) FROM orders) AS orders,
                       (SELECT array_agg(id) FROM jobcore.jobs WHERE tenant = %(t)s) AS jobs,
                       -- The placed order's row may be published and gone already.
                       (SELECT count(*) FROM jobcore.outbox
                        WHERE tenant = %(t)s AND job_id <> %(placed)s) AS other_outbox
                """,
                {"t": TENANT, "placed": placed_job},
            )
            row = await cur.fetchone()
        assert row is not None
        # Only the placed order and its job: nothing of the declined one.
        assert (row["orders"], row["jobs"], row["other_outbox"]) == (1, [placed_job], 0)
        assert not [p for p in stored_objects(settings) if "payloads" in p.parts]


async def test_each_committed_orders_receipt_is_sent_exactly_once(
    settings: Settings, db: Database, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with running_stack(settings, tmp_path) as stack:
        with app_process(settings, tmp_path, port) as proc:
            await app_ready(proc, url, tmp_path)
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                placed = []
                for n in range(ORDERS):
                    answer = await client.post("/orders", json={**ORDER, "total_cents": 100 + n})
                    assert answer.status_code == 201, answer.text
                    placed.append(answer.json())
                async with stack.client() as jobs:
                    for order in placed:
                        await stack.wait_status(jobs, order["job_id"], "succeeded")
                for order in placed:
                    seen = (await client.get(f"/orders/{order['order_id']}")).json()
                    assert seen["receipts_sent"] == 1, seen
        async with db.connection() as conn:
            cur = await conn.execute(
                "SELECT order_id, count(*) AS n, count(DISTINCT job_id) AS jobs"
                " FROM receipts GROUP BY order_id ORDER BY order_id"
            )
            rows = await cur.fetchall()
            cur = await conn.execute(
                "SELECT count(*) AS n FROM jobcore.jobs WHERE tenant = %s AND attempts = 1"
                " AND status = 'succeeded'",
                [TENANT],
            )
            ran = await cur.fetchone()
        assert [(r["order_id"], r["n"], r["jobs"]) for r in rows] == [
            (o["order_id"], 1, 1) for o in placed
        ]
        assert ran is not None
        assert ran["n"] == ORDERS
