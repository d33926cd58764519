"""Alembic environment: targets jobcore's metadata; the URL comes from jobcore's settings."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from alembic import context
from sqlalchemy import Engine, create_engine, pool, text

from jobcore.database.gateway import connect_options
from jobcore.database.migrate import LOCK_KEY
from jobcore.database.schema import metadata
from jobcore.database.schema_version import marker_after_migration
from jobcore.kernel.settings import load_settings

config = context.config


def _url() -> str:
    url = config.attributes.get("sqlalchemy_url")
    return str(url) if url else load_settings().sqlalchemy_url


def _connect_args() -> dict[str, object]:
    """No server-side prepared statements behind PgBouncer
    (jobcore.database.gateway.connect_options)."""
    args = config.attributes.get("connect_args")
    return dict(args) if args is not None else connect_options(load_settings())


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=metadata, literal_binds=True)
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


def run_migrations_online() -> None:
    engine = create_engine(_url(), poolclass=pool.NullPool, connect_args=_connect_args())
    with _taking_turns(engine), engine.connect() as connection:
        context.configure(connection=connection, target_metadata=metadata, compare_type=True)
        with context.begin_transaction():
            context.run_migrations()
            # What the schema now is and which release's code it runs with, for processes
            # of older releases (jobcore.database.schema_version), in the migration's transaction.
            revision = context.get_context().get_current_revision()
            if revision is not None:
                # A utility statement takes no bound parameter: a quoted literal.
                comment = marker_after_migration(revision).comment().replace("'", "''")
                connection.execute(text(f"COMMENT ON TABLE alembic_version IS '{comment}'"))
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
