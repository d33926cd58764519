"""jobcore in an application's database: every jobcore object in a schema of its own
(``JOBCORE_DATABASE_SCHEMA``), beside an application that has its own ``jobs`` and
``outbox`` tables and its own Alembic history in ``public``.

Both migrate, each in its own place; neither migration tool sees or touches the other's
tables; jobs enqueued from the application's connection (Python and SQL), whose
search_path is the application's, run to the end through a relay and a worker; the
application's rows are untouched. With the default schema and with another name, and
through PgBouncer in transaction mode, where no search_path can be set for jobcore.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext

from jobcore import enqueue_in
from jobcore.database import migrate
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from tests.integration.relay.helpers import running_relay
from tests.integration.worker.conftest import StartWorker
from tests.support import databases
from tests.support.pgbouncer import ensure_pgbouncer, through_pgbouncer
from tests.support.services import ServiceUrls

# The application's own search_path: it knows nothing of jobcore's schema.
APP_OPTIONS = "-c search_path=public"

APP_ENV = """
from alembic import context

with context.config.attributes["connection"] as connection:
    context.configure(connection=connection, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()
"""
APP_REVISION = """
from alembic import op
import sqlalchemy as sa

revision = "app0001"
down_revision = None


def upgrade() -> None:
    op.create_table("jobs", sa.Column("id", sa.BigInteger, primary_key=True),
                    sa.Column("title", sa.Text, nullable=False))
    op.create_table("outbox", sa.Column("id", sa.BigInteger, primary_key=True),
                    sa.Column("body", sa.Text, nullable=False))
    op.create_table("orders", sa.Column("id", sa.Integer, primary_key=True),
                    sa.Column("total", sa.Integer, nullable=False))


def downgrade() -> None:
    for name in ("orders", "outbox", "jobs"):
        op.drop_table(name)
"""

# The application's tables, as its own metadata declares them.
app_metadata = sa.MetaData()
sa.Table(
    "jobs",
    app_metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("title", sa.Text, nullable=False),
)
sa.Table(
    "outbox",
    app_metadata,
    sa.Column("id", sa.BigInteger, primary_key=True),
    sa.Column("body", sa.Text, nullable=False),
)
sa.Table(
    "orders",
    app_metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("total", sa.Integer, nullable=False),
)

# Every relation, function and sequence in a schema, by kind.
OBJECTS_IN = """
SELECT c.relkind::text AS kind, c.relname AS name FROM pg_class c
WHERE c.relnamespace = to_regnamespace(%(schema)s)
UNION ALL
SELECT 'f', p.proname FROM pg_proc p WHERE p.pronamespace = to_regnamespace(%(schema)s)
ORDER BY 1, 2
"""


class AppAlembic:
    """The application's own Alembic: its migrations directory and its connection."""

    def __init__(self, directory: Path, url: str) -> None:
        (directory / "versions").mkdir(parents=True)
        (directory / "env.py").write_text(APP_ENV)
        (directory / "versions" / "app0001.py").write_text(APP_REVISION)
        self.directory = directory
        self.engine = sa.create_engine(
            url, poolclass=sa.pool.NullPool, connect_args={"options": APP_OPTIONS}
        )

    def upgrade(self) -> None:
        config = Config()
        config.set_main_option("script_location", str(self.directory))
        config.attributes["connection"] = self.engine.connect()
        command.upgrade(config, "head")

    def current(self) -> str | None:
        with self.engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()

    def drift(self) -> list[Any]:
        with self.engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            return list(compare_metadata(context, app_metadata))


@pytest.fixture
def app_settings(
    request: pytest.FixtureRequest, wsettings: Settings, service_urls: ServiceUrls
) -> Iterator[Settings]:
    """An empty database of its own (no jobcore in it yet), with jobcore's schema named
    by the test's parameter."""
    name = databases.create_database(service_urls.pg_admin_url, template=None)
    url = databases.with_database(service_urls.pg_admin_url, name)
    try:
        yield wsettings.model_copy(update={"database_url": url, "database_schema": request.param})
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


def _app_connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True, options=APP_OPTIONS)


def _objects(url: str, schema: str) -> list[tuple[str, str]]:
    with _app_connect(url) as conn:
        return [(str(k), str(n)) for k, n in conn.execute(OBJECTS_IN, {"schema": schema})]


