"""PostgreSQL access: an explicitly opened pool, sessions and units of work over psycopg 3.

A :class:`Session` holds one pooled connection in autocommit mode (each statement commits
on its own); a :class:`UnitOfWork` is one transaction, on a connection of its own or on a
session's. Named statements (:mod:`jobcore.database.sql`, run by the stores of
:mod:`jobcore.database.store`) run through one gateway, :func:`execute`, :func:`fetch_one` and
:func:`fetch_all`, on either of them or on a raw connection, with the statement's typed parameters.
The gateway reads a statement through :class:`Statement`, the shape it needs, so it imports none.

Driver errors are translated here, at the adapter boundary: callers see
:class:`~jobcore.kernel.errors.DatabaseUnavailable` /
:class:`~jobcore.kernel.errors.DatabaseMissing`, never a psycopg exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import select
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.abc import PQGen
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from jobcore.database.statement_spans import (
    TracedCursor,
    TracedRawCursor,
    cursor_options,
    name_statement,
)
from jobcore.kernel.errors import (
    DatabaseMissing,
    DatabaseUnavailable,
    JobcoreError,
    ServiceStateError,
)
from jobcore.kernel.settings import DEFAULT_SCHEMA, Settings

AsyncConn = psycopg.AsyncConnection[DictRow]
RV = TypeVar("RV")

# On a pool with generic plans, the statements marked ``generic_plan`` are prepared at once
# and planned once per connection; no other statement is prepared there, so each of those
# is planned for its own parameters (a generic plan serves an optional filter badly: a
# listing by status would scan). PostgreSQL otherwise chooses between a generic plan and
# one planned anew for each run's parameters from what the first five runs cost, and for
# the enqueue statement (a dozen CTEs, 40 parameters) it kept planning anew, which cost
# more than the statement's own work (docs/bench/measurements.md, "Plans").
GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"
# Behind PgBouncer no SET is sent (a session setting would stay on the server connection):
# set jit = off on the role or the database there (ALTER ROLE ... SET jit = off).
NO_JIT = "SET jit = off"

_MISSING_DATABASE = re.compile(r'FATAL:\s+database ".*" does not exist')


@contextlib.contextmanager
def translate_errors(settings: Settings | None = None) -> Iterator[None]:
    """Turn connection-level driver errors into jobcore errors (one line, no traceback)."""
    try:
        yield
    except pg_errors.InvalidCatalogName as exc:
        name = settings.database_name if settings else "the database"
        raise DatabaseMissing(
            f"JOBCORE_DATABASE_URL: database {name!r} does not exist "
            "(create it with `jobcore migrate --create-database`)"
        ) from exc
    except (psycopg.OperationalError, PoolTimeout) as exc:
        first_line = (str(exc).strip().splitlines() or ["connection failed"])[0]
        # A refused connection carries no SQLSTATE, so the server's words are all we have.
        if _MISSING_DATABASE.search(first_line):
            name = settings.database_name if settings else "the database"
            raise DatabaseMissing(
                f"JOBCORE_DATABASE_URL: database {name!r} does not exist "
                "(create it with `jobcore migrate --create-database`)"
            ) from exc
        raise DatabaseUnavailable(f"JOBCORE_DATABASE_URL: {first_line}") from exc


def lock_wait_ran_out(exc: BaseException) -> bool:
    """Whether ``exc`` (a :class:`DatabaseUnavailable`, say) is a statement that gave up
    waiting for a lock at its transaction's ``lock_timeout``: the database is fine."""
    return isinstance(exc.__cause__, pg_errors.LockNotAvailable)


def connect_options(settings: Settings) -> dict[str, Any]:
    """psycopg connection options every connection to ``database_url`` takes: behind
    PgBouncer in transaction mode, no server-side prepared statements (psycopg prepares a
    query it ran five times on a connection; the next run may reach a server connection
    that never saw it, or another client's prepare may collide with it)."""
    return {} if settings.prepared_statements else {"prepare_threshold": None}


