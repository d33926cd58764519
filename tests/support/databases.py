"""Isolated databases: migrate a template once, clone it for every test.

The template is :func:`jobcore.testing.scratch.ensure_template`'s: its name carries a hash of the
migrations, so a change to them builds a new template and an unchanged tree reuses the
last one across runs.

The tests' own connections name jobcore's tables unqualified (``SELECT ... FROM jobs``),
as an operator at psql with ``search_path`` set would: :func:`tests_resolve_jobcore_tables`
gives every connection a test opens itself (``psycopg.connect``,
``psycopg.AsyncConnection.connect``) the search_path :data:`TEST_SEARCH_PATH`, and the
``db`` fixture's pool too (:func:`with_search_path`). The product's own pools
(jobcore.database.gateway.Database, whose connections are of its own class) and the
processes the tests start get none: every statement of jobcore's still has to name its
schema to work.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from jobcore.kernel.settings import DEFAULT_SCHEMA, Settings
from jobcore.testing import scratch
from jobcore.testing.scratch import migrations_fingerprint

__all__ = [
    "TEST_SEARCH_PATH",
    "create_database",
    "drop_database",
    "ensure_template",
    "migrations_fingerprint",
    "tests_resolve_jobcore_tables",
    "with_database",
    "with_search_path",
]

# jobcore's schema first, then an application's tables (public).
TEST_SEARCH_PATH = f"{DEFAULT_SCHEMA}, public"
_OPTIONS = f"-c search_path={TEST_SEARCH_PATH.replace(' ', '')}"
# PgBouncer refuses a startup ``options`` parameter (tests.support.pgbouncer.PORT).
_PGBOUNCER_PORT = "6441"


def with_search_path(url: str) -> str:
    """``url`` with :data:`TEST_SEARCH_PATH` as its connections' search_path."""
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options={quote(_OPTIONS)}"


def _resolving(conninfo: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        params = conninfo_to_dict(conninfo, **kwargs)
    except psycopg.ProgrammingError:
        return kwargs
    if "options" in params or str(params.get("port", "")) == _PGBOUNCER_PORT:
        return kwargs  # the test chose its own, or PgBouncer, which takes none
    return {**kwargs, "options": _OPTIONS}


def tests_resolve_jobcore_tables() -> Iterator[None]:
    """Give the connections tests open with ``psycopg.connect`` and
    ``psycopg.AsyncConnection.connect`` (those classes exactly, never a subclass such as
    the product pools' own) :data:`TEST_SEARCH_PATH`, unless they name their own options;
    undone on exit."""
    sync_connect = psycopg.Connection.connect.__func__  # type: ignore[attr-defined]
    async_connect = psycopg.AsyncConnection.connect.__func__  # type: ignore[attr-defined]

    @functools.wraps(sync_connect)
    def connect(cls: type[Any], conninfo: str = "", **kwargs: Any) -> Any:
        if cls is psycopg.Connection:
            kwargs = _resolving(conninfo, kwargs)
        return sync_connect(cls, conninfo, **kwargs)

    @functools.wraps(async_connect)
    async def aconnect(cls: type[Any], conninfo: str = "", **kwargs: Any) -> Any:
        if cls is psycopg.AsyncConnection:
            kwargs = _resolving(conninfo, kwargs)
        return await async_connect(cls, conninfo, **kwargs)

    module_connect = psycopg.connect
    psycopg.Connection.connect = classmethod(connect)  # type: ignore[assignment,method-assign]
    psycopg.AsyncConnection.connect = classmethod(aconnect)  # type: ignore[assignment,method-assign]
    # psycopg.connect is Connection.connect as it was bound when psycopg was imported.
    psycopg.connect = psycopg.Connection.connect  # type: ignore[misc]
    try:
        yield
    finally:
        psycopg.Connection.connect = classmethod(sync_connect)  # type: ignore[assignment,method-assign]
        psycopg.AsyncConnection.connect = classmethod(async_connect)  # type: ignore[assignment,method-assign]
        psycopg.connect = module_connect  # type: ignore[misc]


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


def ensure_template(admin_url: str) -> str:
    """Create and migrate the template database unless an identical one exists (the
    testing kit's, which the pytest plugin shares)."""
    return scratch.ensure_template(Settings(database_url=admin_url))


def create_database(admin_url: str, *, template: str | None) -> str:
    name = f"jobcore_t_{uuid.uuid4().hex[:12]}"
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template:
        statement = sql.SQL("{} TEMPLATE {}").format(statement, sql.Identifier(template))
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(statement)
    return name


def drop_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
