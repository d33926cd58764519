"""The API, a relay and a worker behind PgBouncer in transaction mode (scripts/pgbouncer.sh).

PgBouncer gives each of the test database's clients one of only two server connections
per transaction, so three processes share them: a prepared statement or a ``SET`` left on
a server connection meets another client's transaction at once. The pipeline runs twice:
with a direct URL for LISTEN (``JOBCORE_LISTEN_DATABASE_URL``), and with none, where the
relay, the long-polls and the cancel notices poll. Either way jobs are enqueued, published
and run, a long-poll wakes when its job ends, a running job is cancelled long before a
heartbeat (a third of a 90 s lease) would notice, and no process saw a prepared-statement
error.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psycopg
import pytest

from jobcore.database import migrate
from jobcore.database.gateway import Database, fetch_one
from jobcore.database.sql import NoParams, Query
from jobcore.kernel.errors import DatabaseUnavailable
from jobcore.kernel.settings import Settings
from jobcore.testing.processes import jobcore_command, settings_env
from tests.e2e.stack import JOB_MODULES, E2EStack
from tests.integration.pgbouncer.napping_jobtypes import LEASE_SECONDS
from tests.support import databases
from tests.support.pgbouncer import admin_console, ensure_pgbouncer, through_pgbouncer
from tests.support.services import ServiceUrls

JOBS = 20
POLL_INTERVAL = 0.3
# Far below a heartbeat's third of the lease: only the NOTIFY or the cancel poll is this fast.
CANCEL_WITHIN = 10.0
LONG_POLL_WAIT = 40.0
PREPARED_STATEMENT_ERRORS = ("prepared statement", "_pg3_")

ECHO_THROUGH = Query[NoParams](
    "test_echo", "A statement run often enough to be prepared.", "SELECT 1 AS one"
)


@pytest.fixture(scope="module", autouse=True)
def pgbouncer() -> None:
    try:
        ensure_pgbouncer()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


async def _run_alternately(settings: Settings) -> list[str]:
    """Two pools of one connection each, through PgBouncer, taking turns at one query; the
    errors they met."""
    errors: list[str] = []
    pools = [Database(settings, min_size=1, max_size=1, name=f"pgb-{i}") for i in range(2)]
    for pool in pools:
        await pool.open(wait=True)
    try:
        for _ in range(10):
            for pool in pools:
                try:
                    async with pool.connection() as conn:
                        await fetch_one(conn, ECHO_THROUGH({}))
                except DatabaseUnavailable as exc:
                    errors.append(str(exc))
                except Exception as exc:  # the driver's own error is the finding
                    errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        for pool in pools:
            await pool.close()
    return errors


async def test_pools_prepare_no_statement_behind_pgbouncer(settings: Settings) -> None:
    pooled = through_pgbouncer(settings.database_url)
    # The control: psycopg's default (a query run five times is prepared) breaks here.
    unaware = await _run_alternately(settings.model_copy(update={"database_url": pooled}))
    assert any("_pg3_" in error for error in unaware), unaware
    aware = await _run_alternately(
        settings.model_copy(update={"database_url": pooled, "database_pooler": "pgbouncer"})
    )
    assert aware == []


@pytest.fixture(params=["direct-listen", "polling"])
async def stack(
    request: pytest.FixtureRequest, settings: Settings, tmp_path: Path
) -> AsyncIterator[E2EStack]:
    env = {
        "JOBCORE_DATABASE_URL": through_pgbouncer(settings.database_url),
        "JOBCORE_DATABASE_POOLER": "pgbouncer",
        "JOBCORE_LISTEN_DATABASE_URL": (
            settings.database_url if request.param == "direct-listen" else ""
        ),
        "JOBCORE_NOTIFY_POLL_INTERVAL": str(POLL_INTERVAL),
        "JOBCORE_JOB_MODULES": f"{JOB_MODULES},tests.integration.pgbouncer.napping_jobtypes",
        "JOBCORE_DB_POOL_MAX": "10",
    }
    stack = E2EStack(settings, tmp_path, env=env)
    try:
        await stack.start()
        yield stack
    finally:
        codes = await stack.stop()
        logs = "\n".join(stack.logs(role) for role in ("api", "relay", "worker"))
        bad = [
            line
            for line in logs.splitlines()
            if any(marker in line for marker in PREPARED_STATEMENT_ERRORS)
        ]
        assert bad == [], "\n".join(bad[:5])
        assert codes == {"api": 0, "relay": 0, "worker": 0}, codes


async def _clients_through_pgbouncer(database: str) -> set[str]:
    rows = await asyncio.to_thread(admin_console, "SHOW CLIENTS")
    return {row["application_name"] for row in rows if row["database"] == database}


async def _listening_directly(settings: Settings) -> set[str]:
    """The processes with a LISTEN connection (named so by jobcore) to the test database,
    from PostgreSQL's side: PgBouncer's server connections carry their clients' names."""
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        cursor = await conn.execute(
            "SELECT application_name FROM pg_stat_activity "
            "WHERE datname = %s AND application_name ~ '-listen(er)?$'",
            (settings.database_name,),
        )
        names = {str(row[0]) for row in await cursor.fetchall()}
    return {name.removesuffix("-listen").removesuffix("-listener") for name in names}