async def connect_for_chore(
    settings: Settings, application_name: str
) -> psycopg.AsyncConnection[Any]:
    """A connection of its own, outside every pool, in autocommit, for a background chore
    that may run longer than a statement's timeout or cannot run in a transaction
    (VACUUM, ANALYZE)."""
    conn = await ChoreConnection.connect(
        settings.database_url,
        autocommit=True,
        connect_timeout=max(1, int(settings.db_connect_timeout)),
        application_name=application_name,
        **connect_options(settings),
    )
    conn.jobcore_schema = settings.database_schema
    return conn


class ChoreConnection(psycopg.AsyncConnection[Any]):
    """A connection of :func:`connect_for_chore`: it knows jobcore's schema, as the
    pools' connections do, for the statements the gateway runs on it."""

    jobcore_schema: str = DEFAULT_SCHEMA


class BoundedConnection(psycopg.AsyncConnection[DictRow]):
    """A connection on which no wait for the server lasts longer than ``operation_timeout``.

    Across a silently cut network (no FIN, no RST) a statement otherwise waits forever:
    TCP keepalives stay quiet while data is in flight, and PostgreSQL's statement_timeout
    runs on a server that never got the statement. Past the timeout the operation raises
    ``OperationalError`` (so callers see :class:`DatabaseUnavailable`) and the connection,
    left mid-statement, is discarded by the pool when it comes back.
    """

    operation_timeout: float | None = None
    # When the connection last went back to the pool (see check_if_suspect).
    idle_since: float | None = None
    # Set by a pool with generic plans: statements marked generic_plan are prepared.
    plans_generic: bool = False
    # The schema jobcore's objects live in (Settings.database_schema), set by the pool.
    jobcore_schema: str = DEFAULT_SCHEMA

    async def wait(self, gen: PQGen[RV], interval: float = 0.1, timeout: float | None = None) -> RV:
        bound = self.operation_timeout if timeout is None else timeout
        try:
            return await super().wait(gen, interval, bound)
        except psycopg.OperationalError:
            if self.pgconn.transaction_status == TransactionStatus.ACTIVE:
                self.pgconn.finish()  # abandoned mid-statement: unusable, say so at once
            raise


# A connection that sat in the pool longer than this is checked with a query even when
# its socket is quiet: a peer that vanished without a word (a NAT's or load balancer's
# idle timeout, a failover) leaves a socket that never becomes readable.
QUIET_CHECK_AFTER = 10.0


def has_input(fd: int) -> bool:
    """Whether the socket has something to read, or an error or hang-up, right now.

    poll, not select: select refuses descriptors from 1024 up, which a busy API reaches.
    """
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))


async def check_if_suspect(conn: AsyncConn) -> None:
    """The pool's check on every checkout, without a round trip for a healthy connection.

    An idle connection has nothing to read: a server that shut down or restarted sent its
    FATAL and closed the socket, which makes it readable (as does a notification, which
    the full check then consumes harmlessly). Only such a connection, one that was idle
    longer than :data:`QUIET_CHECK_AFTER`, or one whose socket cannot be looked at, is
    checked with a query, which raises for a broken connection so the pool replaces it.
    A query per checkout was a fifth of the round trips of an enqueue.
    """
    if conn.closed:
        raise psycopg.OperationalError("the connection is closed")
    idle_since = getattr(conn, "idle_since", None)
    try:
        suspect = (
            idle_since is None
            or time.monotonic() - idle_since > QUIET_CHECK_AFTER
            or has_input(conn.pgconn.socket)
        )
    except (OSError, ValueError, psycopg.Error):
        suspect = True
    if suspect:
        await AsyncConnectionPool.check_connection(conn)


async def _mark_idle(conn: AsyncConn) -> None:
    """The pool's reset callback: runs when a connection comes back, idle and usable."""
    if isinstance(conn, BoundedConnection):
        conn.idle_since = time.monotonic()


