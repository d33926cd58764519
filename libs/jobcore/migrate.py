"""Bringing a database to the schema head with Alembic (`jobcore migrate`)."""

from __future__ import annotations

from pathlib import Path

import psycopg
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from psycopg import sql
from sqlalchemy import create_engine, pool

from jobcore.db import connect_options, translate_errors
from jobcore.settings import Settings


def migrations_dir() -> Path:
    """``migrations/`` in a checkout; the copy shipped inside the package in a wheel."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "_migrations", package.parent.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("the jobcore migrations directory is missing from this install")


def alembic_config(settings: Settings) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["sqlalchemy_url"] = settings.sqlalchemy_url
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
    engine = create_engine(
        settings.sqlalchemy_url, poolclass=pool.NullPool, connect_args=connect_options(settings)
    )
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str | None:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    return ScriptDirectory.from_config(config).get_current_head()


def upgrade(settings: Settings, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate to ``revision``; return (revision before, revision after)."""
    # Fail with a translated one-line error before Alembic wraps it in a traceback.
    _connect(settings.database_url, settings).close()
    before = current_revision(settings)
    command.upgrade(alembic_config(settings), revision)
    return before, current_revision(settings)
