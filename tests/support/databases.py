"""Isolated databases: migrate a template once, clone it for every test.

The template's name carries a hash of the migrations, so a change to them builds a new
template and an unchanged tree reuses the last one across runs.
"""

from __future__ import annotations

import hashlib
import uuid
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from jobcore import migrate
from jobcore.settings import Settings

TEMPLATE_LOCK = "jobcore.tests.template"


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


def migrations_fingerprint() -> str:
    digest = hashlib.sha256()
    root = migrate.migrations_dir()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def ensure_template(admin_url: str) -> str:
    """Create and migrate the template database unless an identical one exists."""
    name = f"jobcore_tpl_{migrations_fingerprint()}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (TEMPLATE_LOCK,))
        try:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s AND datistemplate", (name,)
            ).fetchone()
            if not exists:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                migrate.upgrade(Settings(database_url=with_database(admin_url, name)))
                conn.execute(
                    sql.SQL("ALTER DATABASE {} IS_TEMPLATE true").format(sql.Identifier(name))
                )
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (TEMPLATE_LOCK,))
    return name


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
