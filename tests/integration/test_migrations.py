"""`jobcore migrate` and the schema: no drift between migrations and the library metadata."""

from __future__ import annotations

import subprocess
import uuid
from typing import Any

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from psycopg.types.json import Jsonb
from sqlalchemy import create_engine, inspect, pool

from jobcore.database import migrate
from jobcore.database.migration_steps import valid_or_refuse
from jobcore.database.schema import metadata
from jobcore.kernel.settings import Settings
from jobcore.testing.processes import jobcore_command, settings_env
from jobcore.testing.waiting import eventually_sync
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
        # Compared inside jobcore's schema, where the migrations create every object.
        engine = create_engine(
            settings.sqlalchemy_url,
            poolclass=pool.NullPool,
            connect_args={"options": f"-c search_path={settings.database_schema}"},
        )
        with engine.connect() as connection:
            assert "jobs" in inspect(connection).get_table_names()
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


# Every index on jobcore's tables that a CREATE INDEX CONCURRENTLY left unusable.
INVALID_INDEXES = (
    "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    "JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = current_schema() AND NOT i.indisvalid ORDER BY 1"
)
# The backend of a `jobcore migrate` whose CREATE INDEX CONCURRENTLY waits for a lock.
BUILD_WAITING = (
    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
    "AND query ILIKE 'CREATE INDEX CONCURRENTLY%%' AND wait_event_type = 'Lock'"
)


TAKE_MIGRATE_LOCK = "SELECT pg_advisory_lock(hashtext(%(key)s))"
RELEASE_MIGRATE_LOCK = "SELECT pg_advisory_unlock(hashtext(%(key)s))"


def _lock_waiters(watch: psycopg.Connection[tuple[object, ...]]) -> int:
    """How many sessions wait for an advisory lock in this database."""
    row = watch.execute(
        "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
        "WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = current_database()"
    ).fetchone()
    return int(row[0]) if row else 0


def _invalid_indexes(settings: Settings) -> list[str]:
    with psycopg.connect(settings.database_url) as conn:
        return [str(name) for (name,) in conn.execute(INVALID_INDEXES).fetchall()]