# How often a backend running a statement (waiting for a lock, say) looks whether its
# client is still there (PostgreSQL 14 and later).
CLIENT_CHECK_MS = 1000


def vanished_client_settings(settings: Settings, server_version: int) -> list[sql.Composed]:
    """Session settings that end a backend whose client is gone, where the idle-in-
    transaction timeout does not: that one is armed only once the server answered a whole
    request. A request cut off mid-way by a silent network cut (its first messages ran,
    a BEGIN and a lock, say; the rest never came) leaves the backend waiting for the rest
    with its locks held, and statements queued behind those locks wait too, long after
    their clients gave up at ``db_operation_timeout``.

    - TCP keepalives from the server, so a client that vanished is found within about
      twice the operation timeout rather than the kernel's two hours;
    - ``client_connection_check_interval``: a backend whose client closed its connection
      stops its statement (a wait for a lock) instead of running it to the end. Servers on
      platforms that cannot check (Windows; PostgreSQL 14 without POLLRDHUP) refuse any
      value but 0: there it is left off, not an error that would fail every connection.

    Not sent behind PgBouncer, which keeps the server's sockets alive whatever its clients
    do: there PgBouncer's own keepalives (``tcp_keepidle`` and friends) find a vanished
    client (docs/how-to/pgbouncer.md).
    """
    seconds = max(1, int(settings.db_operation_timeout))
    keepalives = {
        "tcp_keepalives_idle": seconds,
        "tcp_keepalives_interval": max(1, seconds // 3),
        "tcp_keepalives_count": 3,
    }
    statements = [
        sql.SQL("SET {} = {}").format(sql.Identifier(name), sql.Literal(value))
        for name, value in keepalives.items()
    ]
    if server_version >= 140000:
        statements.append(
            sql.SQL(
                "DO $$BEGIN PERFORM set_config('client_connection_check_interval', {}, false);"
                " EXCEPTION WHEN invalid_parameter_value THEN NULL; END$$"
            ).format(sql.Literal(str(CLIENT_CHECK_MS)))
        )
    return statements


class Database:
    """Owns one connection pool. Opened and closed explicitly; using it closed fails fast.

    With ``first_check`` (jobcore.database.schema_version.check_schema_on for the services), every
    new connection runs it before the pool hands it out, until one has passed: a process
    that started while the database was down makes its start-up check when the database
    answers, before any statement of its own. A :class:`~jobcore.kernel.errors.JobcoreError` the
    check raises is kept in ``refusal`` (``refused`` is set) and refuses every later
    connection, so nothing runs on them; the process's owner stops it.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        min_size: int | None = None,
        max_size: int | None = None,
        name: str = "jobcore",
        generic_plans: bool = False,
        first_check: Callable[[AsyncConn], Awaitable[None]] | None = None,
    ) -> None:
        self.settings = settings
        self._first_check = first_check
        self.refusal: JobcoreError | None = None
        self.refused = asyncio.Event()
        # GENERIC_PLANS on every connection (not behind PgBouncer: see _configure).
        self.generic_plans = generic_plans
        self._pool: AsyncConnectionPool[AsyncConn] = AsyncConnectionPool(
            settings.database_url,
            min_size=settings.db_pool_min if min_size is None else min_size,
            max_size=settings.db_pool_max if max_size is None else max_size,
            kwargs={
                "row_factory": dict_row,
                # Transactions are explicit (UnitOfWork); single statements commit alone.
                "autocommit": True,
                "connect_timeout": max(1, int(settings.db_connect_timeout)),
                "application_name": name,
                **connect_options(settings),
                # Statements as spans when tracing is on (jobcore.database.statement_spans).
                **cursor_options(),
            },
            timeout=settings.db_connect_timeout,
            open=False,
            name=name,
            # A connection that broke while idle (PostgreSQL restarted) is replaced
            # before it is handed out, not discovered by the caller's first query.
            check=check_if_suspect,
            reconnect_timeout=0,
            connection_class=BoundedConnection,
            configure=self._configure,
            reset=_mark_idle,
        )
        self._opened = False

    async def _check_first(self, conn: AsyncConn) -> None:
        if self.refusal is not None:
            raise self.refusal
        if self._first_check is None:
            return
        try:
            await self._first_check(conn)
        except JobcoreError as exc:
            self.refusal = exc
            self.refused.set()
            raise
        self._first_check = None  # passed: later connections go straight to work

    async def _configure(self, conn: AsyncConn) -> None:
        if isinstance(conn, BoundedConnection):
            conn.operation_timeout = self.settings.db_operation_timeout
            conn.idle_since = time.monotonic()
            conn.jobcore_schema = self.settings.database_schema
        await self._check_first(conn)
        if self.settings.database_pooler == "pgbouncer":
            # A SET would stay on the server connection, for whichever client gets it
            # next; PgBouncer's idle_transaction_timeout does this job there.
            return
        # A transaction whose client vanished (a cut network) would hold its locks until
        # the server's TCP keepalive gives up, hours later. Set per session, not as a
        # startup option, which PgBouncer refuses.
        idle_ms = int(self.settings.db_operation_timeout * 2000)
        setup = sql.SQL("; ").join(
            [
                sql.SQL("SET idle_in_transaction_session_timeout = {}").format(
                    sql.Literal(idle_ms)
                ),
                *vanished_client_settings(self.settings, conn.info.server_version),
                # Every statement here is a short one; PostgreSQL compiles a plan with LLVM
                # when its estimated cost passes jit_above_cost, and then at every execution.
                # A generic plan sees LIMIT %(limit)s as a tenth of the table: on a
                # large outbox the fair claim's plan passes it, and each claim then spent far
                # longer compiling than running (docs/bench/measurements.md, "Plans").
                sql.SQL(NO_JIT),
            ]
        )
        if self.generic_plans:
            setup = sql.SQL("; ").join([setup, sql.SQL(GENERIC_PLANS)])
            if isinstance(conn, BoundedConnection):
                conn.plans_generic = True
        if not self.settings.job_events:
            # Read by every statement that writes an event
            # (jobcore.database.sql.job_events.EVENTS_ON).
            setup = sql.SQL("; ").join([setup, sql.SQL("SET jobcore.job_events = off")])
        await conn.execute(setup)

    @property
    def pool(self) -> AsyncConnectionPool[AsyncConn]:
        if not self._opened:
            raise ServiceStateError("the database pool is not open")
        return self._pool

    async def open(self, *, wait: bool = False) -> None:
        """Open the pool. With ``wait``, fail now (translated) if the database is not there."""
        with translate_errors(self.settings):
            await self._pool.open(wait=wait, timeout=self.settings.db_connect_timeout)
        self._opened = True

    async def wait_reachable(
        self,
        timeout: float,
        *,
        interval: float = 1.0,
        waiting: Callable[[DatabaseUnavailable], None] | None = None,
    ) -> None:
        """Wait up to ``timeout`` for a first connection, trying again every ``interval``
        (the pool gives up on an attempt that failed: PostgreSQL still starting, say), and
        calling ``waiting`` after the first failed try. Raises ``refusal`` as soon as the
        first check refused, else :class:`~jobcore.kernel.errors.DatabaseUnavailable` at the end."""
        deadline = time.monotonic() + timeout
        told = False
        while True:
            left = max(0.01, min(interval, deadline - time.monotonic()))
            try:
                with translate_errors(self.settings):
                    async with self.pool.connection(timeout=left):
                        return
            except DatabaseUnavailable as exc:
                if self.refusal is not None:
                    raise self.refusal from None
                if time.monotonic() >= deadline:
                    raise DatabaseUnavailable(
                        f"JOBCORE_DATABASE_URL: no connection within {timeout:g}s"
                    ) from exc
                if waiting is not None and not told:
                    waiting(exc)
                    told = True

    async def close(self) -> None:
        if self._opened:
            self._opened = False
            await self._pool.close()

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConn]:
        """A pooled connection in autocommit mode, for single statements."""
        with translate_errors(self.settings):
            async with self.pool.connection() as conn:
                yield conn

    @contextlib.asynccontextmanager
    async def listen_connection(self) -> AsyncIterator[AsyncConn]:
        """A connection in autocommit mode for LISTEN, held while the listener runs.

        A pooled one when LISTEN goes to ``database_url`` (the default); a connection of
        its own to ``JOBCORE_LISTEN_DATABASE_URL`` when that is set. Callers check
        ``settings.listen_url`` first: None means there is nowhere to listen (behind
        PgBouncer with no direct URL) and they poll instead.
        """
        url = self.settings.listen_url
        if url is None:
            raise ServiceStateError("no LISTEN connection behind PgBouncer without a direct URL")
        if not self.settings.listen_database_url:
            async with self.connection() as conn:
                yield conn
            return
        with translate_errors(self.settings):
            conn = await BoundedConnection.connect(
                url,
                autocommit=True,
                row_factory=dict_row,
                connect_timeout=max(1, int(self.settings.db_connect_timeout)),
                application_name=f"{self._pool.name}-listen",
            )
        conn.operation_timeout = self.settings.db_operation_timeout
        conn.jobcore_schema = self.settings.database_schema
        try:
            with translate_errors(self.settings):
                yield conn
        finally:
            with contextlib.suppress(psycopg.Error):
                await conn.close()

    def session(self) -> Session:
        return Session(self)

    def unit_of_work(self, *, begin_with_first_statement: bool = False) -> UnitOfWork:
        return UnitOfWork(self, begin_with_first_statement=begin_with_first_statement)

    async def ping(self) -> None:
        async with self.connection() as conn:
            await conn.execute("SELECT 1")


class Session:
    """One pooled connection in autocommit mode: every statement commits on its own.

    For work that is one statement, or reads that need no common snapshot: it saves the
    BEGIN and COMMIT round trips a transaction costs. ``async with db.session() as s: ...``;
    :meth:`transaction` opens a unit of work on the same connection when one is needed.
    """

    _kind = "session"

    def __init__(self, db: Database) -> None:
        self._db = db
        self._conn_cm: contextlib.AbstractAsyncContextManager[AsyncConn] | None = None
        self._conn: AsyncConn | None = None

    @property
    def connection(self) -> AsyncConn:
        if self._conn is None:
            raise ServiceStateError(f"the {self._kind} is not active")
        return self._conn

    async def __aenter__(self) -> Self:
        self._conn_cm = self._db.connection()
        self._conn = await self._conn_cm.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._conn = None
        if self._conn_cm is not None:  # None: a unit of work on a session's connection
            await self._conn_cm.__aexit__(exc_type, exc, tb)

    def transaction(self, *, begin_with_first_statement: bool = False) -> UnitOfWork:
        """A unit of work on this session's connection (it stays checked out after);
        ``begin_with_first_statement`` as :class:`UnitOfWork` has it.

        One at a time: a second BEGIN would only warn, and its COMMIT end the first."""
        if self.connection.info.transaction_status != TransactionStatus.IDLE:
            raise ServiceStateError("the session already has a transaction open")
        return UnitOfWork(
            self._db,
            connection=self.connection,
            begin_with_first_statement=begin_with_first_statement,
        )

    @property
    def settings(self) -> Settings:
        return self._db.settings


class UnitOfWork(Session):
    """One transaction on one pooled connection. Rolls back unless :meth:`commit` was called.

    ``async with db.unit_of_work() as uow: ...; await uow.commit()``. Given a
    ``connection`` (:meth:`Session.transaction`), it uses that one and leaves it checked out.

    With ``begin_with_first_statement``, BEGIN goes out with the first statement, in one
    round trip (psycopg's pipeline mode), instead of one of its own: for a hot path whose
    every statement goes through the gateway (a statement sent on ``connection`` directly
    before the first gateway one would run outside the transaction). BEGIN on its own
    delays the first statement by a round trip (docs/bench/measurements.md, "Plans").
    """

    _kind = "unit of work"

    def __init__(
        self,
        db: Database,
        *,
        connection: AsyncConn | None = None,
        begin_with_first_statement: bool = False,
    ) -> None:
        super().__init__(db)
        self._borrowed = connection
        self._committed = False
        # True until BEGIN was sent (with the first statement, when deferred).
        self.begin_pending = begin_with_first_statement

    async def __aenter__(self) -> Self:
        if self._borrowed is not None:
            self._conn = self._borrowed
        else:
            await super().__aenter__()
        if self.begin_pending:
            return self
        try:
            with translate_errors(self._db.settings):
                await self.connection.execute("BEGIN")
        except BaseException:
            await super().__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        conn = self.connection
        try:
            if not self._committed and not self.begin_pending and not conn.closed:
                with contextlib.suppress(psycopg.Error):
                    await conn.execute("ROLLBACK")
        finally:
            await super().__aexit__(exc_type, exc, tb)

    def transaction(self, *, begin_with_first_statement: bool = False) -> UnitOfWork:
        raise ServiceStateError("already in a transaction")

    async def commit(self) -> None:
        if self._committed:
            return  # COMMIT went out with the last statement (fetch_all_behind's commit)
        if not self.begin_pending:  # else no statement ran: nothing to commit
            with translate_errors(self._db.settings):
                await self.connection.execute("COMMIT")
        self._committed = True

    def ended_by_commit(self) -> None:
        """The transaction's COMMIT went out with its last statement (and succeeded)."""
        self._committed = True

    async def rollback(self) -> None:
        if not self.begin_pending:
            with translate_errors(self._db.settings):
                await self.connection.execute("ROLLBACK")
        self._committed = True  # nothing left to roll back on exit

    @contextlib.asynccontextmanager
    async def savepoint(self) -> AsyncIterator[None]:
        """A part of the transaction that an exception undoes alone: the block's writes
        are rolled back to the savepoint, the exception goes on, and so may the
        transaction (the scheduler: one tick refused, the others kept)."""
        if self.begin_pending:
            raise ServiceStateError("a savepoint needs the transaction begun")
        with translate_errors(self._db.settings):
            await self.connection.execute("SAVEPOINT jobcore_part")
        try:
            yield
        except BaseException:
            # Should this fail too (the connection lost), the transaction is gone anyway:
            # the block's exception is the one to see.
            if not self.connection.closed:
                with contextlib.suppress(psycopg.Error):
                    await self.connection.execute("ROLLBACK TO SAVEPOINT jobcore_part")
                    await self.connection.execute("RELEASE SAVEPOINT jobcore_part")
            raise
        with translate_errors(self._db.settings):
            await self.connection.execute("RELEASE SAVEPOINT jobcore_part")


# --- the gateway: every named statement runs through these -----------------------------------

Executor = Session | psycopg.AsyncConnection[Any]
"""Where a statement runs: a session or unit of work, or a raw connection (the worker's
held ones, a LISTEN connection), whose provider translates its errors."""

Reader = Session | AsyncConn
"""Where a statement whose rows are read runs (:func:`fetch_one`, :func:`fetch_all`)."""


class StatementQuery(Protocol):
    """What the gateway reads of a named query (:class:`jobcore.database.sql.Query`)."""

    @property
    def name(self) -> str: ...

    @property
    def sql(self) -> str: ...

    @property
    def generic_plan(self) -> bool: ...

    @property
    def native(self) -> tuple[str, tuple[str, ...]] | None: ...


class Statement(Protocol):
    """A named query bound to its parameters, as the gateway runs it
    (:class:`jobcore.database.sql.Statement`)."""

    @property
    def query(self) -> StatementQuery: ...

    @property
    def params(self) -> Mapping[str, Any]: ...


# Literals and quoted identifiers (never rewritten), and what the rewrite looks for: the
# default schema as a qualifier (``jobcore.jobs``) or as a whole string literal
# (``schemaname = 'jobcore'``), with no identifier character or dot just before it.
_SCHEMA_TOKEN = re.compile(
    r"(?P<literal>'(?:[^']|'')*')|\"(?:[^\"]|\"\")*\"|(?<![\w.$])"
    + DEFAULT_SCHEMA
    + r"(?=\.[A-Za-z_\"])"
)
_in_schema: dict[tuple[str, str], str] = {}


def in_schema(text: str, schema: str) -> str:
    """``text``, a statement written for jobcore's default schema, for ``schema``: each
    ``jobcore.`` qualifier, and each ``'jobcore'`` literal, names ``schema`` instead. Done
    once per statement and schema, then kept.

    Runtime statements name every jobcore object with its schema, as a statement must
    behind PgBouncer in transaction mode, where no per-connection search_path holds. They
    are written qualified with the default (jobcore.database.sql), so the text read in the
    code is the text run in the default installation; a deployment with another
    ``JOBCORE_DATABASE_SCHEMA`` runs the same statements, rewritten here.
    """
    if schema == DEFAULT_SCHEMA:
        return text
    key = (text, schema)
    found = _in_schema.get(key)
    if found is None:

        def one(match: re.Match[str]) -> str:
            literal = match.group("literal")
            if literal is not None:
                return f"'{schema}'" if literal == f"'{DEFAULT_SCHEMA}'" else literal
            token = match.group(0)
            return schema if token == DEFAULT_SCHEMA else token

        found = _in_schema[key] = _SCHEMA_TOKEN.sub(one, text)
    return found


def schema_of(conn: object) -> str:
    """The schema of jobcore's objects for statements run on ``conn``: the pool's
    connections, a chore's and an application's (jobcore.usecases.enqueue.in_transaction)
    carry it; anything else gets the default."""
    schema = getattr(conn, "jobcore_schema", DEFAULT_SCHEMA)
    return schema if isinstance(schema, str) else DEFAULT_SCHEMA


def _prepare(conn: psycopg.AsyncConnection[Any], statement: Statement) -> bool | None:
    """On a pool with generic plans (GENERIC_PLANS): prepared at once if the statement is
    marked generic_plan, never otherwise. Elsewhere None: psycopg's rule (after five runs,
    unless the pool prepares nothing)."""
    if isinstance(conn, BoundedConnection) and conn.plans_generic:
        return statement.query.generic_plan
    return None


async def _run(on: Executor, statement: Statement) -> psycopg.AsyncCursor[Any]:
    conn = on.connection if isinstance(on, Session) else on
    if isinstance(on, UnitOfWork) and on.begin_pending:
        # From here on the transaction is open (or aborted): the exit rolls it back.
        on.begin_pending = False
        with translate_errors(on.settings):
            async with conn.pipeline():
                await conn.execute("BEGIN")
                cursor = await _send(conn, statement)
            return cursor
    if isinstance(on, Session):
        with translate_errors(on.settings):
            return await _send(conn, statement)
    return await _send(conn, statement)


async def _send(
    conn: psycopg.AsyncConnection[Any], statement: Statement
) -> psycopg.AsyncCursor[Any]:
    prepare = _prepare(conn, statement)
    # Without the argument where psycopg's own rule applies (stand-ins in tests take none).
    options = {} if prepare is None else {"prepare": prepare}
    native = statement.query.native
    schema = schema_of(conn)
    if native is None or not isinstance(conn, psycopg.AsyncConnection):
        text = statement.query.sql
        if schema != DEFAULT_SCHEMA:
            text = _renamed(text, schema, statement.query.name)
        return await conn.execute(text, statement.params, **options)
    # Too long for psycopg's conversion cache: placeholders converted once (jobcore.database.sql).
    sql, names = native
    if schema != DEFAULT_SCHEMA:
        sql = _renamed(sql, schema, statement.query.name)
    raw = (
        TracedRawCursor if issubclass(conn.cursor_factory, TracedCursor) else psycopg.AsyncRawCursor
    )
    cursor = raw(conn, row_factory=conn.row_factory)
    return await cursor.execute(sql, [statement.params[name] for name in names], **options)


def _renamed(text: str, schema: str, name: str) -> str:
    """:func:`in_schema`, with the rewritten text's spans named as the statement's."""
    if (text, schema) not in _in_schema:
        name_statement(in_schema(text, schema), name)
    return in_schema(text, schema)


async def execute(on: Executor, statement: Statement) -> int:
    """Run a statement; return the number of rows it touched."""
    return (await _run(on, statement)).rowcount


async def fetch_one(on: Reader, statement: Statement) -> DictRow | None:
    """Run a statement; return its first row (None: no row)."""
    row: DictRow | None = await (await _run(on, statement)).fetchone()
    return row


async def fetch_all(on: Reader, statement: Statement) -> list[DictRow]:
    """Run a statement; return all its rows."""
    rows: list[DictRow] = await (await _run(on, statement)).fetchall()
    return rows


async def fetch_all_behind(
    uow: UnitOfWork, first: Statement, statement: Statement, *, commit: bool = False
) -> list[DictRow]:
    """``first``, then ``statement``, in ``uow``'s transaction and one round trip (with its
    BEGIN when that is still to go): ``statement``'s rows, read with a snapshot taken once
    ``first`` is done. The locks ``first`` takes are held for no round trip of the
    client's before ``statement`` runs: behind a hot row, the time it stays locked is what
    the others wait.

    With ``commit``, COMMIT goes in the same round trip: ``statement`` ends the
    transaction (a statement after it runs on its own, and ``uow.commit()`` does nothing).
    An error in either statement skips the COMMIT, and the exit rolls back as usual."""
    conn = uow.connection
    with translate_errors(uow.settings):
        async with conn.pipeline():
            if uow.begin_pending:
                # From here on the transaction is open (or aborted): the exit rolls it back.
                uow.begin_pending = False
                await conn.execute("BEGIN")
            await _send(conn, first)
            cursor = await _send(conn, statement)
            if commit:
                await conn.execute("COMMIT")
        rows: list[DictRow] = await cursor.fetchall()
    if commit:
        uow.ended_by_commit()
    return rows


async def fetch_all_beside(
    conn: AsyncConn, first: Statement, statement: Statement, alone: Statement
) -> tuple[list[DictRow], list[DictRow]]:
    """BEGIN, ``first``, ``statement`` and COMMIT (as :func:`fetch_all_after`), then
    ``alone`` in a transaction of its own, all in one round trip: the rows of ``statement``
    and of ``alone``. (``alone`` comes after the COMMIT: sent before the BEGIN, with no
    sync between them, it would join the transaction.) A failed transaction skips
    ``alone``. On an error the connection may be left in a transaction: its provider
    discards it."""
    async with conn.pipeline():
        await conn.execute("BEGIN")
        await _send(conn, first)
        cursor = await _send(conn, statement)
        await conn.execute("COMMIT")
        alone_cursor = await _send(conn, alone)
    rows: list[DictRow] = await cursor.fetchall()
    after: list[DictRow] = await alone_cursor.fetchall()
    return rows, after


async def fetch_all_after(conn: AsyncConn, first: Statement, statement: Statement) -> list[DictRow]:
    """BEGIN, ``first``, ``statement`` and COMMIT in one round trip (psycopg's pipeline
    mode): ``statement``'s rows. ``statement`` runs with a snapshot taken once ``first``
    is done, in the same transaction (``first`` takes locks that it then counts behind).
    On an error the connection is left in its transaction: its provider discards it."""
    async with conn.pipeline():
        await conn.execute("BEGIN")
        await _send(conn, first)
        cursor = await _send(conn, statement)
        await conn.execute("COMMIT")
    rows: list[DictRow] = await cursor.fetchall()
    return rows