async def _health(stack: E2EStack, role: str) -> dict[str, object]:
    async with httpx.AsyncClient(timeout=5) as client:
        return dict((await client.get(f"{stack.url(role)}/healthz")).json())


async def test_jobs_long_polls_and_cancels_behind_pgbouncer(
    stack: E2EStack, settings: Settings
) -> None:
    polling = stack.env["JOBCORE_LISTEN_DATABASE_URL"] == ""
    relay = await _health(stack, "relay")
    worker = await _health(stack, "worker")
    assert relay["listens"] is not polling, relay
    assert worker["cancel_polling"] is polling, worker
    # The three processes' pools reach the database through PgBouncer.
    clients = await _clients_through_pgbouncer(settings.database_name)
    assert {"jobcore-api", "jobcore-relay", "jobcore-worker"} <= clients, clients

    async with stack.client() as client:
        # Enqueue, relay, worker: each a few times past psycopg's prepare threshold.
        ids = []
        for n in range(JOBS):
            answer = await client.post("/jobs/echo", json={"text": f"pgb {n}"})
            assert answer.status_code == 202, answer.text
            ids.append(answer.json()["job_id"])
        for job_id in ids:
            await stack.wait_status(client, job_id, "succeeded", timeout=60)

        # A long-poll wakes when its job ends, long before its wait is over.
        answer = await client.post("/jobs/pgb_nap", json={"seconds": 1.0})
        assert answer.status_code == 202, answer.text
        napping = answer.json()["job_id"]
        started = time.monotonic()
        waited = await client.get(
            f"/jobs/{napping}", params={"wait": LONG_POLL_WAIT}, timeout=LONG_POLL_WAIT + 10
        )
        assert waited.json()["status"] == "succeeded", waited.text
        woke = time.monotonic() - started
        assert woke < LONG_POLL_WAIT / 2, woke

        # A running job is cancelled by the NOTIFY or the poll, not by a heartbeat.
        answer = await client.post("/jobs/pgb_nap", json={"seconds": 100})
        assert answer.status_code == 202, answer.text
        sleeper = answer.json()["job_id"]
        await stack.wait_status(client, sleeper, "running", timeout=60)
        asked = time.monotonic()
        cancel = await client.post(f"/jobs/{sleeper}/cancel")
        assert cancel.status_code == 202, cancel.text
        await stack.wait_status(client, sleeper, "cancelled", timeout=CANCEL_WITHIN)
        took = time.monotonic() - asked
        assert took < min(CANCEL_WITHIN, LEASE_SECONDS / 3), took
        print(f"long-poll answered after {woke:.2f}s (1 s job), cancel took {took:.2f}s")

    # Listeners connect to PostgreSQL directly, or not at all; never through PgBouncer.
    clients = await _clients_through_pgbouncer(settings.database_name)
    assert not any(name.endswith(("-listen", "-listener")) for name in clients), clients
    direct = await _listening_directly(settings)
    expected = set() if polling else {"jobcore-api", "jobcore-relay", "jobcore-worker"}
    assert direct == expected, direct


def test_migrate_refuses_to_run_through_pgbouncer(service_urls: ServiceUrls) -> None:
    """Two `jobcore migrate` take turns with a session lock, which PgBouncer in transaction
    mode would leave on a server connection: migrate says to run it directly, in one line,
    and changes nothing."""
    name = f"jobcore_t_{uuid.uuid4().hex[:12]}"
    direct = databases.with_database(service_urls.pg_admin_url, name)
    settings = Settings(
        database_url=through_pgbouncer(direct),
        database_pooler="pgbouncer",
        amqp_url=service_urls.amqp_url,
    )
    try:
        assert migrate.create_database(settings)
        result = subprocess.run(
            jobcore_command("migrate"),
            env=settings_env(settings, JOBCORE_DATABASE_POOLER="pgbouncer"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 1, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith("jobcore: JOBCORE_DATABASE_POOLER=pgbouncer:")
        assert "runs against PostgreSQL directly" in result.stderr
        direct_settings = settings.model_copy(update={"database_url": direct})
        assert migrate.current_revision(direct_settings) is None
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)
