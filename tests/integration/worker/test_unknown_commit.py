"""Statements whose commit went unanswered: the worker recognises its own earlier commit.

The worker reaches PostgreSQL through a proxy that lets one chosen statement run to its
commit and then cuts the connection before the answer (TcpProxy.cut_after_commit): the
worker sees a broken connection, retries, and must take what it finds as its own doing.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, fetch_all
from jobcore.database.sql import Query
from jobcore.execution.claims import ClaimedJob, ClaimRequest, Unclaimed
from jobcore.kernel.errors import DatabaseUnavailable
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import via_port
from jobcore.testing.tcpproxy import Mode, TcpProxy
from jobcore.testing.waiting import eventually
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import GatePayload, TripwirePayload
from tests.integration.worker.support import (
    OutboxPump,
    effects,
    job_row,
    outbox_rows,
    relayed,
    status_is,
    submit,
)

CUT_TIMEOUT = 30.0


@pytest.fixture
def wsettings(wsettings: Settings) -> Settings:
    """Deliveries only: the claims cut here are a delivery's (a claim from the outbox whose
    commit went unanswered: test_direct_pickup)."""
    return relayed(wsettings)


PUBLISHED = Query(
    "test_published",
    "What a relay's publish leaves of a job's messages in the database: none in the outbox.",
    "DELETE FROM outbox WHERE job_id = %(id)s RETURNING message_id",
)


@pytest.fixture
async def db_proxy(wsettings: Settings) -> AsyncIterator[TcpProxy]:
    """A proxy in front of PostgreSQL. Requested before start_worker, it stops after the
    workers do (a worker stopping behind a stopped proxy waits out its pool's timeouts)."""
    target = urlsplit(wsettings.database_url)
    proxy = TcpProxy(target.hostname or "127.0.0.1", target.port or 5432)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


@pytest.fixture
def proxied(wsettings: Settings, db_proxy: TcpProxy) -> Settings:
    """The worker's settings, its database reached through the proxy."""
    return wsettings.model_copy(
        update={"database_url": via_port(wsettings.database_url, db_proxy.port)}
    )


async def test_the_proxy_lets_a_statement_commit_and_cuts_its_answer(
    db: Database, db_proxy: TcpProxy, wsettings: Settings
) -> None:
    marker = uuid.uuid4().hex
    url = via_port(wsettings.database_url, db_proxy.port)
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE cut_probe (note text)")
        cut = db_proxy.cut_after_commit(marker.encode())
        with pytest.raises(psycopg.OperationalError):
            await conn.execute("INSERT INTO cut_probe VALUES (%s)", (marker,))
        await asyncio.wait_for(cut, CUT_TIMEOUT)
        assert conn.broken
    # A transaction: its statements are answered, its COMMIT is not.
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cut = db_proxy.cut_after_commit(transaction_end=True)
        with pytest.raises(psycopg.OperationalError):
            async with conn.transaction():
                await conn.execute("INSERT INTO cut_probe VALUES ('in a block')")
                await conn.execute("SELECT 1")  # answered: only the COMMIT is cut
        await asyncio.wait_for(cut, CUT_TIMEOUT)
        assert conn.broken
    async with db.connection() as direct:
        cur = await direct.execute("SELECT note FROM cut_probe ORDER BY note")
        assert [row["note"] for row in await cur.fetchall()] == [marker, "in a block"]
    assert db_proxy.cuts == 2


async def test_a_claim_whose_commit_went_unanswered_runs_its_job(
    db: Database,
    db_proxy: TcpProxy,
    topology: Topology,
    outbox_pump: OutboxPump,
    start_worker: StartWorker,
    proxied: Settings,
    tmp_path: Path,
) -> None:
    worker = await start_worker(proxied)
    # Its last attempt: a claim read as a duplicate would leave it to the reaper,
    # which fails it without its handler having run.
    job_id = await submit(
        db,
        topology,
        "wt_tripwire",
        TripwirePayload(tripwire=str(tmp_path / "never-made")),
        max_attempts=1,
    )
    # The claim is the first statement of the worker's that names the job (psycopg
    # sends a uuid as its hex digits).
    cut = db_proxy.cut_after_commit(job_id.hex.encode())
    await outbox_pump.drain()
    await asyncio.wait_for(cut, CUT_TIMEOUT)

    row = await eventually(
        lambda: status_is(db, job_id, "succeeded", "failed"),
        timeout=30,
        what="the job to end",
    )
    assert (row["status"], row["attempts"]) == ("succeeded", 1), row["last_error"]
    assert [e["attempt"] for e in await effects(db, job_id)] == [1]
    assert worker.metrics.counts["duplicates"] == 0
    assert db_proxy.cuts == 1


@pytest.mark.parametrize(
    "order",
    ["copy, retry", "retry, copy", "copy, retry, copy", "retry, copy, retry"],
)
async def test_a_retried_claim_batched_with_a_redelivery_of_its_message_resumes(
    db: Database,
    db_proxy: TcpProxy,
    topology: Topology,
    start_worker: StartWorker,
    proxied: Settings,
    tmp_path: Path,
    order: str,
) -> None:
    """A claim's first try commits unanswered; a redelivery of its message (a fresh lease
    token) lands in the same batch as the retry. The retry must come back resumed, in any
    order, and the redelivery be answered as the duplicate it is."""
    worker = await start_worker(
        proxied,
        queues=["nothing_arrives_here"],  # the test hands the consumer its claims
    )
    consumer = worker.consumer
    # Its last attempt: a retry dropped as a duplicate leaves the job to the reaper,
    # which fails it without its handler having run.
    job_id = await submit(
        db,
        topology,
        "wt_tripwire",
        TripwirePayload(tripwire=str(tmp_path / "never-made")),
        max_attempts=1,
    )
    [message] = await outbox_rows(db, job_id)

    tripwire = worker.registry.get("wt_tripwire")

    def request() -> ClaimRequest:
        # A long lease: the reaper must not take the job back while the test looks at it.
        return ClaimRequest(message["message_id"], job_id, tripwire, 1, uuid.uuid4(), 60.0)

    retry = request()
    cut = db_proxy.cut_after_commit(job_id.hex.encode())
    with pytest.raises(DatabaseUnavailable):
        await consumer.claims.submit(retry)
    await asyncio.wait_for(cut, CUT_TIMEOUT)
    job = await job_row(db, job_id)
    assert (job["status"], job["lease_token"]) == ("running", retry.lease_token)

    copies = {"copy": request(), "retry": retry}
    batch = [copies[name] for name in order.split(", ")]
    if order == "copy, retry, copy":
        batch[2] = request()  # a second redelivery, with a token of its own
    answers = await worker.executor.claim(batch)

    by_request = list(zip(batch, answers, strict=True))
    [resumed] = [answer for _, answer in by_request if isinstance(answer, ClaimedJob)]
    assert resumed.resumed
    assert (resumed.job_id, resumed.lease_token) == (job_id, retry.lease_token)
    for request_, answer in by_request:
        if answer is not resumed:
            assert answer == Unclaimed("duplicate"), request_
    # The retry's first answer is the resumed one; a repeat of it is a duplicate.
    first_retry = next(i for i, r in enumerate(batch) if r is retry)
    assert answers[first_retry] is resumed

    # The resumed claim runs, under the first try's token, and nothing else does.
    await worker.executor.execute(resumed)
    row = await eventually(
        lambda: status_is(db, job_id, "succeeded", "failed"), timeout=30, what="the job to end"
    )
    assert (row["status"], row["attempts"]) == ("succeeded", 1), row["last_error"]
    assert [e["attempt"] for e in await effects(db, job_id)] == [1]
    assert worker.metrics.counts["reaped.failed"] == 0
    assert db_proxy.cuts == 1


@pytest.mark.parametrize(
    ("payload", "cut_on", "status", "counted"),
    [
        # The success carries its effects as JSON, the only statement with the dashed id.
        (GatePayload(), None, "succeeded", "processed.succeeded"),
        (GatePayload(fail_times=1), b"planned failure on attempt 1", "succeeded", "retries"),
        (GatePayload(permanent=True), b"this job can never work", "failed", "processed.failed"),
    ],
    ids=["success", "retry", "failure"],
)
async def test_an_outcome_whose_commit_went_unanswered_counts_as_written(
    db: Database,
    db_proxy: TcpProxy,
    topology: Topology,
    outbox_pump: OutboxPump,
    start_worker: StartWorker,
    proxied: Settings,
    payload: GatePayload,
    cut_on: bytes | None,
    status: str,
    counted: str,
) -> None:
    worker = await start_worker(proxied)
    job_id = await submit(db, topology, "wt_gate", payload)
    cut = db_proxy.cut_after_commit(cut_on or str(job_id).encode())
    await outbox_pump.drain()
    await asyncio.wait_for(cut, CUT_TIMEOUT)

    async def ended() -> dict[str, Any] | None:
        await outbox_pump.drain()  # the retry's message, once due
        return await status_is(db, job_id, status)

    row = await eventually(ended, timeout=30, what=f"the job {status}")
    assert row["attempts"] == 1 + payload.fail_times
    # The outcome's retry found its own first try's doing, not a lost lease.
    await eventually(lambda: _counted(worker.metrics.counts, counted), what=f"{counted} counted")
    assert worker.metrics.counts["processed.lease_lost"] == 0
    assert db_proxy.cuts == 1


async def _counted(counts: Mapping[str, int], name: str) -> bool:
    return counts[name] == 1


async def test_a_retry_whose_commit_went_unanswered_counts_while_its_message_is_in_the_broker(
    db: Database,
    db_proxy: TcpProxy,
    topology: Topology,
    outbox_pump: OutboxPump,
    start_worker: StartWorker,
    proxied: Settings,
) -> None:
    """The retry's first try commits unanswered, and a relay publishes the message it wrote
    before the worker's second try asks what happened: published and not yet claimed, the
    message is in neither the outbox nor the inbox. The retry is still the worker's own
    doing (the lease token it left on the row), not a lost lease."""
    worker = await start_worker(proxied)
    job_id = await submit(db, topology, "wt_gate", GatePayload(fail_times=1))
    # The worker reaches no database from the cut on, until the message has left.
    cut = db_proxy.cut_after_commit(b"planned failure on attempt 1", then=Mode.REFUSE)
    await outbox_pump.drain()
    await asyncio.wait_for(cut, CUT_TIMEOUT)
    async with db.unit_of_work() as uow:
        published = await fetch_all(uow, PUBLISHED({"id": job_id}))
        await uow.commit()
    assert len(published) == 1  # the retry's message
    db_proxy.set_mode(Mode.FORWARD)

    await eventually(lambda: _counted(worker.metrics.counts, "retries"), what="retries counted")
    assert worker.metrics.counts["processed.lease_lost"] == 0
    row = await job_row(db, job_id)
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert db_proxy.cuts == 1