def _schema_drift(settings: Settings) -> list[object]:
    engine = create_engine(settings.sqlalchemy_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def _hold_outbox_writes(settings: Settings) -> psycopg.Connection[tuple[object, ...]]:
    """A writer's open transaction on the outbox: a concurrent index build on it waits for
    this to end, and gives up after the migration's lock_timeout."""
    holder = psycopg.connect(settings.database_url)
    holder.execute("LOCK TABLE outbox IN ROW EXCLUSIVE MODE")
    return holder


def _migrate(settings: Settings) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobcore_command("migrate"),
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _one_line_failure(returncode: int | None, stderr: str) -> None:
    assert returncode == 1, stderr
    assert stderr.startswith("jobcore: "), stderr
    assert stderr.count("\n") == 1, stderr
    assert "Traceback" not in stderr


def test_after_migrating_no_index_is_invalid(service_urls: ServiceUrls) -> None:
    settings, name = _empty_database_settings(service_urls)
    try:
        migrate.upgrade(settings)
        with psycopg.connect(settings.database_url) as conn:
            [(indexes,)] = conn.execute(
                "SELECT count(*) FROM pg_indexes WHERE schemaname = current_schema()"
            ).fetchall()
        assert int(str(indexes)) > 20  # the query sees jobcore's indexes
        assert _invalid_indexes(settings) == []
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


def test_migrate_rebuilds_an_index_a_timed_out_concurrent_build_left_invalid(
    service_urls: ServiceUrls,
) -> None:
    settings, name = _empty_database_settings(service_urls)
    try:
        migrate.upgrade(settings, "0020")
        holder = _hold_outbox_writes(settings)
        try:
            timed_out = _migrate(settings)
        finally:
            holder.rollback()
            holder.close()
        _one_line_failure(timed_out.returncode, timed_out.stderr)
        assert "0021" in timed_out.stderr
        assert "outbox_ready_lanes_idx" in _invalid_indexes(settings)
        assert migrate.current_revision(settings) == "0020"

        again = _migrate(settings)
        assert again.returncode == 0, again.stderr
        assert migrate.current_revision(settings) == migrate.head_revision()
        assert _invalid_indexes(settings) == []
        assert _schema_drift(settings) == []
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


def test_two_migrate_runs_take_turns_while_a_build_waits(service_urls: ServiceUrls) -> None:
    """The first run's build of 0021 waits for a writer's transaction and times out; the
    second, queued behind it, must not build on it nor record 0021 past it.

    The test holds the runs' lock itself until both queue for it, in order, so that the
    second is waiting when the first's build starts however slowly the processes start
    (the build gives up after its lock_timeout, which a loaded machine's start-up can
    exceed). PostgreSQL grants queued lock requests of one mode in their order."""
    settings, name = _empty_database_settings(service_urls)
    env = settings_env(settings)
    try:
        migrate.upgrade(settings, "0020")
        holder = _hold_outbox_writes(settings)
        runs: list[subprocess.Popen[str]] = []
        try:
            with psycopg.connect(settings.database_url, autocommit=True) as watch:
                watch.execute(TAKE_MIGRATE_LOCK, {"key": migrate.LOCK_KEY})
                for queued in (1, 2):
                    runs.append(
                        subprocess.Popen(
                            jobcore_command("migrate"),
                            env=env,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            text=True,
                        )
                    )
                    eventually_sync(
                        lambda queued=queued: (
                            _lock_waiters(watch) == queued
                            or any(run.poll() is not None for run in runs)
                        ),
                        timeout=120,
                        what=f"migrate run {queued} to queue for the lock",
                    )
                assert all(run.poll() is None for run in runs), "a run ended before its turn"
                watch.execute(RELEASE_MIGRATE_LOCK, {"key": migrate.LOCK_KEY})
                # The writer stays until the first run's build gives up (its lock_timeout).
                eventually_sync(
                    lambda: runs[0].poll() is not None, timeout=60, what="the first run's end"
                )
        finally:
            holder.rollback()
            holder.close()
        (_, first_err), (second_out, second_err) = [run.communicate(timeout=120) for run in runs]
        # The first run's build gave up and said so; the second waited for it, then found
        # the index it left INVALID and built it again.
        _one_line_failure(runs[0].returncode, first_err)
        assert "migration 0021 failed" in first_err
        assert runs[1].returncode == 0, second_err
        assert "waiting for it" in second_out
        assert migrate.current_revision(settings) == migrate.head_revision()
        assert _invalid_indexes(settings) == []
        assert _schema_drift(settings) == []
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


# A session that holds outbox's ShareUpdateExclusiveLock: a concurrent index build does,
# from its start to its end.
BUILD_HOLDS_OUTBOX = (
    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
    "WHERE c.relname = 'outbox' AND l.mode = 'ShareUpdateExclusiveLock' AND l.granted "
    "AND l.pid <> pg_backend_pid()"
)


def test_migrate_runs_a_build_that_lost_a_deadlock_again(service_urls: ServiceUrls) -> None:
    """A reader's transaction that came to need the lock a concurrent build holds, while
    the build waits for that transaction's snapshot to end: PostgreSQL fails one side. The
    build's side is made the one: it checks for deadlocks 3 s after it starts to wait (so the
    reader's request must come within 3 s, and the check comes before the build's 5 s
    lock_timeout), the reader after 60 s. `jobcore migrate` runs the migration again, and the
    upgrade completes in the one run."""
    settings, name = _empty_database_settings(service_urls)
    env = {**settings_env(settings), "PGOPTIONS": "-c deadlock_timeout=3s"}
    try:
        migrate.upgrade(settings, "0020")
        with (
            psycopg.connect(settings.database_url, autocommit=True) as reader,
            psycopg.connect(settings.database_url, autocommit=True) as watch,
        ):
            reader.execute("SET deadlock_timeout = '60s'")
            reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            reader.execute("SELECT count(*) FROM outbox")  # a snapshot the build waits for
            run = subprocess.Popen(
                jobcore_command("migrate"),
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                eventually_sync(
                    lambda: _count(watch, BUILD_HOLDS_OUTBOX) > 0 or run.poll() is not None,
                    timeout=60,
                    what="migration 0021's build to start",
                )
                assert run.poll() is None, run.communicate()
                # Needs the lock the build holds: waits, and the build waits for it.
                reader.execute("ANALYZE outbox")
                reader.execute("COMMIT")
                _, err = run.communicate(timeout=120)
            finally:
                if run.poll() is None:
                    run.kill()
                    run.communicate()
        assert run.returncode == 0, err
        assert "migration 0021: deadlock detected" in err, err
        assert "attempt 2 of 3" in err, err
        assert migrate.current_revision(settings) == migrate.head_revision()
        assert _invalid_indexes(settings) == []
        assert _schema_drift(settings) == []
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


def _count(conn: psycopg.Connection[tuple[object, ...]], query: str) -> int:
    row = conn.execute(query).fetchone()
    assert row is not None
    return int(str(row[0]))


# jobcore_enqueue's signatures, one row each, and whether PUBLIC may execute them.
ENQUEUE_FUNCTIONS = (
    "SELECT p.oid::regprocedure::text AS signature,"
    " has_function_privilege('public', p.oid, 'EXECUTE') AS public"
    " FROM pg_proc AS p WHERE p.proname = 'jobcore_enqueue'"
)


def test_the_sql_enqueues_admission_parameter_keeps_its_grants_both_ways(
    service_urls: ServiceUrls,
) -> None:
    """Adding ``admission`` to jobcore_enqueue replaces the function, not overloads it (a
    call naming neither would be ambiguous), and a role granted EXECUTE keeps it across
    the upgrade and the downgrade."""
    from alembic import command

    settings, name = _empty_database_settings(service_urls)
    role = f"jobcore_app_{name[-8:]}"
    old = (
        "jobcore_enqueue(text,jsonb,text,text,text,text,text,timestamp with time zone,"
        "interval,integer,text)"
    )
    new = old.replace("integer,text)", "integer,text,text)")
    try:
        migrate.upgrade(settings, "0026")
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {role}")
            conn.execute(f"GRANT EXECUTE ON FUNCTION {old} TO {role}")
        migrate.upgrade(settings, "0029")
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            assert conn.execute(ENQUEUE_FUNCTIONS).fetchall() == [(new, False)]
            [(granted,)] = conn.execute(
                "SELECT has_function_privilege(%s, %s, 'EXECUTE')", [role, new]
            ).fetchall()
            assert granted
        # Down to before the revision that added the argument (0029), through the later
        # ones that replace the function with the same signature.
        command.downgrade(migrate.alembic_config(settings), "0028")
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            assert conn.execute(ENQUEUE_FUNCTIONS).fetchall() == [(old, False)]
            [(granted,)] = conn.execute(
                "SELECT has_function_privilege(%s, %s, 'EXECUTE')", [role, old]
            ).fetchall()
            assert granted
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)
        with psycopg.connect(service_urls.pg_admin_url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_the_job_row_events_downgrade_writes_their_rows_back(service_urls: ServiceUrls) -> None:
    """0041 keeps a happy job's first publish and its end on the job row; its downgrade
    writes them as the `published` and `finished` rows the previous revision reads, and
    the end a revived step carried, each once beside the rows already there."""
    from alembic import command

    settings, name = _empty_database_settings(service_urls)
    happy, old, revived = (f"00000000-0000-4000-8000-00000000004{i}" for i in range(3))
    try:
        migrate.upgrade(settings, "0041")
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            conn.execute(
                """
                INSERT INTO jobs (id, tenant, type, queue, status, attempts, started_at,
                                  finished_at, last_error, published_at, published_by,
                                  published_message_id)
                VALUES (%(happy)s, 't', 'echo', 'q', 'succeeded', 1,
                        '2026-12-06 20:00:01+00', '2026-12-06 20:00:02+00', NULL,
                        '2026-12-06 20:00:00.5+00', 'r-1',
                        '00000000-0000-4000-8000-0000000000aa'),
                       (%(old)s, 't', 'echo', 'q', 'failed', 1, '2026-12-06 20:00:01+00',
                        '2026-12-06 20:00:02+00', 'boom', NULL, NULL, NULL),
                       (%(revived)s, 't', 'echo', 'q', 'pending', 1,
                        '2026-12-06 20:00:01+00', NULL, 'boom', NULL, NULL, NULL)
                """,
                {"happy": happy, "old": old, "revived": revived},
            )
            conn.execute(
                """
                INSERT INTO job_events (job_id, at, kind, attempt, detail)
                VALUES (%(old)s, '2026-12-06 20:00:02.001+00', 'finished', 1,
                        '{"status": "failed", "error": "boom"}'),
                       (%(revived)s, '2026-12-06 20:00:03+00', 'revived', 1,
                        '{"workflow": "w", "retried": true, "finish": {
                          "at": "2026-12-06T20:00:02+00:00", "status": "failed",
                          "attempt": 1, "error": "boom"}}');
                """,
                {"happy": happy, "old": old, "revived": revived},
            )
        command.downgrade(migrate.alembic_config(settings), "0040")
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            conn.execute("SET TimeZone = 'UTC'")
            rows = conn.execute(
                "SELECT job_id::text, kind, attempt, detail, at::text FROM job_events"
                " ORDER BY job_id, at"
            ).fetchall()
            columns = conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'jobs'"
                " AND column_name LIKE 'published%'"
            ).fetchall()
        assert columns == []
        assert rows == [
            (happy, "published", 1, {"relay": "r-1", "message_id": MESSAGE_AA}, AT_PUBLISHED),
            (happy, "finished", 1, {"status": "succeeded"}, "2026-12-06 20:00:02+00"),
            (old, "finished", 1, {"status": "failed", "error": "boom"}, AT_OLD_FINISHED),
            (revived, "finished", 1, {"status": "failed", "error": "boom"}, AT_LEFT),
            (revived, "revived", 1, {"workflow": "w", "retried": True}, AT_REVIVED),
        ]
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


MESSAGE_AA = "00000000-0000-4000-8000-0000000000aa"
AT_PUBLISHED = "2026-12-06 20:00:00.5+00"
AT_OLD_FINISHED = "2026-12-06 20:00:02.001+00"
AT_LEFT = "2026-12-06 20:00:02+00"
AT_REVIVED = "2026-12-06 20:00:03+00"
LEAN_INDEXES_REVISION = "0042"
OUTBOX_AND_JOBS_INDEXES = (
    "SELECT c.relname, pg_get_expr(i.indpred, i.indrelid) IS NOT NULL AS partial,"
    " i.indisunique, EXISTS (SELECT 1 FROM pg_constraint AS k WHERE k.conindid = c.oid)"
    " FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid"
    " WHERE c.relname IN ('outbox_message_id_key', 'outbox_quarantined_message_idx',"
    " 'jobs_status_created_idx', 'jobs_status_created_not_running_idx')"
    " AND i.indrelid IN (to_regclass('outbox'), to_regclass('jobs')) ORDER BY 1"
)
MESSAGE = "INSERT INTO outbox (message_id, exchange, routing_key, message_type, body) VALUES " + (
    "('6f1c2a52-7d1e-4f33-9d36-9a3a1e0b7c11', 'x', 'default', 'noop', '\\x7b7d')"
)


def _previous_revision(settings: Settings, revision_id: str) -> str:
    """The revision ``revision_id`` upgrades from."""
    from alembic.script import ScriptDirectory

    config = migrate.alembic_config(settings)
    revision = ScriptDirectory.from_config(config).get_revision(revision_id)
    assert revision is not None
    return str(revision.down_revision)


def test_the_lean_indexes_revision_goes_both_ways_with_jobs_and_messages_in_place(
    service_urls: ServiceUrls,
) -> None:
    """0042 drops the unique key of message ids and the status index's running entries
    (the indexes built first, CONCURRENTLY, then the old ones dropped), and its downgrade
    builds them again, the unique index made the constraint it was."""
    from alembic import command

    settings, name = _empty_database_settings(service_urls)
    config = migrate.alembic_config(settings)
    previous = _previous_revision(settings, LEAN_INDEXES_REVISION)
    try:
        migrate.upgrade(settings, previous)
        with psycopg.connect(settings.database_url) as conn:
            conn.execute(MESSAGE)
            conn.execute(
                "INSERT INTO jobs (id, tenant, type, queue, status) SELECT gen_random_uuid(),"
                " 't', 'noop', 'default', s FROM unnest(ARRAY['pending', 'running']) AS s"
            )
            before = conn.execute(OUTBOX_AND_JOBS_INDEXES).fetchall()
        assert before == [
            ("jobs_status_created_idx", False, False, False),
            ("outbox_message_id_key", False, True, True),
        ]

        migrate.upgrade(settings, LEAN_INDEXES_REVISION)
        with psycopg.connect(settings.database_url) as conn:
            assert conn.execute(OUTBOX_AND_JOBS_INDEXES).fetchall() == [
                ("jobs_status_created_not_running_idx", True, False, False),
                ("outbox_quarantined_message_idx", True, False, False),
            ]
        assert _invalid_indexes(settings) == []

        command.downgrade(config, previous)
        with psycopg.connect(settings.database_url) as conn:
            assert conn.execute(OUTBOX_AND_JOBS_INDEXES).fetchall() == before
        assert _invalid_indexes(settings) == []

        migrate.upgrade(settings)
        assert _schema_drift(settings) == []
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


TENANT_INDEX_REVISION = "0043"
TENANT_INDEX = "SELECT pg_get_indexdef(to_regclass('jobs_tenant_created_idx'))"
TENANT_INDEX_SIZE = "SELECT pg_relation_size('jobs_tenant_created_idx')"
# One tenant's jobs, each created after the last, inserted one after another as an
# enqueue inserts them.
ONE_TENANTS_JOBS = (
    "INSERT INTO jobs (id, tenant, type, queue, created_at) SELECT gen_random_uuid(), 'solo',"
    " 'noop', 'default', %(start)s::timestamptz + make_interval(secs => g / 1000.0)"
    " FROM generate_series(1, %(jobs)s) AS g"
)
GROWTH_JOBS = 20_000


def _tenant_index_growth(settings: Settings, start: str) -> int:
    """Bytes the tenant index grows by while one tenant enqueues GROWTH_JOBS jobs."""
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        before = conn.execute(TENANT_INDEX_SIZE).fetchone()
        conn.execute(ONE_TENANTS_JOBS, {"start": start, "jobs": GROWTH_JOBS})
        after = conn.execute(TENANT_INDEX_SIZE).fetchone()
    assert before is not None
    assert after is not None
    return int(after[0]) - int(before[0])


def _tenant_index(settings: Settings) -> str:
    with psycopg.connect(settings.database_url) as conn:
        row = conn.execute(TENANT_INDEX).fetchone()
    assert row is not None
    return str(row[0])


def test_the_ascending_tenant_index_fills_its_pages_and_goes_both_ways(
    service_urls: ServiceUrls,
) -> None:
    """0043 makes jobs_tenant_created_idx ascending: a tenant's new jobs go to the right end
    of its range, which for one tenant is the index's rightmost page, filled to 90 % where
    a descending index splits its pages in half. The downgrade makes it descending again."""
    from alembic import command

    settings, name = _empty_database_settings(service_urls)
    config = migrate.alembic_config(settings)
    previous = _previous_revision(settings, TENANT_INDEX_REVISION)
    try:
        migrate.upgrade(settings, previous)
        assert _tenant_index(settings).endswith("(tenant, created_at DESC, id DESC)")
        descending = _tenant_index_growth(settings, "2026-12-01")

        migrate.upgrade(settings, TENANT_INDEX_REVISION)
        assert _tenant_index(settings).endswith("(tenant, created_at, id)")
        assert _invalid_indexes(settings) == []
        ascending = _tenant_index_growth(settings, "2026-12-02")
        # About 89 against 50 bytes a job on PostgreSQL 15.
        assert ascending * 1.5 < descending, (ascending, descending)

        command.downgrade(config, previous)
        assert _tenant_index(settings).endswith("(tenant, created_at DESC, id DESC)")
        assert _invalid_indexes(settings) == []

        migrate.upgrade(settings)
        assert _tenant_index(settings).endswith("(tenant, created_at, id)")
        assert _schema_drift(settings) == []
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


def test_the_ascending_tenant_index_drops_nothing_for_a_missing_or_invalid_build(
    service_urls: ServiceUrls,
) -> None:
    """0043 builds through create_indexes_concurrently, which checks the index it built
    before the migration goes on to drop the one it replaces, in the SQL it writes too: a
    script run offline again after a failed build would find the INVALID index the build
    left, skip building it (IF NOT EXISTS) and drop the good one."""
    guard = valid_or_refuse("jobs_tenant_created_asc_idx")
    settings, name = _empty_database_settings(service_urls)
    try:
        migrate.upgrade(settings, _previous_revision(settings, TENANT_INDEX_REVISION))
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            with pytest.raises(psycopg.errors.RaiseException, match="missing or INVALID"):
                conn.execute(guard)
            conn.execute(
                "CREATE INDEX jobs_tenant_created_asc_idx ON jobs (tenant, created_at, id)"
            )
            conn.execute(guard)
            # As an interrupted CREATE INDEX CONCURRENTLY leaves it.
            conn.execute(
                "UPDATE pg_index SET indisvalid = false"
                " WHERE indexrelid = to_regclass('jobs_tenant_created_asc_idx')"
            )
            with pytest.raises(psycopg.errors.RaiseException, match="missing or INVALID"):
                conn.execute(guard)
        # Online, the build finds the INVALID index and builds it again.
        migrate.upgrade(settings, TENANT_INDEX_REVISION)
        assert _tenant_index(settings).endswith("(tenant, created_at, id)")
        assert _invalid_indexes(settings) == []
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


LEAN_FINGERPRINT_REVISION = "0044"
MESSAGE_ID_REVISION = "0046"
ENQUEUE_SAYS = (
    "SELECT (SELECT count(*) FROM regexp_matches(pg_get_functiondef(to_regprocedure("
    "'enqueue(text, jsonb, text, text, text, text, text, timestamptz, interval, integer,"
    " text, text)')), %s, 'g'))::int"
)


def _enqueue_says(settings: Settings, pattern: str) -> int:
    """How many times the SQL enqueue's definition has ``pattern`` (a regular expression)."""
    with psycopg.connect(settings.database_url) as conn:
        row = conn.execute(ENQUEUE_SAYS, (pattern,)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize(
    ("revision", "pattern", "before", "after"),
    [
        # Both of its inserts of a job keep the fingerprint only with an idempotency key.
        (LEAN_FINGERPRINT_REVISION, "THEN v_fingerprint END", 0, 2),
        # A job's first message has the job's id, not one of its own.
        (MESSAGE_ID_REVISION, "v_message_id := v_id;", 0, 1),
    ],
)
def test_a_rewrite_of_the_sql_enqueue_goes_both_ways(
    service_urls: ServiceUrls, revision: str, pattern: str, before: int, after: int
) -> None:
    """A migration that rewrites lines of the SQL enqueue in place (migration_steps
    .rewrite_function) changes them on upgrade, and its downgrade puts them back."""
    from alembic import command

    settings, name = _empty_database_settings(service_urls)
    previous = _previous_revision(settings, revision)
    try:
        migrate.upgrade(settings, previous)
        assert _enqueue_says(settings, pattern) == before
        migrate.upgrade(settings, revision)
        assert _enqueue_says(settings, pattern) == after
        command.downgrade(migrate.alembic_config(settings), previous)
        assert _enqueue_says(settings, pattern) == before
        migrate.upgrade(settings)
        assert _enqueue_says(settings, pattern) == after
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


IN_BATCH_REVISION = "0045"


def _accepted_details(settings: Settings) -> dict[str, Any]:
    """Each job's accepted_detail (and accepted_in_batch where the column is there), by type."""
    with psycopg.connect(settings.database_url) as conn:
        has_column = conn.execute(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'jobs' AND column_name = 'accepted_in_batch'"
            " AND table_schema = current_schema()"
        ).fetchone()
        assert has_column is not None
        flag = "accepted_in_batch" if has_column[0] else "NULL::boolean"
        rows = conn.execute(f"SELECT type, accepted_detail, {flag} FROM jobs").fetchall()
    return {row[0]: (row[1], row[2]) for row in rows}


def test_a_batch_flag_kept_as_a_boolean_goes_back_into_the_json_on_downgrade(
    service_urls: ServiceUrls,
) -> None:
    """0045 adds accepted_in_batch; its downgrade writes `batch` back into the JSON of the
    jobs that have it set, so the previous revision's timeline still says it, and leaves
    the jobs that said it in their JSON as they are. It also writes a job's id into
    published_message_id where a publish is kept without one (the first message had the
    job's id), and leaves a message id of its own as it is."""
    from alembic import command

    settings, name = _empty_database_settings(service_urls)
    previous = _previous_revision(settings, IN_BATCH_REVISION)
    insert = (
        "INSERT INTO jobs (id, tenant, type, queue, accepted_detail) VALUES (%s, 't', %s, 'q', %s)"
    )
    try:
        migrate.upgrade(settings, previous)
        with psycopg.connect(settings.database_url) as conn:
            conn.execute(insert, (uuid.uuid4(), "old-batch", Jsonb({"batch": True})))
            conn.execute(insert, (uuid.uuid4(), "single", None))
        migrate.upgrade(settings, IN_BATCH_REVISION)
        with psycopg.connect(settings.database_url) as conn:
            conn.execute(
                "INSERT INTO jobs (id, tenant, type, queue, accepted_detail, accepted_in_batch)"
                " VALUES (%s, 't', 'new-batch', 'q', %s, true)",
                (uuid.uuid4(), Jsonb({"run_at": "2026-12-07T10:00:00+00:00"})),
            )
        assert _accepted_details(settings)["new-batch"] == (
            {"run_at": "2026-12-07T10:00:00+00:00"},
            True,
        )
        other = uuid.uuid4()
        with psycopg.connect(settings.database_url) as conn:
            conn.execute(
                "UPDATE jobs SET published_at = now(), published_message_id = CASE type"
                " WHEN 'single' THEN %s END WHERE type IN ('single', 'new-batch')",
                (other,),
            )
            ids = dict(conn.execute("SELECT type, id FROM jobs").fetchall())
        command.downgrade(migrate.alembic_config(settings), previous)
        with psycopg.connect(settings.database_url) as conn:
            kept = dict(conn.execute("SELECT type, published_message_id FROM jobs").fetchall())
        assert kept == {"old-batch": None, "single": other, "new-batch": ids["new-batch"]}
        assert _accepted_details(settings) == {
            "old-batch": ({"batch": True}, None),
            "single": (None, None),
            "new-batch": ({"run_at": "2026-12-07T10:00:00+00:00", "batch": True}, None),
        }
        migrate.upgrade(settings)
        assert _schema_drift(settings) == []
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)


def test_a_rewrite_refuses_a_definition_changed_by_hand(service_urls: ServiceUrls) -> None:
    """rewrite_function replaces exactly the lines it expects, or refuses: here the SQL
    enqueue no longer mints its message id (0046 made it the job's), so a rewrite of that
    line finds it 0 times and changes nothing."""
    from jobcore.database.migration_steps import rewrite_function

    settings, name = _empty_database_settings(service_urls)
    minted = "v_message_id := gen_random_uuid();"
    block = rewrite_function(
        "test",
        "enqueue(text, jsonb, text, text, text, text, text, timestamptz, interval, integer,"
        " text, text)",
        minted,
        "v_message_id := NULL;",
        1,
        schema=settings.database_schema,
    )
    try:
        migrate.upgrade(settings)
        with (
            psycopg.connect(settings.database_url) as conn,
            pytest.raises(psycopg.errors.RaiseException, match="0 times, not 1"),
        ):
            conn.execute(block)
        assert _enqueue_says(settings, "v_message_id := v_id;") == 1
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)
