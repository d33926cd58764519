"""Isolated databases: migrate a template once, clone it for every test.

The template is :func:`jobcore.testing.scratch.ensure_template`'s: its name carries a hash of the
migrations, so a change to them builds a new template and an unchanged tree reuses the
last one across runs.
"""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from jobcore.kernel.settings import Settings
from jobcore.testing import scratch
from jobcore.testing.scratch import migrations_fingerprint

__all__ = [
    "create_database",
    "drop_database",
    "ensure_template",
    "migrations_fingerprint",
    "with_database",
]


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
