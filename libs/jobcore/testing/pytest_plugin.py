"""pytest fixtures for handler authors. Enable them in the top-level ``conftest.py``::

    pytest_plugins = ["jobcore.testing.pytest_plugin"]

(opt-in rather than a ``pytest11`` entry point: the fixtures need PostgreSQL and
pytest-asyncio, and a project that installs jobcore without testing handlers should not
find them in every pytest run.)

- ``jobcore_settings``: :class:`~jobcore.kernel.settings.Settings` from the environment, pointed
  at a database of the test's own, cloned from a template migrated once and kept across
  runs while the migrations stay the same (``JOBCORE_DATABASE_URL`` names the server; the
  database is dropped after the test). Result files go to the test's ``tmp_path``, and
  retries wait milliseconds instead of seconds. The modules in ``JOBCORE_JOB_MODULES`` are
  imported, as the worker imports them.
- ``jobcore_db``: an open :class:`~jobcore.database.gateway.Database` on it.
- ``jobcore_worker``: an :class:`~jobcore.testing.draining.InlineWorker` on it: enqueue
  with ``await jobcore_worker.enqueue(type, payload)``, then ``await
  jobcore_worker.drain()`` runs every due job (and its retries) to its end, in this
  process, through the real claim and outcome statements, without a broker.

A server that cannot be reached fails the test with one line, never skips it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from jobcore.database.gateway import Database
from jobcore.execution.registry import load_job_modules
from jobcore.kernel.errors import JobcoreError
from jobcore.kernel.settings import Settings, load_settings
from jobcore.testing.draining import InlineWorker
from jobcore.testing.scratch import clone_database, drop_database, ensure_template

# Retries of a failed attempt come due within this many seconds, so a drain runs them.
TEST_RETRY_BACKOFF = 0.01


@pytest.fixture(scope="session")
def jobcore_template() -> str:
    """The migrated template database the tests' databases are cloned from."""
    try:
        return ensure_template(load_settings())
    except (JobcoreError, OSError) as exc:
        pytest.fail(f"jobcore: cannot prepare the test database: {exc}", pytrace=False)
    except Exception as exc:  # psycopg's connection errors, said in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        pytest.fail(f"jobcore: cannot reach PostgreSQL: {first}", pytrace=False)


@pytest.fixture
def jobcore_settings(jobcore_template: str, tmp_path: Path) -> Iterator[Settings]:
    base = load_settings()
    url = clone_database(base, jobcore_template)
    config = load_settings(
        environment="test",
        database_url=url,
        result_dir=tmp_path / "results",
        retry_backoff_base=TEST_RETRY_BACKOFF,
        retry_backoff_cap=TEST_RETRY_BACKOFF,
    )
    load_job_modules(config.job_modules)
    try:
        yield config
    finally:
        drop_database(config)


@pytest_asyncio.fixture
async def jobcore_db(jobcore_settings: Settings) -> AsyncIterator[Database]:
    database = Database(jobcore_settings)
    await database.open(wait=True)
    try:
        yield database
    finally:
        await database.close()


@pytest_asyncio.fixture
async def jobcore_worker(jobcore_db: Database) -> InlineWorker:
    return InlineWorker(jobcore_db)
