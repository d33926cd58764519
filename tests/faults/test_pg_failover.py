"""PostgreSQL fails over under load: the primary crashes, its replica is promoted.

The API, a relay and a worker run as separate processes against the failover pair of
``scripts/pg_failover_pair.sh`` (two scratch clusters on 5441/5442, created when missing)
through one multi-host URL, ``...@127.0.0.1:5441,127.0.0.1:5442/db?target_session_attrs=
read-write``: libpq tries the hosts in order and keeps the one that takes writes. Jobs are
submitted all along; the primary is stopped as a crash stops it (``-m immediate``); the
replica is promoted. Enqueue answers 503 with Retry-After meanwhile and 202 after; the
relay and the worker find the new primary by themselves; every job answered 202 runs, and
its effect happens once.

"Nothing acknowledged is lost" holds because the pair replicates synchronously
(``synchronous_standby_names = '*'``, ``synchronous_commit = on``): the primary answers a
COMMIT only once the replica has flushed it, so everything a 202 (or a finished job, or an
effect) stood on is on the node that is promoted. With asynchronous replication the
commits of the last moments before the crash exist only on the dead primary: accepted jobs
vanish, finished jobs run again (docs/operations.md, "PostgreSQL failover").

Not serial: it stops only its own cluster. Afterwards the old primary becomes the new
primary's replica again (a fresh base backup: it may hold commits the new primary never
got), so the test runs again as is.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aio_pika
import httpx
import psycopg
import pytest

from jobcore.amqp.topology import Topology
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing import scratch
from jobcore.testing.pipeline import (
    PIPELINE_JOB_MODULES,
    LeaseWatch,
    Stack,
    Submitter,
    check,
    status_counts,
    wait_quiescent,
)
from jobcore.testing.waiting import eventually
from tests.support import pg_pair
from tests.support.services import ServiceUrls

pytestmark = pytest.mark.timeout(420)

RATE = 30.0  # jobs a second, all along
APPLICATIONS = ("jobcore-api", "jobcore-relay", "jobcore-worker")


@contextlib.asynccontextmanager
async def failover_database(service_urls: ServiceUrls, tmp_path: Path) -> AsyncIterator[Settings]:
    """Settings on a database of the test's own on the pair, reached by the multi-host URL
    (the template is migrated through it too); dropped afterwards."""
    admin = Settings(database_url=pg_pair.ADMIN_URL)
    await asyncio.to_thread(pg_pair.drop_leftovers)
    template = await asyncio.to_thread(scratch.ensure_template, admin)
    url = await asyncio.to_thread(scratch.clone_database, admin, template, pg_pair.DATABASE_PREFIX)
    settings = Settings(
        environment="test",
        database_url=url,
        amqp_url=service_urls.amqp_url,
        amqp_prefix=f"jct.{uuid.uuid4().hex[:10]}",
        job_modules=PIPELINE_JOB_MODULES,
        result_dir=tmp_path / "results",
        shutdown_grace=5.0,
    )
    try:
        yield settings
    finally:
        with contextlib.suppress(Exception):
            connection = await aio_pika.connect(settings.amqp_url, timeout=10)
            async with connection:
                topology = Topology.from_settings(settings)
                await topology.delete(await connection.channel(), default_registry.queues())
        with contextlib.suppress(Exception):  # the pair may be half down if the test failed
            await asyncio.to_thread(scratch.drop_database, settings)


@contextlib.asynccontextmanager
async def steady_load(client: Submitter, rate: float) -> AsyncIterator[None]:
    """Submit ``rate`` jobs a second for the block; on leaving, wait until each submission
    was answered 202 (a 503 or a lost connection is retried with the same key)."""
    stop = asyncio.Event()
    task = asyncio.create_task(client.steady(rate, stop, seconds=0.05))
    try:
        yield
    finally:
        stop.set()
        await task


def succeeded_at_least(stack: Stack, n: int) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return (await status_counts(stack.db, stack.tenant)).get("succeeded", 0) >= n

    return probe


def sql_on(port: int, database: str, query: str) -> list[tuple[object, ...]]:
    """One node's answer (not the pair's primary: the node on ``port``)."""
    with psycopg.connect(pg_pair.url(database, port), connect_timeout=5, autocommit=True) as conn:
        return conn.execute(query).fetchall()


async def test_a_primary_crash_and_promotion_is_503_meanwhile_and_loses_nothing(
    service_urls: ServiceUrls, tmp_path: Path
) -> None:
    with pg_pair.locked():
        setting_up = time.monotonic()
        try:
            await asyncio.to_thread(pg_pair.ensure)
        except RuntimeError as exc:
            pytest.fail(f"cannot set up the PostgreSQL failover pair: {exc}", pytrace=False)
        figures: dict[str, float] = {"pair_ready": time.monotonic() - setting_up}
        old = await asyncio.to_thread(pg_pair.primary)
        new = pg_pair.other(old)
        old_port, new_port = pg_pair.PORTS[old], pg_pair.PORTS[new]
        try:
            async with failover_database(service_urls, tmp_path) as settings:
                database = settings.database_name
                # The precondition of "nothing acknowledged is lost": commits wait for the
                # replica.
                [(sync_state,)] = sql_on(
                    old_port, "postgres", "SELECT sync_state FROM pg_stat_replication"
                )
                assert sync_state == "sync"
                async with (
                    Stack(settings, tmp_path / "logs", relays=1, workers=1) as stack,
                    stack.submitter(give_up=60.0) as client,
                    LeaseWatch(stack.db) as leases,
                    httpx.AsyncClient(timeout=10) as http,
                ):
                    headers = {"Authorization": f"Bearer {stack.api_key}"}

                    async def answers_503() -> httpx.Response | None:
                        # No Idempotency-Key: a probe must never add a job (none can be
                        # accepted while no node takes writes).
                        response = await http.post(
                            f"{stack.api_url}/jobs/effect", json={"n": 0}, headers=headers
                        )
                        assert response.status_code != 202, "accepted with no primary"
                        return response if response.status_code == 503 else None

                    async with steady_load(client, RATE):
                        await eventually(
                            succeeded_at_least(stack, 50), timeout=90, what="50 jobs done"
                        )
                        accepted_before = len(client.accepted)

                        crashed = time.monotonic()
                        await asyncio.to_thread(pg_pair.run, "crash", old)
                        refused = await eventually(
                            answers_503, timeout=30, interval=0.1, what="the API to answer 503"
                        )
                        figures["crash_to_503"] = time.monotonic() - crashed
                        assert refused.headers["content-type"] == "application/problem+json"
                        assert int(refused.headers["retry-after"]) > 0

                        promoting = time.monotonic()
                        await asyncio.to_thread(pg_pair.run, "promote", new)
                        figures["promote_command"] = time.monotonic() - promoting
                        # A job of its own, retried while 503 with the same key: its 202
                        # is the first after the switch.
                        job_id = await client.submit()
                        assert job_id is not None, client.summary()
                        figures["promote_to_202"] = time.monotonic() - promoting
                        figures["crash_to_202"] = time.monotonic() - crashed

                        async def done() -> bool:
                            rows = sql_on(
                                new_port,
                                database,
                                f"SELECT status FROM jobcore.jobs WHERE id = '{job_id}'",
                            )
                            return rows == [("succeeded",)]

                        # Through the relay and the worker, on the new primary.
                        await eventually(done, timeout=60, interval=0.1, what="a job end to end")
                        figures["promote_to_job_done"] = time.monotonic() - promoting

                        async def more_accepted() -> bool:
                            return len(client.accepted) > accepted_before + 60

                        # The load goes on a little on the new primary.
                        await eventually(
                            more_accepted, timeout=30, interval=0.1, what="60 more jobs after"
                        )

                    await wait_quiescent(stack.db, stack.tenant, timeout=90)
                    report = await check(stack.db, stack.tenant, client.job_ids)
                    summary = {
                        **report.as_dict(),
                        "http": client.summary(),
                        "worst_overdue": leases.worst,
                        "figures": {k: round(v, 2) for k, v in figures.items()},
                    }
                    print(f"\n{summary}")
                    assert report.ok, summary
                    assert report.lost == 0, summary
                    assert report.duplicate_effects == 0, summary
                    # Every job answered 202 is there and succeeded, and no other job is.
                    assert report.accepted == report.jobs == report.statuses.get("succeeded")
                    assert not client.unexpected, summary
                    assert not client.abandoned, summary
                    # Clients were told to come back (503 with Retry-After), and did.
                    assert client.answers[503] > 0, summary
                    assert client.missing_retry_after == 0, summary
                    dead = [p for p in stack.processes if not p.alive]
                    assert not dead, "\n".join(f"{p.name}:\n{p.all_logs()[-2000:]}" for p in dead)
                    relay = stack.relays[0]
                    assert relay.logged("database unavailable; retrying")
                    assert relay.logged("database reachable again")
                    # Each service holds connections to the new primary, none restarted.
                    names = {
                        str(name)
                        for (name,) in sql_on(
                            new_port,
                            "postgres",
                            "SELECT DISTINCT application_name FROM pg_stat_activity "
                            f"WHERE datname = '{database}'",
                        )
                    }
                    assert set(APPLICATIONS) <= names, names
                    assert all(p.incarnation == 1 for p in stack.processes)
        finally:
            # The old primary becomes the replica of the new one (a fresh base backup),
            # synchronous again: the pair is whole for the next run.
            rebuilding = time.monotonic()
            await asyncio.to_thread(pg_pair.run, "start")
            figures["rebuild"] = time.monotonic() - rebuilding
        print(f"failover figures (s): { {k: round(v, 2) for k, v in figures.items()} }")
        nodes = await asyncio.to_thread(pg_pair.status)
        assert nodes == {new: "running primary", old: "running replica"}, nodes
        [(sync_state,)] = sql_on(new_port, "postgres", "SELECT sync_state FROM pg_stat_replication")
        assert sync_state == "sync"
