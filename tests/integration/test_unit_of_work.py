"""The unit of work and the enqueue statement, against the real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from jobcore.access.apikeys import InvalidApiKey, authenticate_hash
from jobcore.amqp.topology import Topology
from jobcore.database import gateway as db_module
from jobcore.database.gateway import Database, fetch_all_behind, fetch_one
from jobcore.database.sql import Query
from jobcore.database.sql.jobs.reads import JOB_GET
from jobcore.examples.jobtypes import NoopPayload
from jobcore.execution.registry import default_registry
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.envelope import decode
from jobcore.kernel.errors import DatabaseUnavailable, IdempotencyConflict, ServiceStateError
from jobcore.kernel.settings import Settings
from jobcore.testing.jobtypes import EchoPayload
from jobcore.testing.waiting import eventually
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue, enqueue_many
from jobcore.usecases.enqueue.write_many import ItemStatus

COUNT = Query(
    "count",
    "Count jobs and outbox rows.",
    """
    SELECT (SELECT count(*) FROM jobcore.jobs) AS jobs,
           (SELECT count(*) FROM jobcore.outbox) AS outbox
""",
)


async def counts(db: Database) -> tuple[int, int]:
    async with db.unit_of_work() as uow:
        row = await fetch_one(uow, COUNT({}))
    assert row is not None
    return row["jobs"], row["outbox"]


async def test_unit_of_work_rolls_back_unless_committed(db: Database, topology: Topology) -> None:
    noop = default_registry.get("noop")
    async with db.unit_of_work() as uow:
        await enqueue(
            uow, topology, EnqueueRequest(tenant="t", job_type=noop, payload=NoopPayload())
        )
    assert await counts(db) == (0, 0)

    with pytest.raises(RuntimeError):
        async with db.unit_of_work() as uow:
            await enqueue(
                uow, topology, EnqueueRequest(tenant="t", job_type=noop, payload=NoopPayload())
            )
            raise RuntimeError("boom")
    assert await counts(db) == (0, 0)

    async with db.unit_of_work() as uow:
        result = await enqueue(
            uow, topology, EnqueueRequest(tenant="t", job_type=noop, payload=NoopPayload())
        )
        await uow.commit()
    assert await counts(db) == (1, 1)
    async with db.unit_of_work() as uow:
        job = await fetch_one(uow, JOB_GET({"id": result.job_id, "tenant": "t"}))
        other_tenant = await fetch_one(uow, JOB_GET({"id": result.job_id, "tenant": "u"}))
    assert job is not None
    assert job["status"] == "pending"
    assert other_tenant is None


async def test_enqueue_writes_a_job_message_and_notifies(
    db: Database, topology: Topology, settings: Settings
) -> None:
    echo = default_registry.get("echo")
    listener = await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True)
    await listener.execute(f"LISTEN {OUTBOX_CHANNEL}")
    async with db.unit_of_work() as uow:
        result = await enqueue(
            uow,
            topology,
            EnqueueRequest(
                tenant="t", job_type=echo, payload=EchoPayload(text="hi"), entity_id="order-1"
            ),
        )
        await uow.commit()
    notify = await asyncio.wait_for(anext(listener.notifies()), timeout=5)
    await listener.close()
    assert notify.channel == OUTBOX_CHANNEL

    async with db.connection() as conn:
        cur = await conn.execute("SELECT * FROM jobcore.outbox")
        rows = await cur.fetchall()
    assert len(rows) == 1
    row = rows[0]
    assert row["exchange"] == topology.jobs_exchange
    assert row["routing_key"] == "testq"
    assert row["job_id"] == result.job_id
    message = decode(bytes(row["body"]))
    assert (message.job_id, message.attempt, message.type) == (result.job_id, 1, "echo")


async def test_idempotency_key_replays_and_conflicts(db: Database, topology: Topology) -> None:
    echo = default_registry.get("echo")

    async def submit(text: str, key: str = "k1") -> uuid.UUID:
        async with db.unit_of_work() as uow:
            result = await enqueue(
                uow,
                topology,
                EnqueueRequest(
                    tenant="t", job_type=echo, payload=EchoPayload(text=text), idempotency_key=key
                ),
            )
            await uow.commit()
        return result.job_id

    first = await submit("a")
    assert await submit("a") == first
    assert await submit("a", key="k2") != first
    with pytest.raises(IdempotencyConflict):
        await submit("b")
    assert await counts(db) == (2, 2)


async def test_closed_pool_fails_fast_and_unreachable_database_translates(
    settings: Settings,
) -> None:
    database = Database(settings)
    with pytest.raises(ServiceStateError):
        database.unit_of_work().connection  # noqa: B018
    with pytest.raises(ServiceStateError):
        async with database.connection():
            pass
    unreachable = Database(
        settings.model_copy(
            update={
                "database_url": "postgresql://postgres@127.0.0.1:1/x",
                "db_connect_timeout": 1.0,
            }
        )
    )
    with pytest.raises(DatabaseUnavailable, match="JOBCORE_DATABASE_URL"):
        await unreachable.open(wait=True)


async def test_a_session_commits_each_statement_and_opens_transactions_on_its_connection(
    db: Database, topology: Topology
) -> None:
    noop = default_registry.get("noop")
    async with db.session() as session:
        # The enqueue is one statement: on a session it is committed when it returns.
        await enqueue(
            session, topology, EnqueueRequest(tenant="t", job_type=noop, payload=NoopPayload())
        )
        assert await counts(db) == (1, 1)
        pid = session.connection.info.backend_pid
        async with session.transaction() as uow:
            assert uow.connection.info.backend_pid == pid
            await enqueue(
                uow, topology, EnqueueRequest(tenant="t", job_type=noop, payload=NoopPayload())
            )
        assert await counts(db) == (1, 1)  # not committed: rolled back
        async with session.transaction() as uow:
            await enqueue(
                uow, topology, EnqueueRequest(tenant="t", job_type=noop, payload=NoopPayload())
            )
            await uow.commit()
        # The session's connection is still checked out and usable after its transactions.
        assert session.connection.info.backend_pid == pid
        assert session.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert await counts(db) == (2, 2)
    with pytest.raises(ServiceStateError):
        session.connection  # noqa: B018


async def test_a_pooled_connection_killed_while_idle_is_replaced_before_it_is_handed_out(
    settings: Settings,
) -> None:
    """The checkout check costs no round trip for a healthy connection, yet a connection
    whose server end went away (a restart, a terminated backend) never reaches a caller."""
    database = Database(settings, min_size=1, max_size=1)
    await database.open(wait=True)
    try:
        async with database.session() as session:
            victim = session.connection.info.backend_pid
        async with await psycopg.AsyncConnection.connect(
            settings.database_url, autocommit=True
        ) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (victim,))

            async def victim_is_gone() -> bool:
                cur = await admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (victim,)
                )
                row = await cur.fetchone()
                return row is not None and row[0] == 0

            await eventually(victim_is_gone, what=f"backend {victim} to end")
        async with database.session() as session:
            row = await fetch_one(session, COUNT({}))
            assert row is not None
            assert session.connection.info.backend_pid != victim
    finally:
        await database.close()


async def test_a_failed_transaction_on_a_session_rolls_back_and_leaves_it_usable(
    db: Database, topology: Topology
) -> None:
    noop = default_registry.get("noop")
    async with db.session() as session:
        pid = session.connection.info.backend_pid
        with pytest.raises(RuntimeError):
            async with session.transaction() as uow:
                await enqueue(
                    uow, topology, EnqueueRequest(tenant="t", job_type=noop, payload=NoopPayload())
                )
                raise RuntimeError("boom")
        assert session.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        async with session.transaction():
            # One at a time: a second BEGIN would only warn, and its COMMIT end the first.
            with pytest.raises(ServiceStateError):
                session.transaction()
        row = await fetch_one(session, COUNT({}))
        assert session.connection.info.backend_pid == pid
    assert row is not None
    assert (row["jobs"], row["outbox"]) == (0, 0)


async def test_the_checkout_check_queries_only_a_suspect_connection(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Quiet and recently used: no query. Idle longer than QUIET_CHECK_AFTER (a peer can
    vanish without closing the socket): a query before it is handed out."""
    queried: list[int] = []
    full_check = db_module.AsyncConnectionPool.check_connection

    async def counting_check(conn: db_module.AsyncConn) -> None:
        queried.append(conn.info.backend_pid)
        await full_check(conn)

    monkeypatch.setattr(db_module.AsyncConnectionPool, "check_connection", counting_check)
    database = Database(settings, min_size=1, max_size=1)
    await database.open(wait=True)
    try:
        for _ in range(3):
            async with database.session() as session:
                await fetch_one(session, COUNT({}))
        assert queried == []
        monkeypatch.setattr(db_module, "QUIET_CHECK_AFTER", 0.0)
        async with database.session() as session:
            await fetch_one(session, COUNT({}))
            pid = session.connection.info.backend_pid
        assert queried == [pid]
    finally:
        await database.close()