async def _run_jobs(
    settings: Settings, start_worker: StartWorker, *, app_url: str, app_options: str
) -> None:
    """One job enqueued with ``enqueue_in`` and one with the SQL function, each in an
    application transaction with an order row, on a connection with the application's
    search_path; both run once through a relay and a worker of ``settings``."""
    schema = settings.database_schema
    async with Database(settings) as db, running_relay(settings, db):
        await start_worker(settings)
        async with await psycopg.AsyncConnection.connect(
            app_url, options=app_options, prepare_threshold=None
        ) as conn:
            async with conn.transaction():
                await conn.execute("INSERT INTO orders VALUES (1, 10)")
                result = await enqueue_in(
                    conn, default_registry, "echo", {"text": "one"}, tenant="t", settings=settings
                )
            async with conn.transaction():
                await conn.execute("INSERT INTO orders VALUES (2, 20)")
                cur = await conn.execute(
                    f"SELECT {schema}.enqueue('echo', '{{\"text\": \"two\"}}', tenant => 't')"
                )
                row = await cur.fetchone()
                assert row is not None
            ids = [result.job_id, row[0]]

            async def done() -> bool:
                cur = await conn.execute(
                    f"SELECT count(*) FROM {schema}.jobs WHERE id = ANY(%s) "
                    "AND status = 'succeeded' AND attempts = 1",
                    [ids],
                )
                found = await cur.fetchone()
                return found is not None and found[0] == 2

            await eventually(done, timeout=60, what="both jobs to succeed")


@pytest.mark.parametrize("app_settings", ["jobcore", "tasks"], indirect=True)
async def test_jobcore_and_an_application_share_a_database(
    app_settings: Settings, start_worker: StartWorker, tmp_path: Path
) -> None:
    settings = app_settings
    schema = settings.database_schema
    url = settings.database_url
    app = AppAlembic(tmp_path / "app_migrations", settings.sqlalchemy_url)
    try:
        await asyncio.to_thread(app.upgrade)
        with _app_connect(url) as conn:
            conn.execute("INSERT INTO jobs (id, title) VALUES (1, 'the app''s own job')")
            conn.execute("INSERT INTO outbox (id, body) VALUES (1, 'the app''s own message')")
        app_objects = _objects(url, "public")

        before, after = await asyncio.to_thread(migrate.upgrade, settings)

        assert (before, after) == (None, migrate.head_revision())
        # jobcore's migrations created nothing in public and changed nothing there.
        assert _objects(url, "public") == app_objects
        ours = _objects(url, schema)
        for table in ("jobs", "outbox", "inbox", "alembic_version"):
            assert ("r", table) in ours
        assert ("f", "enqueue") in ours
        if schema != "jobcore":
            assert _objects(url, "jobcore") == []
        # The application's Alembic sees its own revision and tables only.
        assert app.current() == "app0001"
        assert app.drift() == []
        await asyncio.to_thread(app.upgrade)  # nothing to do, nothing of jobcore's touched
        assert _objects(url, schema) == ours
        with _app_connect(url) as conn:
            [(revision,)] = conn.execute(f"SELECT version_num FROM {schema}.alembic_version")
            assert revision == migrate.head_revision()

        await _run_jobs(settings, start_worker, app_url=url, app_options=APP_OPTIONS)

        with _app_connect(url) as conn:
            assert conn.execute("SELECT id, title FROM jobs").fetchall() == [
                (1, "the app's own job")
            ]
            assert conn.execute("SELECT id, body FROM outbox").fetchall() == [
                (1, "the app's own message")
            ]
            assert conn.execute("SELECT count(*) FROM orders").fetchone() == (2,)
        # `jobcore migrate` again: nothing to do, and the application's revision stays.
        assert await asyncio.to_thread(migrate.upgrade, settings) == (after, after)
        assert app.current() == "app0001"
    finally:
        app.engine.dispose()


@pytest.mark.parametrize("app_settings", ["tasks"], indirect=True)
async def test_another_schema_behind_pgbouncer(
    app_settings: Settings, start_worker: StartWorker
) -> None:
    """Through PgBouncer in transaction mode, where jobcore sets no search_path: the
    worker's, the relay's and the application's statements all reach the schema by name."""
    try:
        ensure_pgbouncer()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    await asyncio.to_thread(migrate.upgrade, app_settings)
    with _app_connect(app_settings.database_url) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total int NOT NULL)")
    pooled = through_pgbouncer(app_settings.database_url)
    settings = app_settings.model_copy(
        update={"database_url": pooled, "database_pooler": "pgbouncer", "listen_database_url": ""}
    )
    # PgBouncer takes no startup options: the database's default search_path, public.
    await _run_jobs(settings, start_worker, app_url=pooled, app_options="")
    with _app_connect(app_settings.database_url) as conn:
        assert conn.execute("SELECT count(*) FROM tasks.jobs").fetchone() == (2,)
        assert conn.execute("SELECT to_regnamespace('jobcore')").fetchone() == (None,)
