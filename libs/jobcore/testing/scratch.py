"""A database and a broker prefix of one run (`jobcore chaos`, `jobcore bench`), created
for it and removed after it, so a run never touches the developer's own jobs; and
databases for tests, cloned from a template migrated once (the testing kit's pytest plugin).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from jobcore.amqp.connection import connect
from jobcore.amqp.topology import Topology
from jobcore.database import migrate
from jobcore.execution.registry import load_job_modules
from jobcore.kernel.settings import Settings


def database_url(url: str, name: str) -> str:
    """``url`` pointed at database ``name`` (credentials, host and options kept)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


def create_database(config: Settings) -> None:
    migrate.create_database(config)
    migrate.upgrade(config)


def drop_database(config: Settings) -> None:
    with psycopg.connect(config.maintenance_database_url(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(config.database_name)
            )
        )


# Serialises the template's creation between parallel test processes (pytest-xdist).
TEMPLATE_LOCK = "jobcore.tests.template"


def migrations_fingerprint() -> str:
    """A hash of the migrations: a change to them makes a new template."""
    digest = hashlib.sha256()
    root = migrate.migrations_dir()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def ensure_template(config: Settings) -> str:
    """The name of a migrated template database on ``config``'s server, created unless an
    identical one (same migrations) exists: later runs reuse it."""
    name = f"jobcore_tpl_{migrations_fingerprint()}"
    with psycopg.connect(config.maintenance_database_url(), autocommit=True) as conn:
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
                migrate.upgrade(Settings(database_url=database_url(config.database_url, name)))
                conn.execute(
                    sql.SQL("ALTER DATABASE {} IS_TEMPLATE true").format(sql.Identifier(name))
                )
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (TEMPLATE_LOCK,))
    return name


def clone_database(config: Settings, template: str, prefix: str = "jobcore_t_") -> str:
    """A new database on ``config``'s server, a copy of ``template``; its URL."""
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    with psycopg.connect(config.maintenance_database_url(), autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
    return database_url(config.database_url, name)


async def delete_topology(config: Settings) -> None:
    connection = await connect(config, timeout=10)
    async with connection:
        topology = Topology.from_settings(config)
        queues = load_job_modules(config.job_modules).queues()
        await topology.delete(await connection.channel(), queues)


@contextlib.asynccontextmanager
async def scratch(config: Settings) -> AsyncIterator[Settings]:
    """Create ``config``'s database; on the way out drop it and delete its topology."""
    await asyncio.to_thread(create_database, config)
    try:
        yield config
    finally:
        try:
            with contextlib.suppress(Exception):  # the broker may be down: the DB still goes
                await delete_topology(config)
        finally:
            await asyncio.to_thread(drop_database, config)