TXID = Query("txid", "This transaction's id.", "SELECT txid_current() AS txid")
FAIL = Query("fail", "A statement that fails.", "SELECT 1 / 0 AS never")


async def test_a_unit_of_work_can_begin_with_its_first_statement(
    db: Database, topology: Topology
) -> None:
    noop = default_registry.get("noop")
    async with db.unit_of_work(begin_with_first_statement=True) as uow:
        first = await fetch_one(uow, TXID({}))
        await enqueue(
            uow, topology, EnqueueRequest(tenant="t", job_type=noop, payload=NoopPayload())
        )
        second = await fetch_one(uow, TXID({}))
    # One transaction (BEGIN went out with the first statement), rolled back on exit.
    assert first is not None
    assert second is not None
    assert first["txid"] == second["txid"]
    assert await counts(db) == (0, 0)

    async with db.unit_of_work(begin_with_first_statement=True) as uow:
        await enqueue(
            uow, topology, EnqueueRequest(tenant="t", job_type=noop, payload=NoopPayload())
        )
        await uow.commit()
    assert await counts(db) == (1, 1)

    # A first statement that fails leaves an aborted transaction, rolled back on exit: the
    # pooled connection comes back clean.
    with pytest.raises(psycopg.errors.DivisionByZero):
        async with db.unit_of_work(begin_with_first_statement=True) as uow:
            await fetch_one(uow, FAIL({}))
    assert await counts(db) == (1, 1)

    # No statement at all: nothing to begin, commit or roll back.
    async with db.unit_of_work(begin_with_first_statement=True) as uow:
        await uow.commit()


