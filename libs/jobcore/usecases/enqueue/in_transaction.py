"""Enqueue in the application's own transaction: :func:`enqueue_in` (SQLAlchemy
``AsyncSession``, psycopg ``AsyncConnection``) and :func:`enqueue_in_sync` (SQLAlchemy
``Session``, psycopg ``Connection``).

The job is written by the same use case as ``POST /jobs/{type}``
(:func:`jobcore.usecases.enqueue.submit.enqueue` with an
:class:`~jobcore.usecases.enqueue.submit.EnqueueRequest`): one statement writes the job, its outbox
message and the tenant's admission rows, on the caller's connection and inside the caller's open
transaction. By default its quotas are admitted approximately
(:class:`jobcore.kernel.quotas.Admission`): the caller's transaction may stay open for long, and an
exact admission would hold the tenant's usage row until it ends, making every other enqueue of the
tenant wait. Nothing here commits or rolls back the caller's transaction, so the job exists exactly
when the caller's own writes commit, and the statement's NOTIFY reaches the relays only then
(PostgreSQL delivers notifications at commit, and drops them on rollback).

A refusal (an invalid field, a unique key taken, a quota, an idempotency key reused with
a different request) is raised as the API's typed error after the statement's writes are
undone to a savepoint, so the caller's transaction stays usable. This is trusted code: no
API key is checked, the caller names the tenant (docs/how-to/enqueue-in-transaction.md).

The statements are jobcore's own, run on the caller's connection through a cursor with
an explicit dict row factory, whatever rows, cursor class or adapters the caller's
connection uses by default. The synchronous variant runs the same coroutine on the
caller's blocking connection: every statement there completes before it returns, so the
coroutine never suspends and no event loop is involved.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Coroutine, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

import orjson
import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow, dict_row
from pydantic import BaseModel

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Session
from jobcore.execution.payloads import validate_payload
from jobcore.execution.registry import Registry
from jobcore.kernel.errors import InvalidField, JobcoreError
from jobcore.kernel.priorities import Priority
from jobcore.kernel.quotas import UNLIMITED, Admission, Quotas
from jobcore.kernel.settings import DEFAULT_SCHEMA, Settings
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue
from jobcore.usecases.enqueue.write_one import EnqueueResult

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.orm import Session as OrmSession

    AsyncTransaction = AsyncSession | psycopg.AsyncConnection[Any]
    SyncTransaction = OrmSession | psycopg.Connection[Any]

__all__ = [
    "NotInTransaction",
    "UnsupportedConnection",
    "UnsupportedIsolation",
    "enqueue_in",
    "enqueue_in_sync",
]

# The savepoint an enqueue's writes are undone to when it is refused.
SAVEPOINT = "jobcore_enqueue"


class NotInTransaction(JobcoreError):
    """The connection has no transaction an enqueue could join (autocommit and idle, or
    its transaction already failed)."""


class UnsupportedConnection(JobcoreError):
    """Not a psycopg 3 connection, nor a SQLAlchemy session over one."""


class UnsupportedIsolation(JobcoreError):
    """The caller's transaction is above READ COMMITTED and the enqueue has quotas: the
    tenant's cap would be read in the transaction's snapshot, blind to what committed
    since it was taken, and a rate-limited tenant's usage row updated meanwhile would fail
    the transaction with a serialization error."""


async def enqueue_in(
    tx: AsyncTransaction,
    registry: Registry,
    job_type: str,
    payload: Any,
    *,
    tenant: str,
    settings: Settings | None = None,
    idempotency_key: str | None = None,
    unique_key: str | None = None,
    entity_id: str | None = None,
    max_attempts: int | None = None,
    run_at: datetime | None = None,
    delay: float | None = None,
    priority: Priority | None = None,
    ordering_key: str | None = None,
    quotas: Quotas | None = None,
    admission: Admission | str = Admission.APPROXIMATE,
) -> EnqueueResult:
    """Write a job of ``job_type`` (registered in ``registry``) for ``tenant`` in the open
    transaction of ``tx``: a SQLAlchemy ``AsyncSession`` on the psycopg driver (its
    current transaction, begun if none is) or a psycopg ``AsyncConnection``.

    ``payload``: a mapping, or an instance of the job type's model; validated by the
    model as ``POST /jobs/{type}`` validates it. The options are those of
    :class:`~jobcore.usecases.enqueue.submit.EnqueueRequest`, with the same rules and errors.
    ``settings``: the deployment's (exchange names, tenant quota defaults, the inline
    payload limit); None reads them from the environment.

    ``quotas``: the quotas of a tenant without its own (``tenant_quotas``); None: the
    deployment's defaults, as for the API. ``admission`` (:class:`~jobcore.kernel.quotas.
    Admission`): ``"approximate"``, the quotas read as committed with no lock held, so
    that a long transaction makes no other enqueue of the tenant wait; transactions open
    together can pass the tenant's cap by the jobs they hold uncommitted, and the rate
    limit refuses when the tenant's bucket is empty without drawing from it.
    ``"exact"``: the API's admission, under the lock of the tenant's usage row, held until
    the caller's transaction ends: the tenant's other enqueues, the API's too, wait for
    that commit.

    Refused, it raises the API's typed error (:class:`~jobcore.kernel.errors.InvalidField`,
    :class:`~jobcore.kernel.errors.InvalidPayload`, :class:`~jobcore.kernel.errors.UniqueJobExists`,
    :class:`~jobcore.kernel.errors.QuotaExceeded`,
    :class:`~jobcore.kernel.errors.IdempotencyConflict`) with the transaction usable. A payload
    whose JSON is larger than ``inline_payload_max_bytes`` is refused (``InvalidField`` on
    ``payload``): such a payload would go to the object store before the insert, and a rollback
    would leave it there. A database error (the caller's lock or statement timeout) is psycopg's,
    also undone to the savepoint. Never commits: the job is visible, and the relays
    woken, when the caller commits.
    """
    conn = await _async_connection(tx)
    _check_in_transaction(conn)
    return await _enqueue(
        _AsyncStatements(conn),
        registry,
        job_type,
        payload,
        tenant=tenant,
        settings=settings,
        admission=Admission(admission),
        options={
            "idempotency_key": idempotency_key,
            "unique_key": unique_key,
            "entity_id": entity_id,
            "max_attempts": max_attempts,
            "run_at": run_at,
            "delay": delay,
            "priority": priority,
            "ordering_key": ordering_key,
        },
        quotas=quotas,
    )


def enqueue_in_sync(
    tx: SyncTransaction,
    registry: Registry,
    job_type: str,
    payload: Any,
    *,
    tenant: str,
    settings: Settings | None = None,
    idempotency_key: str | None = None,
    unique_key: str | None = None,
    entity_id: str | None = None,
    max_attempts: int | None = None,
    run_at: datetime | None = None,
    delay: float | None = None,
    priority: Priority | None = None,
    ordering_key: str | None = None,
    quotas: Quotas | None = None,
    admission: Admission | str = Admission.APPROXIMATE,
) -> EnqueueResult:
    """:func:`enqueue_in` for a SQLAlchemy ``Session`` on the psycopg driver or a psycopg
    ``Connection``: the same arguments, errors and guarantees, blocking."""
    conn = _sync_connection(tx)
    _check_in_transaction(conn)
    return _run_to_end(
        _enqueue(
            _SyncStatements(conn),
            registry,
            job_type,
            payload,
            tenant=tenant,
            settings=settings,
            admission=Admission(admission),
            options={
                "idempotency_key": idempotency_key,
                "unique_key": unique_key,
                "entity_id": entity_id,
                "max_attempts": max_attempts,
                "run_at": run_at,
                "delay": delay,
                "priority": priority,
                "ordering_key": ordering_key,
            },
            quotas=quotas,
        )
    )


async def _enqueue(
    statements: _AsyncStatements | _SyncStatements,
    registry: Registry,
    job_type: str,
    payload: Any,
    *,
    tenant: str,
    settings: Settings | None,
    admission: Admission,
    options: Mapping[str, Any],
    quotas: Quotas | None,
) -> EnqueueResult:
    settings = _environment_settings() if settings is None else settings
    # The gateway names jobcore's tables in this schema (jobcore.database.gateway.schema_of):
    # the caller's connection has the application's search_path, which may not include it.
    statements.jobcore_schema = settings.database_schema
    kind = registry.get(job_type)
    raw = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
    model = validate_payload(kind, raw)
    request = EnqueueRequest(tenant=tenant, job_type=kind, payload=model, sent=raw, **options)
    size = len(orjson.dumps(request.document))
    if size > settings.inline_payload_max_bytes:
        raise InvalidField(
            "payload",
            f"{size} bytes of JSON, more than the {settings.inline_payload_max_bytes} an "
            "enqueue in a transaction keeps inline (JOBCORE_INLINE_PAYLOAD_MAX_BYTES); "
            "store large data yourself and pass its key",
            kind="too_large",
        )
    limits = settings.quota_defaults if quotas is None else quotas
    if limits != UNLIMITED:
        await _check_read_committed(statements)
    await statements.execute(f"SAVEPOINT {SAVEPOINT}", None)
    try:
        # The gateway runs its statements on anything with execute() that is neither a
        # jobcore Session nor a psycopg connection (jobcore.database.gateway._send): here, a cursor
        # with dict rows on the caller's connection.
        result = await enqueue(
            cast(Session, statements),
            _topology(settings),
            request,
            quotas=limits,
            admission=admission,
        )
    except BaseException:
        # Should this fail too (the connection lost), the caller's transaction is gone
        # anyway: the enqueue's own error is the one to see.
        if not statements.closed:
            with contextlib.suppress(psycopg.Error):
                await statements.execute(f"ROLLBACK TO SAVEPOINT {SAVEPOINT}", None)
                await statements.execute(f"RELEASE SAVEPOINT {SAVEPOINT}", None)
        raise
    await statements.execute(f"RELEASE SAVEPOINT {SAVEPOINT}", None)
    return result


@functools.cache
def _environment_settings() -> Settings:
    """The settings an enqueue without ``settings=`` uses: the environment's, parsed on
    first use and kept. An enqueue runs inside the caller's transaction, often one of
    many in a request: parsing the environment each time would cost every one of them."""
    return Settings()


# Topology per settings object (by identity: settings are not hashable), dropped with it.
_topologies: dict[int, Topology] = {}


def _topology(settings: Settings) -> Topology:
    """The topology of ``settings``, built once for the object a caller passes each time."""
    key = id(settings)
    topology = _topologies.get(key)
    if topology is None:
        topology = _topologies[key] = Topology.from_settings(settings)
        # Before the id can be reused by another object.
        weakref.finalize(settings, _topologies.pop, key, None)
    return topology


async def _check_read_committed(statements: _AsyncStatements | _SyncStatements) -> None:
    """Refuse a transaction above READ COMMITTED: the quotas' checks read the tenant's
    unfinished jobs and usage as committed now, which only READ COMMITTED's fresh snapshot
    per statement shows. The server's setting, so a SET TRANSACTION counts."""
    cursor = await statements.execute(
        "SELECT current_setting('transaction_isolation') AS level", None
    )
    row = await cursor.fetchone()
    level = None if row is None else row["level"]
    if level != "read committed":
        raise UnsupportedIsolation(
            f"the transaction's isolation is {level}; an enqueue with quotas needs read "
            "committed (its tenant's cap would be read in an old snapshot), or pass "
            "quotas=UNLIMITED for a tenant without quotas"
        )


def _check_in_transaction(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    status = conn.info.transaction_status
    if status == TransactionStatus.INERROR:
        raise NotInTransaction("the connection's transaction has failed; roll it back first")
    if status == TransactionStatus.IDLE and conn.autocommit:
        # Each statement would commit on its own: the job would not wait for the caller.
        raise NotInTransaction(
            "the connection is in autocommit mode with no transaction open; "
            "enqueue inside `with conn.transaction():`"
        )


async def _async_connection(tx: AsyncTransaction) -> psycopg.AsyncConnection[Any]:
    if isinstance(tx, psycopg.AsyncConnection):
        return tx
    from sqlalchemy.ext.asyncio import AsyncSession  # only for a caller that has one

    if not isinstance(tx, AsyncSession):
        raise UnsupportedConnection(
            f"enqueue_in takes a SQLAlchemy AsyncSession or a psycopg AsyncConnection, "
            f"not {type(tx).__name__} (blocking ones: enqueue_in_sync)"
        )
    # The session's current transaction's connection (begun if none is).
    sa_conn = await tx.connection()
    raw = await sa_conn.get_raw_connection()
    driver = raw.driver_connection
    if not isinstance(driver, psycopg.AsyncConnection):
        raise UnsupportedConnection(
            "the AsyncSession's driver is not psycopg 3 (use a postgresql+psycopg:// URL)"
        )
    return driver


def _sync_connection(tx: SyncTransaction) -> psycopg.Connection[Any]:
    if isinstance(tx, psycopg.Connection):
        return tx
    from sqlalchemy.orm import Session as OrmSession  # only for a caller that has one

    if not isinstance(tx, OrmSession):
        raise UnsupportedConnection(
            f"enqueue_in_sync takes a SQLAlchemy Session or a psycopg Connection, "
            f"not {type(tx).__name__}"
        )
    # The session's current transaction's connection (begun if none is).
    driver = tx.connection().connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        raise UnsupportedConnection(
            "the Session's driver is not psycopg 3 (use a postgresql+psycopg:// URL)"
        )
    return driver


def _run_to_end(coroutine: Coroutine[Any, Any, EnqueueResult]) -> EnqueueResult:
    """Run a coroutine whose every await completes at once (statements on a blocking
    connection) to its end, without an event loop."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        result: EnqueueResult = done.value
        return result
    coroutine.close()
    raise RuntimeError("an enqueue on a blocking connection waited for an event loop")


class _AsyncStatements:
    """The caller's asynchronous connection, as the statement gateway uses it."""

    jobcore_schema = DEFAULT_SCHEMA

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    @property
    def closed(self) -> bool:
        return self._conn.closed

    async def execute(
        self, query: str, params: Mapping[str, Any] | None
    ) -> psycopg.AsyncCursor[DictRow]:
        cursor = psycopg.AsyncCursor(self._conn, row_factory=dict_row)
        await cursor.execute(query, params)
        return cursor


class _SyncStatements:
    """The caller's blocking connection, as the statement gateway uses it: each method
    completes before it returns, so awaiting it never suspends."""

    jobcore_schema = DEFAULT_SCHEMA

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    @property
    def closed(self) -> bool:
        return self._conn.closed

    async def execute(self, query: str, params: Mapping[str, Any] | None) -> _SyncCursor:
        cursor = psycopg.Cursor(self._conn, row_factory=dict_row)
        cursor.execute(query, params)
        return _SyncCursor(cursor)


class _SyncCursor:
    """A blocking cursor with the awaitable fetches the gateway calls."""

    def __init__(self, cursor: psycopg.Cursor[DictRow]) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    async def fetchone(self) -> DictRow | None:
        return self._cursor.fetchone()

    async def fetchall(self) -> list[DictRow]:
        return self._cursor.fetchall()
