"""`jobcore migrate` and the schema: no drift between migrations and the library metadata."""

from __future__ import annotations

import subprocess

import psycopg
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, pool

from jobcore import migrate
from jobcore.schema import metadata
from jobcore.settings import Settings
from jobcore.testing.processes import jobcore_command, settings_env
from tests.support import databases
from tests.support.services import ServiceUrls


def _empty_database_settings(service_urls: ServiceUrls) -> tuple[Settings, str]:
    name = databases.create_database(service_urls.pg_admin_url, template=None)
    url = databases.with_database(service_urls.pg_admin_url, name)
    return Settings(database_url=url, amqp_url=service_urls.amqp_url), name


def test_migrated_schema_equals_library_metadata(service_urls: ServiceUrls) -> None:
    settings, name = _empty_database_settings(service_urls)
    try:
        migrate.upgrade(settings)
        engine = create_engine(settings.sqlalchemy_url, poolclass=pool.NullPool)
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            diff = compare_metadata(context, metadata)
        engine.dispose()
        assert diff == []
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


def test_migrate_command_is_a_no_op_the_second_time(service_urls: ServiceUrls) -> None:
    settings, name = _empty_database_settings(service_urls)
    env = settings_env(settings)
    try:
        first = subprocess.run(jobcore_command("migrate"), env=env, capture_output=True, text=True)
        assert first.returncode == 0, first.stderr
        assert f"from empty to {migrate.head_revision()}" in first.stdout
        second = subprocess.run(jobcore_command("migrate"), env=env, capture_output=True, text=True)
        assert second.returncode == 0, second.stderr
        assert "nothing to do" in second.stdout
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


def test_migrate_creates_a_missing_database_only_when_asked(service_urls: ServiceUrls) -> None:
    name = "jobcore_t_missing_" + databases.migrations_fingerprint()
    databases.drop_database(service_urls.pg_admin_url, name)
    settings = Settings(database_url=databases.with_database(service_urls.pg_admin_url, name))
    env = settings_env(settings)
    try:
        refused = subprocess.run(
            jobcore_command("migrate"), env=env, capture_output=True, text=True
        )
        assert refused.returncode == 1
        assert refused.stderr.count("\n") == 1
        assert "JOBCORE_DATABASE_URL" in refused.stderr
        assert "does not exist" in refused.stderr
        created = subprocess.run(
            jobcore_command("migrate", "--create-database"), env=env, capture_output=True, text=True
        )
        assert created.returncode == 0, created.stderr
        assert f"created database {name}" in created.stdout
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


def test_migrate_against_an_unreachable_database_fails_in_one_line(
    service_urls: ServiceUrls,
) -> None:
    env = settings_env(Settings(database_url="postgresql://postgres@127.0.0.1:1/jobcore"))
    result = subprocess.run(jobcore_command("migrate"), env=env, capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stderr.startswith("jobcore: JOBCORE_DATABASE_URL:")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_outbox_tenant_migration_backfills_rows_from_their_jobs(service_urls: ServiceUrls) -> None:
    settings, name = _empty_database_settings(service_urls)
    try:
        migrate.upgrade(settings, "0007")
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            conn.execute(
                """
                INSERT INTO jobs (id, tenant, type, queue)
                VALUES ('00000000-0000-0000-0000-00000000000a', 'acme', 'echo', 'testq');
                INSERT INTO outbox (message_id, exchange, routing_key, message_type, body, job_id)
                VALUES (gen_random_uuid(), 'x', 'testq', 'echo', '\\x00',
                        '00000000-0000-0000-0000-00000000000a'),
                       (gen_random_uuid(), 'x', 'testq', 'echo', '\\x00', NULL);
                """
            )
        migrate.upgrade(settings)
        with psycopg.connect(settings.database_url) as conn:
            rows = conn.execute("SELECT job_id IS NULL, tenant FROM outbox ORDER BY id").fetchall()
            # A writer that predates the column still works: its rows fall in the '' tenant.
            conn.execute(
                "INSERT INTO outbox (message_id, exchange, routing_key, message_type, body) "
                "VALUES (gen_random_uuid(), 'x', 'testq', 'echo', '\\x00')"
            )
            [(old_writer,)] = conn.execute("SELECT tenant FROM outbox WHERE id = 3").fetchall()
        assert rows == [(False, "acme"), (True, "")]
        assert old_writer == ""
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)
