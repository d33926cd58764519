"""jobcore.enqueue_in / enqueue_in_sync: a job written in the application's transaction,
for each connection kind, against the real PostgreSQL (and RabbitMQ for the run)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session as OrmSession

from jobcore import enqueue_in, enqueue_in_sync
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.errors import InvalidField, InvalidPayload, UniqueJobExists
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from jobcore.usecases.enqueue.in_transaction import NotInTransaction, UnsupportedConnection
from tests.integration.intx.apptx import KINDS, app_tx
from tests.integration.relay.helpers import running_relay
from tests.integration.worker.conftest import StartWorker

pytestmark = pytest.mark.usefixtures("orders")


def limited(settings: Settings) -> Settings:
    """A deployment whose tenants have an enqueue rate limit (checked, in an in-transaction
    enqueue, without writing the tenant's usage row)."""
    return settings.model_copy(update={"quota_enqueue_rate": 1000.0, "quota_enqueue_burst": 1000})


async def counts(db: Database, tenant: str = "t") -> dict[str, int]:
    """What another connection sees: the tenant's jobs, their outbox rows, the orders and
    the tenant's usage rows."""
    async with db.connection() as conn:
        cur = await conn.execute(
            """
            SELECT (SELECT count(*) FROM jobs WHERE tenant = %(t)s) AS jobs,
                   (SELECT count(*) FROM outbox o JOIN jobs j ON j.id = o.job_id
                     WHERE j.tenant = %(t)s) AS outbox,
                   (SELECT count(*) FROM orders) AS orders,
                   (SELECT count(*) FROM tenant_usage WHERE tenant = %(t)s) AS usage,
                   (SELECT count(*) FROM tenant_usage_deltas WHERE tenant = %(t)s) AS deltas
            """,
            {"t": tenant},
        )
        row = await cur.fetchone()
    assert row is not None
    return dict(row)


@pytest.fixture
async def listener(settings: Settings) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    conn = await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True)
    await conn.execute(f"LISTEN {OUTBOX_CHANNEL}")
    try:
        yield conn
    finally:
        await conn.close()


async def next_notify(listener: psycopg.AsyncConnection[Any]) -> str:
    notify = await asyncio.wait_for(anext(listener.notifies()), timeout=10)
    return notify.payload


async def send_marker(db: Database) -> None:
    async with db.connection() as conn:
        await conn.execute("SELECT pg_notify(%s, 'marker')", [OUTBOX_CHANNEL])


@pytest.mark.parametrize("kind", KINDS)
async def test_a_committed_job_appears_at_the_commit_and_runs_once(
    kind: str,
    wsettings: Settings,
    db: Database,
    listener: psycopg.AsyncConnection[Any],
    start_worker: StartWorker,
) -> None:
    async with app_tx(kind, limited(wsettings)) as tx:
        await tx.add_order(1)
        result = await tx.enqueue("echo", {"text": "receipt 1"})
        assert not result.replayed
        # Nothing visible to another connection yet, and no relay woken.
        assert await counts(db) == {"jobs": 0, "outbox": 0, "orders": 0, "usage": 0, "deltas": 0}
        await send_marker(db)
        assert await next_notify(listener) == "marker"
        await tx.commit()
    assert await next_notify(listener) == ""  # the enqueue's NOTIFY, sent by the commit
    seen = await counts(db)
    # The job's count is its delta; the approximate admission wrote no usage row.
    assert seen == {"jobs": 1, "outbox": 1, "orders": 1, "usage": 0, "deltas": 1}

    async with running_relay(wsettings, db):
        await start_worker()

        async def succeeded() -> dict[str, Any] | None:
            async with db.connection() as conn:
                cur = await conn.execute(
                    "SELECT status, attempts FROM jobs WHERE id = %s AND status = 'succeeded'",
                    [result.job_id],
                )
                return await cur.fetchone()

        done = await eventually(succeeded, timeout=30, what="the job to succeed")
    assert done is not None
    assert done["attempts"] == 1  # run once


@pytest.mark.parametrize("kind", KINDS)
async def test_a_rollback_leaves_no_job_no_message_and_no_usage(
    kind: str, settings: Settings, db: Database, listener: psycopg.AsyncConnection[Any]
) -> None:
    async with app_tx(kind, limited(settings)) as tx:
        await tx.add_order(1)
        await tx.enqueue("echo", {"text": "receipt 1"}, idempotency_key="k", ordering_key="o")
        await tx.rollback()
    assert await counts(db) == {"jobs": 0, "outbox": 0, "orders": 0, "usage": 0, "deltas": 0}
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM job_gates")
        gates = await cur.fetchone()
    assert gates is not None
    assert gates["n"] == 0
    await send_marker(db)
    assert await next_notify(listener) == "marker"  # the rolled-back enqueue woke no relay


