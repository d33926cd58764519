"""An installation of the previous release (everything in ``public``) moved into jobcore's
schema by `jobcore migrate` (revision 0030), with views left in ``public`` under the old
names for the previous release's processes, which name the tables unqualified.

The rolling upgrade (tests/e2e/test_rolling_upgrade.py) runs the previous release's own
processes through the views; here each kind of statement they send is tried through them
directly, and the move's other duties: privileges, the SQL enqueue's old name, the version
marker on the view of Alembic's table.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobcore.database import migrate, schema_version
from jobcore.database.release_history import previous_release
from jobcore.kernel.settings import Settings
from tests.support import databases
from tests.support import previous_release as previous_build
from tests.support.services import ServiceUrls

# A connection as the previous release's processes make them: no search_path of jobcore's.
OLD_OPTIONS = "-c search_path=public"
KINDS = """
SELECT n.nspname AS schema, c.relname AS name, c.relkind::text AS kind FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = ANY(%s) AND n.nspname IN ('public', 'jobcore') ORDER BY 1, 2
"""


@pytest.fixture
def moved(service_urls: ServiceUrls, tmp_path: Path) -> Iterator[tuple[Settings, str]]:
    """A database the previous release migrated, with a role granted some of it; then
    migrated by this code. The settings and the role."""
    release = previous_release(schema_version.own_version())
    assert release is not None
    old_bin = previous_build.venv(release)
    name = databases.create_database(service_urls.pg_admin_url, template=None)
    settings = Settings(database_url=databases.with_database(service_urls.pg_admin_url, name))
    role = f"jobcore_old_{name[-8:]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBCORE_")}
    env["JOBCORE_DATABASE_URL"] = settings.database_url
    try:
        old = subprocess.run(
            [str(old_bin / "jobcore"), "migrate"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert old.returncode == 0, old.stderr
        with _old_connect(settings) as conn:
            assert conn.execute(KINDS, [["jobs"]]).fetchall() == [("public", "jobs", "r")]
            conn.execute(f"CREATE ROLE {role}")
            conn.execute(f"GRANT SELECT, INSERT, UPDATE ON jobs, outbox TO {role}")
        assert migrate.upgrade(settings) == (release.revision, migrate.head_revision())
        yield settings, role
    finally:
        databases.drop_database(service_urls.pg_admin_url, name)
        with psycopg.connect(service_urls.pg_admin_url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def _old_connect(settings: Settings) -> psycopg.Connection[Any]:
    return psycopg.connect(settings.database_url, autocommit=True, options=OLD_OPTIONS)


def test_tables_move_and_views_stay_under_the_old_names(moved: tuple[Settings, str]) -> None:
    settings, _ = moved
    with _old_connect(settings) as conn:
        tables = ["jobs", "outbox", "inbox", "alembic_version", "tenant_usage_deltas"]
        found = conn.execute(KINDS, [tables]).fetchall()
        assert {(s, n) for s, n, k in found if k == "r"} == {("jobcore", t) for t in tables}
        assert {(s, n) for s, n, k in found if k == "v"} == {("public", t) for t in tables}
        # Indexes, sequences and triggers went with their tables; nothing of jobcore's
        # but the views (and the SQL enqueue's old name) is left in public.
        [(left,)] = conn.execute(
            "SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace "
            "AND relkind <> 'v'"
        ).fetchall()
        assert left == 0
        functions = conn.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace"
        ).fetchall()
        assert functions == [("jobcore_enqueue",)]


def test_the_previous_releases_statements_work_through_the_views(
    moved: tuple[Settings, str],
) -> None:
    settings, _ = moved
    job = uuid.uuid4()
    with _old_connect(settings) as conn, conn.transaction():
        # INSERT ... RETURNING, the base table's defaults and triggers (the usage deltas).
        [(status,)] = conn.execute(
            "INSERT INTO jobs (id, tenant, type, queue) VALUES (%s, 't', 'echo', 'q') "
            "RETURNING status",
            [job],
        ).fetchall()
        assert status == "pending"
        [(message_id,)] = conn.execute(
            "INSERT INTO outbox (message_id, exchange, routing_key, message_type, body, job_id)"
            " VALUES (gen_random_uuid(), 'x', 'q', 'echo', '\\x00', %s) RETURNING id",
            [job],
        ).fetchall()
        # INSERT ... ON CONFLICT, both forms, through a view.
        inbox = "INSERT INTO inbox (consumer, message_id) VALUES ('c', %s) ON CONFLICT DO NOTHING"
        assert conn.execute(inbox, [job]).rowcount == 1
        assert conn.execute(inbox, [job]).rowcount == 0
        upsert = (
            "INSERT INTO maintenance_leases (name, owner, token, expires_at) "
            "VALUES ('reaper', 'old', gen_random_uuid(), now() + interval '1 minute') "
            "ON CONFLICT (name) DO UPDATE SET owner = excluded.owner RETURNING owner"
        )
        assert conn.execute(upsert).fetchall() == [("old",)]
        assert conn.execute(upsert).fetchall() == [("old",)]
        # A claim: FOR UPDATE SKIP LOCKED, then an UPDATE ... RETURNING.
        claimed = conn.execute(
            "SELECT id FROM outbox WHERE available_at <= now() ORDER BY id "
            "FOR UPDATE SKIP LOCKED LIMIT 10"
        ).fetchall()
        assert claimed == [(message_id,)]
        with _old_connect(settings) as other:
            skipped = other.execute(
                "SELECT id FROM outbox FOR UPDATE SKIP LOCKED LIMIT 10"
            ).fetchall()
            assert skipped == []
        updated = conn.execute(
            "UPDATE jobs SET status = 'running', attempts = attempts + 1 WHERE id = %s "
            "RETURNING attempts",
            [job],
        ).fetchall()
        assert updated == [(1,)]
        assert conn.execute("DELETE FROM outbox WHERE id = %s", [message_id]).rowcount == 1
        [(deltas,)] = conn.execute("SELECT count(*) FROM jobcore.tenant_usage_deltas").fetchall()
        assert deltas >= 1
        conn.execute("LOCK TABLE jobs IN ROW EXCLUSIVE MODE")
        # The previous release's pruner deletes inbox and audit log rows by ctid.
        for table, key in (("inbox", "received_at"), ("audit_log", "at")):
            if table == "audit_log":
                conn.execute(
                    "INSERT INTO audit_log (actor, action, target_type, target_id, outcome) "
                    "VALUES ('t', 'a', 'job', 'x', 'succeeded')"
                )
            deleted = conn.execute(
                f"DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {table} "
                f"WHERE {key} < now() + interval '1 minute' ORDER BY {key} LIMIT 10))"
            ).rowcount
            assert deleted == 1, table


def test_the_version_marker_is_read_where_the_previous_release_reads_it(
    moved: tuple[Settings, str],
) -> None:
    settings, _ = moved
    with _old_connect(settings) as conn:
        [(marker,)] = conn.execute(
            "SELECT obj_description(to_regclass('alembic_version'), 'pg_class')"
        ).fetchall()
        [(revision,)] = conn.execute("SELECT version_num FROM alembic_version").fetchall()
    parsed = schema_version.Marker.parse(marker)
    assert parsed is not None
    assert parsed.revision == revision == migrate.head_revision()
    assert schema_version.read_schema(settings) == (revision, marker)


def test_privileges_follow_the_move(moved: tuple[Settings, str]) -> None:
    settings, role = moved
    with _old_connect(settings) as conn:
        for table in ("jobcore.jobs", "public.jobs", "jobcore.outbox", "public.outbox"):
            [(allowed,)] = conn.execute(
                "SELECT has_table_privilege(%s, %s, 'INSERT')", [role, table]
            ).fetchall()
            assert allowed, table
        [(usage,)] = conn.execute(
            "SELECT has_schema_privilege(%s, 'jobcore', 'USAGE')", [role]
        ).fetchall()
        assert usage
        with conn.transaction(force_rollback=True):
            conn.execute(f"SET LOCAL ROLE {role}")
            assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_the_sql_enqueue_keeps_its_old_name(moved: tuple[Settings, str]) -> None:
    """``public.jobcore_enqueue`` calls ``jobcore.enqueue``: the same refusal (no worker
    registered the type), reached by either name."""
    settings, _ = moved
    with _old_connect(settings) as conn:
        for call in ("jobcore_enqueue", "jobcore.enqueue"):
            with pytest.raises(psycopg.Error, match="echo"), conn.transaction():
                conn.execute(f"SELECT {call}('echo', '{{}}', tenant => 't')")