async def test_a_batch_without_keys_commits_with_its_insert_and_one_with_keys_does_not(
    db: Database, topology: Topology
) -> None:
    """enqueue_many(commit=True) on a transaction begun with its first statement: a batch
    whose items have no idempotency or unique key is committed by its insert's round trip
    (visible to others before uow.commit(), which then does nothing); a keyed one is left
    to the caller's commit, as the holders of taken keys are read in its transaction."""
    noop = default_registry.get("noop")

    def batch(*keys: str | None) -> list[EnqueueRequest]:
        return [
            EnqueueRequest(tenant="t", job_type=noop, payload=NoopPayload(), idempotency_key=key)
            for key in keys
        ]

    async with db.session() as session:
        async with session.transaction(begin_with_first_statement=True) as uow:
            result = await enqueue_many(uow, topology, batch(None, None), commit=True)
            assert [o.status for o in result.outcomes] == [ItemStatus.CREATED] * 2
            assert await counts(db) == (2, 2)  # committed already, by another connection
            assert uow.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            await uow.commit()  # nothing left to commit: no statement, no warning
        async with session.transaction(begin_with_first_statement=True) as uow:
            result = await enqueue_many(uow, topology, batch("k1", "k1"), commit=True)
            assert [o.status for o in result.outcomes] == [
                ItemStatus.CREATED,
                ItemStatus.REPLAYED,
            ]
            assert await counts(db) == (2, 2)  # still the caller's to commit
            await uow.commit()
        assert await counts(db) == (3, 3)
        # Without commit the caller's unit of work stays open whatever the items.
        async with session.transaction(begin_with_first_statement=True) as uow:
            await enqueue_many(uow, topology, batch(None), commit=False)
            assert await counts(db) == (3, 3)
        assert await counts(db) == (3, 3)  # rolled back on exit