@pytest.mark.parametrize("kind", KINDS)
async def test_a_refusal_leaves_the_transaction_usable(
    kind: str, settings: Settings, db: Database
) -> None:
    async with app_tx(kind, settings) as tx:
        first = await tx.enqueue("echo", {"text": "a"}, unique_key="order-1")
        with pytest.raises(UniqueJobExists) as refused:
            await tx.enqueue("echo", {"text": "b"}, unique_key="order-1")
        assert refused.value.job_id == first.job_id
        with pytest.raises(InvalidPayload):
            await tx.enqueue("echo", {"text": "a", "unknown": 1})
        with pytest.raises(InvalidField):
            await tx.enqueue("echo", {"text": "a"}, run_at=None, delay=-1.0, unique_key="\x00")
        # The same request again, in the same transaction: its replay.
        again = await tx.enqueue("echo", {"text": "c"}, idempotency_key="k")
        replay = await tx.enqueue("echo", {"text": "c"}, idempotency_key="k")
        assert (replay.job_id, replay.replayed) == (again.job_id, True)
        await tx.add_order(2)  # the transaction still works after the refusals
        await tx.commit()
    seen = await counts(db)
    assert (seen["jobs"], seen["outbox"], seen["orders"]) == (2, 2, 1)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_string_integer_is_refused_naming_the_field_and_draws_no_quota(
    kind: str, settings: Settings, db: Database
) -> None:
    """Strict as the API: {"rows": "5"} where export_csv says rows: int. Under a cap of
    one unfinished job, the refusal takes no part of it: the valid job after it fits."""
    capped = settings.model_copy(update={"quota_max_unfinished": 1, "quota_enqueue_rate": 0.0})
    async with app_tx(kind, capped) as tx:
        with pytest.raises(InvalidPayload) as refused:
            await tx.enqueue("export_csv", {"rows": "5"})
        errors = refused.value.errors  # type: ignore[attr-defined]
        assert [(e["loc"], e["type"]) for e in errors] == [(["rows"], "int_type")]
        accepted = await tx.enqueue("export_csv", {"rows": 5})
        await tx.commit()
    seen = await counts(db)
    assert (seen["jobs"], seen["outbox"]) == (1, 1)
    async with db.connection() as conn:
        cur = await conn.execute("SELECT payload FROM jobs WHERE id = %s", [accepted.job_id])
        row = await cur.fetchone()
    assert row is not None
    assert row["payload"]["rows"] == 5


async def test_a_payload_above_the_inline_limit_is_refused(
    settings: Settings, db: Database
) -> None:
    small = settings.model_copy(update={"inline_payload_max_bytes": 64})
    async with app_tx("psycopg_async", small) as tx:
        with pytest.raises(InvalidField) as refused:
            await tx.enqueue("echo", {"text": "x" * 100})
        assert refused.value.field == "payload"
        await tx.enqueue("echo", {"text": "x"})
        await tx.commit()
    assert (await counts(db))["jobs"] == 1


async def test_an_autocommit_connection_without_a_transaction_is_refused(
    settings: Settings, db: Database
) -> None:
    async with await psycopg.AsyncConnection.connect(
        settings.database_url, autocommit=True
    ) as conn:
        with pytest.raises(NotInTransaction):
            await enqueue_in(conn, default_registry, "echo", {"text": "a"}, tenant="t")
        async with conn.transaction():
            await enqueue_in(
                conn, default_registry, "echo", {"text": "a"}, tenant="t", settings=settings
            )
    assert (await counts(db))["jobs"] == 1


def test_a_session_on_another_driver_is_refused() -> None:
    engine = create_engine("sqlite://")
    with OrmSession(engine) as session, pytest.raises(UnsupportedConnection):
        enqueue_in_sync(session, default_registry, "echo", {"text": "a"}, tenant="t")


async def test_the_sync_variant_refuses_an_async_connection(settings: Settings) -> None:
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        with pytest.raises(UnsupportedConnection):
            enqueue_in_sync(conn, default_registry, "echo", {"text": "a"}, tenant="t")  # type: ignore[arg-type]


async def test_an_unknown_job_type_is_refused_before_any_statement(settings: Settings) -> None:
    async with app_tx("psycopg_async", settings) as tx:
        with pytest.raises(Exception, match="unknown job type"):
            await tx.enqueue(f"nope_{uuid.uuid4().hex[:6]}", {})
