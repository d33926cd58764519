"""Finding the PostgreSQL and RabbitMQ the tests run against.

In order: the URLs in JOBCORE_TEST_PG_ADMIN_URL / JOBCORE_TEST_AMQP_URL (defaults: the
local services); if those cannot be reached and a Docker engine answers, containers
started with testcontainers; otherwise a failure that says exactly what is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import aio_pika
import psycopg

DEFAULT_PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"


@dataclass(frozen=True)
class ServiceUrls:
    pg_admin_url: str
    amqp_url: str


def _pg_error(url: str) -> str | None:
    try:
        psycopg.connect(url, connect_timeout=3).close()
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0]
    return None


def _amqp_error(url: str) -> str | None:
    async def probe() -> None:
        # Generous: a node that just restarted answers slowly while it recovers its queues.
        connection = await aio_pika.connect(url, timeout=20)
        await connection.close()

    try:
        asyncio.run(probe())
    except Exception as exc:  # any failure means "not reachable", with its reason
        return f"{type(exc).__name__}: {exc}"
    return None


def _docker_available() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=2)
    except Exception:
        return False
    try:
        client.ping()
    except Exception:
        return False
    finally:
        client.close()  # an unclosed client leaks its socket (a ResourceWarning = error here)
    return True


@contextlib.contextmanager
def _containers() -> Iterator[ServiceUrls]:
    from testcontainers.postgres import PostgresContainer
    from testcontainers.rabbitmq import RabbitMqContainer

    with (
        PostgresContainer("postgres:15", driver=None) as pg,
        RabbitMqContainer("rabbitmq:3.12") as mq,
    ):
        pg_url = pg.get_connection_url().replace(f"/{pg.dbname}", "/postgres")
        amqp = f"amqp://guest:guest@{mq.get_container_host_ip()}:{mq.get_exposed_port(5672)}/"
        yield ServiceUrls(pg_url, amqp)


@contextlib.contextmanager
def locate_services() -> Iterator[ServiceUrls]:
    """Yield reachable service URLs, or raise RuntimeError saying what is missing."""
    pg_url = os.environ.get("JOBCORE_TEST_PG_ADMIN_URL", DEFAULT_PG_ADMIN_URL)
    amqp_url = os.environ.get("JOBCORE_TEST_AMQP_URL", DEFAULT_AMQP_URL)
    problems = []
    if (error := _pg_error(pg_url)) is not None:
        problems.append(f"PostgreSQL at {pg_url}: {error}")
    if (error := _amqp_error(amqp_url)) is not None:
        problems.append(f"RabbitMQ at {amqp_url}: {error}")
    if not problems:
        yield ServiceUrls(pg_url, amqp_url)
        return
    if _docker_available():
        with _containers() as urls:
            yield urls
        return
    raise RuntimeError(
        "the integration tests need PostgreSQL and RabbitMQ and cannot reach them: "
        + "; ".join(problems)
        + ". Start them (see .ci/run) or set JOBCORE_TEST_PG_ADMIN_URL / "
        "JOBCORE_TEST_AMQP_URL; no Docker engine answered for testcontainers either."
    )