async def test_a_batch_requests_statements_are_planned_once_per_connection_on_a_generic_pool(
    settings: Settings, topology: Topology
) -> None:
    """As the API's pool runs them: the key lookup and the batch insert are prepared on
    their first run and planned generically, so later requests skip planning them."""
    noop = default_registry.get("noop")
    api_db = Database(settings, min_size=1, max_size=1, generic_plans=True)
    await api_db.open(wait=True)
    try:
        async with api_db.session() as session:
            for _ in range(3):
                with pytest.raises(InvalidApiKey):
                    await authenticate_hash(session, "no such key")
                async with session.transaction(begin_with_first_statement=True) as uow:
                    requests = [
                        EnqueueRequest(tenant="t", job_type=noop, payload=NoopPayload())
                    ] * 2
                    await enqueue_many(uow, topology, requests, commit=True)
            cur = await session.connection.execute(
                "SELECT statement LIKE %s AS insert, generic_plans, custom_plans"
                " FROM pg_prepared_statements ORDER BY 1",
                ["%unnest%INSERT INTO jobcore.jobs%"],
            )
            plans = await cur.fetchall()
    finally:
        await api_db.close()
    # The key lookup, then the insert; nothing else of theirs is prepared.
    assert [p["insert"] for p in plans] == [False, True]
    assert [p["custom_plans"] for p in plans] == [0, 0]
    assert all(p["generic_plans"] >= 3 for p in plans)


async def test_fetch_all_behind_with_commit_leaves_nothing_open_on_an_error(
    db: Database,
) -> None:
    """A failing statement skips the pipelined COMMIT: the exit rolls back, and the
    session's connection is usable again."""
    async with db.session() as session:
        with pytest.raises(psycopg.errors.DivisionByZero):
            async with session.transaction(begin_with_first_statement=True) as uow:
                await fetch_all_behind(uow, TXID({}), FAIL({}), commit=True)
        assert session.connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        async with session.transaction(begin_with_first_statement=True) as uow:
            rows = await fetch_all_behind(uow, TXID({}), TXID({}), commit=True)
            assert session.connection.info.transaction_status == (psycopg.pq.TransactionStatus.IDLE)
        assert len(rows) == 1


async def test_a_backend_waiting_for_a_lock_ends_when_its_client_goes_away(
    settings: Settings,
) -> None:
    """A statement queued behind a lock whose client gave up (it closed its connection at
    the operation timeout) is stopped by its server, not left waiting with a backend slot
    until the lock frees: behind a lock held by a vanished client, such backends pile up
    until the server refuses connections."""
    database = Database(settings, min_size=1, max_size=1)
    await database.open(wait=True)
    lock_key = 736_201
    try:
        async with (
            await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True) as holder,
            # Not the holder: within a transaction, pg_stat_activity is read once.
            await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True) as admin,
        ):
            await holder.execute("BEGIN")
            await holder.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key,))
            async with database.session() as session:
                conn = session.connection
                waiter = conn.info.backend_pid
                waiting = asyncio.create_task(
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (lock_key,))
                )

                async def backend_state() -> str | None:
                    cur = await admin.execute(
                        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                        (waiter,),
                    )
                    row = await cur.fetchone()
                    return None if row is None else str(row[0])

                async def waits_for_the_lock() -> bool:
                    return await backend_state() == "Lock"

                await eventually(waits_for_the_lock, what=f"backend {waiter} to wait")
                conn.pgconn.finish()  # the client goes away mid-statement
                with pytest.raises(psycopg.OperationalError):
                    await waiting

                async def waiter_is_gone() -> bool:
                    return await backend_state() is None

                await eventually(waiter_is_gone, timeout=10, what=f"backend {waiter} to end")
            # The lock was never released meanwhile: the backend ended on its own.
            cur = await holder.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND pid = pg_backend_pid()"
            )
            assert (await cur.fetchone()) == (1,)
            await holder.execute("ROLLBACK")
    finally:
        await database.close()
