"""Test harness on the real PostgreSQL and RabbitMQ.

Each test that asks for ``settings`` gets its own database (cloned from a migrated
template) and its own broker name prefix, so the suite runs twice in a row and in
parallel (pytest-xdist) without interference. A test that needs a service it cannot
reach fails with one clear message; it never skips.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aio_pika
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry, load_job_modules
from jobcore.kernel.settings import Settings
from tests.support import databases
from tests.support.services import ServiceUrls, locate_services

# The fixtures jobcore ships for handler authors (jobcore_settings, jobcore_db,
# jobcore_worker), enabled here exactly as docs/how-to/test-handlers.md tells its users to.
pytest_plugins = ["jobcore.testing.pytest_plugin"]

TEST_JOB_MODULES = ("jobcore.examples.jobtypes", "jobcore.testing.jobtypes")

load_job_modules(TEST_JOB_MODULES)


@pytest.fixture(scope="session")
def service_urls() -> Iterator[ServiceUrls]:
    try:
        with locate_services() as urls:
            yield urls
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _tests_resolve_jobcore_tables() -> Iterator[None]:
    """The tests' own connections find jobcore's tables unqualified; the product's pools
    do not (tests.support.databases)."""
    yield from databases.tests_resolve_jobcore_tables()


@pytest.fixture(scope="session")
def template_database(service_urls: ServiceUrls) -> str:
    return databases.ensure_template(service_urls.pg_admin_url)


@pytest.fixture
def database_url(service_urls: ServiceUrls, template_database: str) -> Iterator[str]:
    name = databases.create_database(service_urls.pg_admin_url, template=template_database)
    try:
        yield databases.with_database(service_urls.pg_admin_url, name)
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


@pytest.fixture
def settings(database_url: str, service_urls: ServiceUrls, tmp_path: Path) -> Settings:
    return Settings(
        environment="test",
        database_url=database_url,
        amqp_url=service_urls.amqp_url,
        amqp_prefix=f"jct.{uuid.uuid4().hex[:10]}",
        job_modules=TEST_JOB_MODULES,
        result_dir=tmp_path / "results",
        db_pool_max=12,
        shutdown_grace=5.0,
    )


@pytest.fixture
async def db(settings: Settings) -> AsyncIterator[Database]:
    """A pool for the test's own statements (which name jobcore's tables unqualified, with
    tests.support.databases.TEST_SEARCH_PATH) and for the library calls it makes."""
    url = databases.with_search_path(settings.database_url)
    database = Database(settings.model_copy(update={"database_url": url}))
    await database.open(wait=True)
    try:
        yield database
    finally:
        await database.close()


@pytest.fixture
def topology(settings: Settings) -> Topology:
    return Topology.from_settings(settings)


@pytest.fixture
async def amqp_channel(
    settings: Settings, topology: Topology
) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    """A channel on the real broker; the test's topology is deleted afterwards."""
    connection = await aio_pika.connect(settings.amqp_url, timeout=5)
    try:
        channel = await connection.channel()
        yield channel
        cleanup = await connection.channel()
        await topology.delete(cleanup, default_registry.queues())
    finally:
        await connection.close()
