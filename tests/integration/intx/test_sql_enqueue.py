"""jobcore.enqueue(), the enqueue from SQL: from psql (a subprocess, its own transactions)
and from a psycopg connection, against the real PostgreSQL (and RabbitMQ for the runs).

The SQL function mirrors the Python enqueue's statements (migrations 0026, 0029): a test here
compares the rows each writes for the same request, and that a request made through one
is replayed through the other (the same fingerprint).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import orjson
import psycopg
import pytest
from psycopg.rows import dict_row

from jobcore import enqueue_in
from jobcore.database.gateway import Database
from jobcore.execution.job_type_records import record_job_types
from jobcore.execution.registry import default_registry
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.priorities import Priority
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from jobcore.usecases import quotas as quota_usecases
from tests.integration.intx.test_enqueue_in_transaction import (
    counts,
    limited,
    next_notify,
    send_marker,
)
from tests.integration.relay.helpers import running_relay
from tests.integration.worker.conftest import StartWorker

pytestmark = pytest.mark.usefixtures("orders")

PSQL_TIMEOUT = 60.0


@pytest.fixture
async def listener(settings: Settings) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    conn = await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True)
    await conn.execute(f"LISTEN {OUTBOX_CHANNEL}")
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
async def registered(settings: Settings, db: Database) -> None:
    """The job types a worker of these settings records when it starts."""
    async with db.connection() as conn:
        await record_job_types(conn, default_registry, settings, registered_by="tests")


def psql(settings: Settings, script: str) -> subprocess.CompletedProcess[str]:
    """Run ``script`` in psql against the test's database: stop at the first error, which
    is printed with its SQLSTATE."""
    binary = shutil.which("psql")
    assert binary is not None, "psql is not installed"
    return subprocess.run(
        [binary, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", settings.database_url],
        input="\\set VERBOSITY verbose\n" + script,
        capture_output=True,
        text=True,
        timeout=PSQL_TIMEOUT,
        check=False,
    )


def job_ids(output: str) -> list[uuid.UUID]:
    return [uuid.UUID(line) for line in output.split() if len(line) == 36]


def refused(result: subprocess.CompletedProcess[str], sqlstate: str, *words: str) -> None:
    """psql stopped at an error with this SQLSTATE whose message has these words."""
    assert result.returncode == 3, result.stderr
    assert f"ERROR:  {sqlstate}: jobcore_enqueue:" in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


async def job_status(db: Database, job_id: uuid.UUID) -> dict[str, Any] | None:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT status, attempts, last_error, published_message_id,"
            " EXISTS (SELECT 1 FROM inbox WHERE message_id = jobs.id) AS received_as_its_id"
            " FROM jobs WHERE id = %s",
            [job_id],
        )
        return await cur.fetchone()


async def test_psql_enqueue_and_commit_runs_the_job_once(
    wsettings: Settings,
    db: Database,
    listener: psycopg.AsyncConnection[Any],
    start_worker: StartWorker,
) -> None:
    # The worker records its job types when it starts: nothing else registers them here.
    async with running_relay(wsettings, db):
        await start_worker()
        result = await asyncio.to_thread(
            psql,
            wsettings,
            """
            BEGIN;
            INSERT INTO orders VALUES (1, 10);
            SELECT jobcore.enqueue('echo', '{"text": "receipt 1"}', tenant => 't');
            COMMIT;
            """,
        )
        assert result.returncode == 0, result.stderr
        [job_id] = job_ids(result.stdout)

        async def succeeded() -> bool:
            row = await job_status(db, job_id)
            return row is not None and row["status"] == "succeeded"

        await eventually(succeeded, timeout=30, what="the job to succeed")
    row = await job_status(db, job_id)
    assert row is not None
    assert row["attempts"] == 1
    # Its message had the job's id (migration 0046): the inbox recorded that id, and a
    # publish (when a relay took the row, not the worker) is kept without a copy of it.
    assert (row["received_as_its_id"], row["published_message_id"]) == (True, None)
    seen = await counts(db)
    assert (seen["jobs"], seen["orders"]) == (1, 1)


async def test_psql_enqueue_and_rollback_leaves_nothing(
    settings: Settings, db: Database, registered: None, listener: psycopg.AsyncConnection[Any]
) -> None:
    result = psql(
        limited(settings),
        """
        BEGIN;
        INSERT INTO orders VALUES (1, 10);
        SELECT jobcore.enqueue('echo', '{"text": "receipt 1"}', tenant => 't',
                               idempotency_key => 'k', ordering_key => 'o');
        ROLLBACK;
        """,
    )
    assert result.returncode == 0, result.stderr
    assert len(job_ids(result.stdout)) == 1
    assert await counts(db) == {"jobs": 0, "outbox": 0, "orders": 0, "usage": 0, "deltas": 0}
    async with db.connection() as conn:
        gates = await (await conn.execute("SELECT count(*) AS n FROM job_gates")).fetchone()
    assert gates is not None
    assert gates["n"] == 0
    await send_marker(db)
    assert await next_notify(listener) == "marker"  # the rolled-back enqueue woke no relay


async def test_a_job_and_its_notify_appear_at_the_commit(
    settings: Settings, db: Database, registered: None, listener: psycopg.AsyncConnection[Any]
) -> None:
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        await conn.execute("INSERT INTO orders VALUES (1, 10)")
        cur = await conn.execute(
            "SELECT jobcore.enqueue('echo', %s::jsonb, tenant => 't')", ['{"text": "a"}']
        )
        row = await cur.fetchone()
        assert row is not None
        assert isinstance(row[0], uuid.UUID)
        assert (await counts(db))["jobs"] == 0  # not visible to another connection yet
        await send_marker(db)
        assert await next_notify(listener) == "marker"  # no relay woken yet
        await conn.commit()
    assert await next_notify(listener) == ""  # the function's NOTIFY, sent by the commit
    seen = await counts(db)
    assert (seen["jobs"], seen["outbox"], seen["orders"]) == (1, 1, 1)


async def test_an_unknown_job_type_is_refused(settings: Settings, registered: None) -> None:
    result = psql(settings, "SELECT jobcore.enqueue('no_such_type', '{}', tenant => 't');")
    refused(result, "JC404", "unknown job type 'no_such_type'", "COLUMN NAME:  job_type")


async def test_without_a_registering_worker_no_type_is_known(settings: Settings) -> None:
    result = psql(settings, "SELECT jobcore.enqueue('echo', '{\"text\": \"a\"}', tenant => 't');")
    refused(result, "JC404", "no worker has registered it")


async def test_a_payload_above_the_inline_limit_is_refused(
    settings: Settings, db: Database
) -> None:
    async with db.connection() as conn:
        small = settings.model_copy(update={"inline_payload_max_bytes": 64})
        await record_job_types(conn, default_registry, small, registered_by="tests")
    result = psql(
        settings,
        f"""
        BEGIN;
        SELECT jobcore.enqueue('echo', '{{"text": "{"x" * 100}"}}', tenant => 't');
        """,
    )
    refused(result, "JC413", "more than the 64", "COLUMN NAME:  payload")
    result = psql(settings, "SELECT jobcore.enqueue('echo', '{\"text\": \"x\"}', tenant => 't');")
    assert result.returncode == 0, result.stderr
    assert (await counts(db))["jobs"] == 1


async def test_bad_arguments_name_their_field(settings: Settings, registered: None) -> None:
    cases = {
        "payload": "'[1]'::jsonb, tenant => 't'",
        "tenant": "'{}', tenant => ''",
        "idempotency_key": "'{}', tenant => 't', idempotency_key => ''",
        "priority": "'{}', tenant => 't', priority => 'urgent'",
        "delay": "'{}', tenant => 't', run_at => now(), delay => '1 minute'",
        "run_at": "'{}', tenant => 't', run_at => now() + interval '400 days'",
        "max_attempts": "'{}', tenant => 't', max_attempts => 0",
        "admission": "'{}', tenant => 't', admission => NULL",
    }
    for field, arguments in cases.items():
        result = psql(settings, f"SELECT jobcore.enqueue('echo', {arguments});")
        refused(result, "JC400", f"COLUMN NAME:  {field}")


async def test_an_idempotency_key_replays_the_same_request_and_refuses_another(
    settings: Settings, db: Database, registered: None
) -> None:
    enqueue = (
        "SELECT jobcore.enqueue('echo', '{{\"text\": \"{}\"}}', tenant => 't',"
        " idempotency_key => 'k');"
    )
    result = psql(settings, enqueue.format("a") + enqueue.format("a"))
    assert result.returncode == 0, result.stderr
    first, again = job_ids(result.stdout)
    assert first == again
    refused(psql(settings, enqueue.format("b")), "JC422", f"already used for job {first}")
    assert (await counts(db))["jobs"] == 1


async def test_only_a_job_with_an_idempotency_key_keeps_its_requests_fingerprint(
    settings: Settings, db: Database, registered: None
) -> None:
    # As the Python path does: the fingerprint is read only to tell a replay of a key from
    # another request (migration 0044).
    enqueue = "SELECT jobcore.enqueue('echo', '{{\"text\": \"a\"}}', tenant => 't'{});"
    result = psql(settings, enqueue.format(", idempotency_key => 'k'") + enqueue.format(""))
    assert result.returncode == 0, result.stderr
    keyed, plain = job_ids(result.stdout)
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT id, payload_fingerprint FROM jobcore.jobs WHERE id = ANY(%s)",
            ([keyed, plain],),
        )
        kept = {row["id"]: row["payload_fingerprint"] for row in await cur.fetchall()}
    assert len(kept[keyed]) == 64
    assert kept[plain] is None
    # And the key still tells a replay from another request.
    again = psql(settings, enqueue.format(", idempotency_key => 'k'"))
    assert job_ids(again.stdout) == [keyed]
    refused(
        psql(settings, enqueue.format(", idempotency_key => 'k'").replace('"a"', '"b"')),
        "JC422",
        f"already used for job {keyed}",
    )


async def test_a_live_job_holding_the_unique_key_refuses_another(
    settings: Settings, db: Database, registered: None
) -> None:
    # An explicit unique key, and the one sync_account takes from its payload's account.
    for call in (
        "SELECT jobcore.enqueue('echo', '{\"text\": \"a\"}', tenant => 't', unique_key => 'u');",
        "SELECT jobcore.enqueue('sync_account', '{\"account\": \"acct-1\"}', tenant => 't');",
    ):
        result = psql(settings, call)
        assert result.returncode == 0, result.stderr
        [holder] = job_ids(result.stdout)
        refused(psql(settings, call), "JC409", f"job {holder} (pending) holds this unique key")
    # The refusal leaves a caller's transaction usable once it rolls back to a savepoint.
    result = psql(
        settings,
        """
        BEGIN;
        INSERT INTO orders VALUES (1, 10);
        SAVEPOINT enqueue;
        \\set ON_ERROR_STOP 0
        SELECT jobcore.enqueue('echo', '{"text": "b"}', tenant => 't', unique_key => 'u');
        \\set ON_ERROR_STOP 1
        ROLLBACK TO SAVEPOINT enqueue;
        COMMIT;
        """,
    )
    assert result.returncode == 0, result.stderr
    assert "JC409" in result.stderr
    seen = await counts(db)
    assert (seen["jobs"], seen["orders"]) == (2, 1)


async def test_the_tenants_quotas_refuse_as_the_python_path_does(
    settings: Settings, db: Database, registered: None
) -> None:
    await quota_usecases.set_quotas(db, "capped", max_unfinished=1)
    enqueue = "SELECT jobcore.enqueue('echo', '{\"text\": \"a\"}', tenant => 'capped');"
    assert psql(settings, enqueue).returncode == 0
    refused(psql(settings, enqueue), "JC429", "the tenant has 1 unfinished jobs, its limit")
    await quota_usecases.set_quotas(db, "slow", enqueue_rate=0.01, enqueue_burst=1)
    # The rate limit's bucket is drawn from by the exact admission only.
    enqueue = enqueue.replace("capped", "slow").replace(");", ", admission => 'exact');")
    assert psql(settings, enqueue).returncode == 0
    refused(psql(settings, enqueue), "JC429", "enqueue rate limit (0.01/s, bursts of 1)")
    # A transaction above READ COMMITTED would read the quotas in an old snapshot.
    result = psql(settings, f"BEGIN ISOLATION LEVEL REPEATABLE READ; {enqueue}")
    refused(result, "JC400", "needs read committed")


# Values whose JSON Python and PostgreSQL both write the same way: nested objects with
# keys out of order, arrays, non-ASCII and escaped characters, floats and integers.
PAYLOAD = {"text": 'caf\u00e9 "quoted"\n\ttab \\ \u0001', "count": 2}
TRICKY = {
    "z": [1, 2.5, {"b": True, "a": None}],
    "A": "x",
    "\u00e9": 0.1,
    "n": -3,
    # Not 1.25e16 nor 5e-324: jsonb keeps such a number as the integer or the decimal
    # it is, not as the float it was (docs/how-to/enqueue-in-transaction.md).
    "floats": [0.0, -0.5, 100.0, 1.25e-5, 1e-7, 2.5e-7, 1e15, 123456.789],
}


@pytest.mark.parametrize("admission", ["approximate", "exact"])
async def test_sql_writes_the_rows_the_python_path_writes(
    admission: str, settings: Settings, db: Database, registered: None
) -> None:
    """The same request through enqueue_in and through jobcore_enqueue, with the same
    admission: the same job and outbox columns, the same admission row (the exact one
    charges the tenant's rate limit, the approximate one writes no usage row), and each
    replays the other's request (their fingerprints agree)."""
    settings = limited(settings)
    async with db.connection() as conn:
        await record_job_types(conn, default_registry, settings, registered_by="tests")
    options = {"ordering_key": "o", "priority": "high", "max_attempts": 2, "entity_id": "e1"}
    for tenant, key in (("py", "k-py"), ("sql", "k-sql")):
        async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
            if tenant == "py":
                await enqueue_in(
                    conn,
                    default_registry,
                    "echo",
                    PAYLOAD,
                    tenant=tenant,
                    settings=settings,
                    idempotency_key=key,
                    ordering_key="o",
                    priority=Priority.HIGH,
                    max_attempts=2,
                    entity_id="e1",
                    admission=admission,
                )
            else:
                await conn.execute(
                    "SELECT jobcore.enqueue('echo', %(p)s::jsonb, tenant => %(t)s, "
                    "idempotency_key => %(k)s, ordering_key => %(ordering_key)s, "
                    "priority => %(priority)s, max_attempts => %(max_attempts)s, "
                    "entity_id => %(entity_id)s, admission => %(admission)s)",
                    {
                        "p": psycopg.types.json.Jsonb(PAYLOAD),
                        "t": tenant,
                        "k": key,
                        "admission": admission,
                        **options,
                    },
                )
            await conn.commit()
    async with await psycopg.AsyncConnection.connect(
        settings.database_url, row_factory=dict_row
    ) as conn:
        jobs = await (
            await conn.execute(
                "SELECT j.*, o.exchange, o.routing_key, o.message_type, o.headers,"
                " convert_from(o.body, 'UTF8') AS body, o.tenant AS o_tenant,"
                " o.priority AS o_priority, o.available_at - j.created_at AS o_delay,"
                " o.message_id = j.id AS message_is_the_jobs,"
                " u.rate_tat IS NOT NULL AS charged,"
                " (SELECT count(*) FROM tenant_usage_deltas d WHERE d.tenant = j.tenant)"
                " AS deltas"
                " FROM jobs j JOIN outbox o ON o.job_id = j.id"
                " LEFT JOIN tenant_usage u ON u.tenant = j.tenant ORDER BY j.tenant"
            )
        ).fetchall()
        py, sql = sorted(jobs, key=lambda r: r["tenant"] != "py")
        ids = {"py": py["id"], "sql": sql["id"]}
        assert sql["body"] == py["body"].replace(str(py["id"]), str(sql["id"]))
        for varying in ("id", "tenant", "o_tenant", "idempotency_key", "body", "o_delay"):
            py.pop(varying), sql.pop(varying)
        for column in [c for c, value in py.items() if isinstance(value, datetime)]:
            py.pop(column), sql.pop(column)
        assert sql == py
        assert (py["charged"], py["deltas"]) == (admission == "exact", 1)
        assert py["message_is_the_jobs"]
        # Each path replays the other's request: the same fingerprint for the same request.
        for tenant, key in (("py", "k-py"), ("sql", "k-sql")):
            row = await (
                await conn.execute(
                    "SELECT jobcore.enqueue('echo', %(p)s::jsonb, tenant => %(t)s,"
                    " idempotency_key => %(k)s, ordering_key => 'o', priority => 'high',"
                    " max_attempts => 2, entity_id => 'e1', admission => %(a)s) AS id",
                    {"p": psycopg.types.json.Jsonb(PAYLOAD), "t": tenant, "k": key, "a": admission},
                )
            ).fetchone()
            assert row == {"id": ids[tenant]}
            await conn.rollback()
        cur = await conn.execute("SELECT count(*) AS n FROM jobs")
        assert (await cur.fetchone()) == {"n": 2}


async def test_the_fingerprint_of_nested_json_is_pythons(
    settings: Settings, db: Database, registered: None
) -> None:
    """Keys in code point order, no whitespace, floats as Python writes them: the payload
    a Python caller sent first is the same request from SQL."""
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        first = await enqueue_in(
            conn,
            default_registry,
            "sync_account",
            {"account": "a", "note": "n"},
            tenant="t",
            settings=settings,
            idempotency_key="k",
            unique_key="u",
        )
        await conn.commit()
        cur = await conn.execute(
            "SELECT jobcore_canonical_json(%s::jsonb)",
            [psycopg.types.json.Jsonb(TRICKY)],
        )
        row = await cur.fetchone()
        assert row is not None
        assert row[0] == orjson.dumps(TRICKY, option=orjson.OPT_SORT_KEYS).decode()
        cur = await conn.execute(
            'SELECT jobcore.enqueue(\'sync_account\', \'{"note": "n", "account": "a"}\','
            " tenant => 't', idempotency_key => 'k', unique_key => 'u')"
        )
        again = await cur.fetchone()
        assert again is not None
        assert again[0] == first.job_id


async def test_a_payload_its_model_refuses_fails_its_job_at_once(
    wsettings: Settings, db: Database, start_worker: StartWorker
) -> None:
    async with running_relay(wsettings, db):
        await start_worker()
        result = await asyncio.to_thread(
            psql,
            wsettings,
            "SELECT jobcore.enqueue('echo', '{\"txt\": \"typo\"}', tenant => 't');",
        )
        assert result.returncode == 0, result.stderr
        [job_id] = job_ids(result.stdout)

        async def failed() -> dict[str, Any] | None:
            row = await job_status(db, job_id)
            return row if row is not None and row["status"] == "failed" else None

        row = await eventually(failed, timeout=30, what="the job to fail")
    assert row is not None
    assert row["attempts"] == 1  # no retry, though echo allows 3
    assert row["last_error"].startswith("payload does not validate against the job type's model")
    assert "text: Field required" in row["last_error"]
    assert "txt: Extra inputs are not permitted" in row["last_error"]


def test_only_granted_roles_may_call_it(settings: Settings, registered: None) -> None:
    role = f"jobcore_app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(settings.database_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role}")
        try:
            with admin.transaction(force_rollback=True):
                admin.execute(f"SET LOCAL ROLE {role}")
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    admin.execute("SELECT jobcore.enqueue('echo', '{\"text\": \"a\"}', 't')")
            admin.execute(f"GRANT USAGE ON SCHEMA jobcore TO {role}")
            admin.execute(
                "GRANT EXECUTE ON FUNCTION jobcore.enqueue(text, jsonb, text, text, text, text,"
                f" text, timestamptz, interval, integer, text, text) TO {role}"
            )
            with admin.transaction(force_rollback=True):
                admin.execute(f"SET LOCAL ROLE {role}")
                # EXECUTE is enough: the role has no privilege on jobcore's tables.
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    admin.execute("SELECT count(*) FROM jobcore.jobs")
            with admin.transaction(force_rollback=True):
                admin.execute(f"SET LOCAL ROLE {role}")
                row = admin.execute(
                    "SELECT jobcore.enqueue('echo', '{\"text\": \"a\"}', 't')"
                ).fetchone()
                assert row is not None
                assert isinstance(row[0], uuid.UUID)
        finally:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


async def test_a_worker_records_its_types_once(
    settings: Settings, db: Database, registered: None
) -> None:
    async with db.connection() as conn:
        again = await record_job_types(conn, default_registry, settings, registered_by="other")
        cur = await conn.execute(
            "SELECT type, queue, exchange, unique_field, max_payload_bytes, schema_hash"
            " FROM job_type_registry WHERE type IN ('echo', 'sync_account') ORDER BY type"
        )
        rows = await cur.fetchall()
    assert again == 0  # nothing changed: no row written
    assert [(r["type"], r["queue"], r["unique_field"]) for r in rows] == [
        ("echo", "testq", None),
        ("sync_account", "testq", "account"),
    ]
    assert all(r["exchange"] == f"{settings.amqp_prefix}.jobs" for r in rows)
    assert all(r["max_payload_bytes"] == settings.inline_payload_max_bytes for r in rows)
    assert all(len(r["schema_hash"]) == 64 for r in rows)
