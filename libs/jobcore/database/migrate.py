"""Bringing a database to the schema head with Alembic (`jobcore migrate`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from jobcore.database.gateway import connect_options, translate_errors
from jobcore.kernel.errors import ConfigurationError, JobcoreError
from jobcore.kernel.settings import Settings

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic and SQLAlchemy are imported by the functions that migrate, not here: every
# process imports this module (for migrations_dir) to check its schema at start-up, and
# only `jobcore migrate` needs them (SQLAlchemy alone is a tenth of a replica's modules).

# The session advisory lock two `jobcore migrate` on one database take turns with
# (migrations/env.py).
LOCK_KEY = "jobcore.migrate"


class MigrationFailed(JobcoreError):
    """A migration failed; the schema stays at the last revision that completed."""


def migrations_dir() -> Path:
    """``migrations/`` in a checkout; the copy shipped inside the package in a wheel."""
    package = Path(__file__).resolve().parents[1]  # jobcore/, this module is in database/
    for candidate in (package / "_migrations", package.parent.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("the jobcore migrations directory is missing from this install")


def _script_config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    return config


def alembic_config(settings: Settings) -> Config:
    from jobcore.database.migration_steps import SCHEMA_ATTRIBUTE

    config = _script_config()
    config.attributes["sqlalchemy_url"] = settings.sqlalchemy_url
    config.attributes[SCHEMA_ATTRIBUTE] = settings.database_schema
    config.attributes["connect_args"] = connect_options(settings)
    return config


def _connect(url: str, settings: Settings) -> psycopg.Connection[tuple[object, ...]]:
    with translate_errors(settings):
        return psycopg.connect(
            url,
            connect_timeout=max(1, int(settings.db_connect_timeout)),
            autocommit=True,
            **connect_options(settings),
        )


def create_database(settings: Settings) -> bool:
    """Create the configured database if it is missing; return True if it was created."""
    with _connect(settings.maintenance_database_url(), settings) as conn:
        exists = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (settings.database_name,)
        ).fetchone()
        if exists:
            return False
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(settings.database_name)))
        return True


def current_revision(settings: Settings) -> str | None:
    """The schema's revision: in jobcore's schema, or in ``public`` for an installation of
    a release before it (jobcore.database.migration_steps.installed_in_public)."""
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from sqlalchemy import create_engine, pool

    from jobcore.database.migration_steps import installed_in_public

    script = ScriptDirectory.from_config(_script_config())
    known = {revision.revision for revision in script.walk_revisions()}

    engine = create_engine(
        settings.sqlalchemy_url, poolclass=pool.NullPool, connect_args=connect_options(settings)
    )
    try:
        with engine.connect() as connection:
            schema = settings.database_schema
            if installed_in_public(connection, schema, known):
                schema = "public"
            context = MigrationContext.configure(connection, opts={"version_table_schema": schema})
            return context.get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_script_config()).get_current_head()


def _next_revision(current: str | None, target: str) -> str | None:
    """The revision after ``current`` on the way to ``target``: the one that failed."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_script_config())
    steps = list(script.iterate_revisions(target, current or "base"))
    return steps[-1].revision if steps else None


def upgrade(settings: Settings, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate to ``revision``; return (revision before, revision after).

    Refused behind PgBouncer in transaction mode: two runs take turns with a session's
    advisory lock (migrations/env.py), which such a pooler would leave on whichever server
    connection took it. A migration that fails raises :class:`MigrationFailed`, naming it.
    """
    if settings.database_pooler == "pgbouncer":
        raise ConfigurationError(
            "JOBCORE_DATABASE_POOLER=pgbouncer: `jobcore migrate` runs against PostgreSQL "
            "directly (two runs take turns with a session lock, which PgBouncer in "
            "transaction mode does not keep): set JOBCORE_DATABASE_URL to PostgreSQL's "
            "address and JOBCORE_DATABASE_POOLER=none for it"
        )
    # Fail with a translated one-line error before Alembic wraps it in a traceback.
    _connect(settings.database_url, settings).close()
    before = current_revision(settings)
    from alembic import command
    from sqlalchemy import exc as sa_exc

    for attempt in range(1, DEADLOCK_ATTEMPTS + 1):
        try:
            command.upgrade(alembic_config(settings), revision)
            break
        except sa_exc.DBAPIError as exc:
            at = current_revision(settings)
            failed = _next_revision(at, revision)
            reason = (str(exc.orig).strip().splitlines() or ["no reason given"])[0]
            if _sqlstate(exc) == DEADLOCK_DETECTED and attempt < DEADLOCK_ATTEMPTS:
                print(
                    f"migration {failed}: {reason} (PostgreSQL undid its side of it); "
                    f"running it again, attempt {attempt + 1} of {DEADLOCK_ATTEMPTS}",
                    file=sys.stderr,
                    flush=True,
                )
                time.sleep(DEADLOCK_PAUSE_SECONDS * attempt)
                continue
            raise MigrationFailed(
                f"migration {failed} failed: {reason}; the schema stays at {at or 'empty'}, "
                "run `jobcore migrate` again"
            ) from exc
    return before, current_revision(settings)


# A deadlock is a race PostgreSQL ends by failing one side (here a concurrent index build,
# which waits for every older transaction, against a writer that came to wait for the
# build): running the migration again is what an operator would do, and is safe (a failed
# concurrent build is dropped and built again, jobcore.database.migration_steps). A lock
# not had within the build's lock_timeout is not retried: that is a long transaction,
# which the operator must end first (docs/how-to/upgrade.md).
DEADLOCK_DETECTED = "40P01"
DEADLOCK_ATTEMPTS = 3
DEADLOCK_PAUSE_SECONDS = 1.0


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(getattr(exc, "orig", None), "sqlstate", None)
