"""A database and a broker prefix of one run (`jobcore chaos`, `jobcore bench`), created
for it and removed after it, so a run never touches the developer's own jobs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import psycopg
from psycopg import sql

from jobcore import migrate
from jobcore.amqp.topology import Topology
from jobcore.registry import load_job_modules
from jobcore.settings import Settings


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


async def delete_topology(config: Settings) -> None:
    connection = await aio_pika.connect(config.amqp_url, timeout=10)
    async with connection:
        topology = Topology(config.amqp_prefix, config.amqp_delivery_limit)
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
