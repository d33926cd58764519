"""Alembic environment: targets jobcore's metadata; the URL and the schema come from
jobcore's settings.

Every jobcore object lives in its own schema (``JOBCORE_DATABASE_SCHEMA``, ``jobcore`` by
default), Alembic's version table too, so an application's own tables and its own Alembic
(``public.alembic_version``) in the same database are never jobcore's concern, nor jobcore's
theirs. The migration connection's search_path is that schema alone: migrations create
their objects unqualified, and they land there.

An installation of an earlier release keeps everything in ``public``, its version table
included (:func:`jobcore.database.migration_steps.installed_in_public`). Its pending
migrations run there, as they always did, until revision 0030 moves its objects into the
schema and leaves views in ``public`` for the previous release's processes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from alembic import context
from sqlalchemy import Connection, Engine, create_engine, pool, text

from jobcore.database.gateway import connect_options
from jobcore.database.migrate import LOCK_KEY
from jobcore.database.migration_steps import SCHEMA_ATTRIBUTE, installed_in_public
from jobcore.database.schema import metadata
from jobcore.database.schema_version import known_revisions, marker_after_migration
from jobcore.kernel.settings import load_settings

config = context.config


def _url() -> str:
    url = config.attributes.get("sqlalchemy_url")
    return str(url) if url else load_settings().sqlalchemy_url


def _schema() -> str:
    schema = config.attributes.get(SCHEMA_ATTRIBUTE)
    return str(schema) if schema else load_settings().database_schema


def _connect_args() -> dict[str, object]:
    """No server-side prepared statements behind PgBouncer
    (jobcore.database.gateway.connect_options)."""
    args = config.attributes.get("connect_args")
    return dict(args) if args is not None else connect_options(load_settings())


def run_migrations_offline() -> None:
    config.attributes[SCHEMA_ATTRIBUTE] = _schema()
    context.configure(
        url=_url(), target_metadata=metadata, literal_binds=True, version_table_schema=_schema()
    )
    with context.begin_transaction():
        context.run_migrations()


@contextlib.contextmanager
def _taking_turns(engine: Engine) -> Iterator[None]:
    """Two `jobcore migrate` at once (a deploy racing a developer) take turns, for the
    whole run: a session's advisory lock, on a connection of its own that runs nothing
    else. A transaction's lock would end at the first autocommit block (a CONCURRENTLY
    build commits the migration's transaction), and the other run would then see a
    half-built index by its name and record the revision. Behind PgBouncer in transaction
    mode a session lock holds nothing, so `jobcore migrate` refuses to run there."""
    # Closing the connection (NullPool: really closed) releases the lock, whatever failed.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as lock:
        key = {"key": LOCK_KEY}
        if not lock.execute(text("SELECT pg_try_advisory_lock(hashtext(:key))"), key).scalar():
            print("another `jobcore migrate` runs on this database: waiting for it", flush=True)
            lock.execute(text("SELECT pg_advisory_lock(hashtext(:key))"), key)
        yield


def _search_path(connection: Connection, schema: str) -> bool:
    """Point the session's search_path at where jobcore's objects are: ``schema``
    (created if missing), or ``public`` for an installation not moved yet (True). Set for
    the session, so it holds across the commits of CONCURRENTLY builds."""
    in_public = installed_in_public(connection, schema, known_revisions())
    if in_public:
        connection.execute(text("SET search_path = public"))
    else:
        connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {schema}"))
        connection.execute(text(f"SET search_path = {schema}"))
    connection.commit()
    return in_public


def _write_marker(connection: Connection, schema: str, revision: str) -> None:
    """What the schema now is and which release's code it runs with, for processes of
    older releases (jobcore.database.schema_version), in the migration's transaction: on
    the version table, and on the view of it that an installation moved from ``public``
    keeps there for the previous release's processes."""
    # A utility statement takes no bound parameter: a quoted literal.
    comment = marker_after_migration(revision).comment().replace("'", "''")
    for name, kind in connection.execute(VERSION_TABLES, {"schema": schema}).all():
        noun = "VIEW" if kind == "v" else "TABLE"
        connection.execute(text(f"COMMENT ON {noun} {name} IS '{comment}'"))


# Alembic's version table (in the schema, or still in public) and the view of it in public.
VERSION_TABLES = text(
    "SELECT c.oid::regclass::text, c.relkind FROM pg_class c "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relname = 'alembic_version' AND n.nspname IN (:schema, 'public') "
    "AND c.relkind IN ('r', 'v')"
)


def run_migrations_online() -> None:
    schema = _schema()
    config.attributes[SCHEMA_ATTRIBUTE] = schema
    engine = create_engine(_url(), poolclass=pool.NullPool, connect_args=_connect_args())
    with _taking_turns(engine), engine.connect() as connection:
        in_public = _search_path(connection, schema)
        context.configure(
            connection=connection,
            target_metadata=metadata,
            compare_type=True,
            # Not moved yet: its version table is still in public, where the search_path
            # finds it (and, once 0030 moved it, finds the view of it in its place).
            version_table_schema=None if in_public else schema,
        )
        with context.begin_transaction():
            context.run_migrations()
            revision = context.get_context().get_current_revision()
            if revision is not None:
                _write_marker(connection, schema, revision)
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
