"""jobcore refuses a schema more than one release newer than itself, with one line and
exit 1 (jobcore.database.schema_version); one release newer runs; `jobcore migrate` records it."""

from __future__ import annotations

import subprocess

import psycopg
import pytest

from jobcore.database import schema_version
from jobcore.database.release_history import RELEASES
from jobcore.database.schema_version import Marker
from jobcore.kernel.settings import Settings
from jobcore.testing.processes import jobcore_command, settings_env

# Commands that use the database: the three services, the console and a one-shot command.
CHECKED = [
    ("api", "--port", "0"),
    ("relay",),
    ("worker",),
    ("ui", "--port", "0"),
    ("jobs", "list"),
    ("outbox", "status"),
]


def _stamp(settings: Settings, revision: str, marker: Marker | None) -> None:
    """The schema as a later release's `jobcore migrate` would leave it (its own revision,
    which this code does not ship, and its marker)."""
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute("UPDATE alembic_version SET version_num = %s", (revision,))
        comment = "" if marker is None else marker.comment().replace("'", "''")
        conn.execute(f"COMMENT ON TABLE alembic_version IS '{comment}'")


def _run(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobcore_command(*args),
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_migrate_records_the_schema_release_and_what_it_runs_with(settings: Settings) -> None:
    with psycopg.connect(settings.database_url) as conn:
        [(revision, comment)] = conn.execute(
            "SELECT version_num, obj_description('alembic_version'::regclass, 'pg_class') "
            "FROM alembic_version"
        ).fetchall()
    marker = Marker.parse(comment)
    assert marker is not None
    assert marker.revision == revision == schema_version.own_head()
    assert marker.release == schema_version.own_version()
    # This development version runs with the last release (v0.1.0: 0019).
    assert (marker.runs_with, marker.runs_with_release) == (
        RELEASES[-1].revision,
        RELEASES[-1].version,
    )


@pytest.mark.parametrize("command", CHECKED, ids=" ".join)
def test_a_schema_two_releases_newer_is_refused_in_one_line(
    settings: Settings, command: tuple[str, ...]
) -> None:
    # Release 9.0.0's schema runs with 8.0.0's code (revision 9000), which this code is not.
    _stamp(settings, "9999", Marker("9999", "9.0.0", "9000", "8.0.0"))
    result = _run(settings, *command)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("jobcore: the database schema is jobcore 9.0.0's")
    assert "more than one release older" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_newer_revision_without_a_release_record_is_refused(settings: Settings) -> None:
    _stamp(settings, "9999", None)
    result = _run(settings, "jobs", "list")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "at revision 9999" in result.stderr
    assert "records no release" in result.stderr


def test_a_schema_one_release_newer_runs(settings: Settings) -> None:
    # The next release's schema runs with this code's head: a rolling upgrade's old side.
    head = schema_version.own_head()
    _stamp(settings, "9999", Marker("9999", "9.0.0", head, schema_version.own_version()))
    result = _run(settings, "jobs", "list", "--json")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_migrate_leaves_a_schema_one_release_newer_alone(settings: Settings) -> None:
    # The old image's `jobcore migrate` (a rollback): nothing to do, not a traceback.
    head = schema_version.own_head()
    _stamp(settings, "9999", Marker("9999", "9.0.0", head, schema_version.own_version()))
    result = _run(settings, "migrate")
    assert result.returncode == 0, result.stderr
    assert "is at 9999 (jobcore 9.0.0), one release newer" in result.stdout
    assert "nothing to do" in result.stdout


def test_migrate_against_a_schema_two_releases_newer_fails_in_one_line(
    settings: Settings,
) -> None:
    _stamp(settings, "9999", Marker("9999", "9.0.0", "9000", "8.0.0"))
    result = _run(settings, "migrate")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "more than one release older" in result.stderr


def test_refusal_rules() -> None:
    known = frozenset({"0001", "0002"})
    args = {"known": known, "version": "1.0.0", "head": "0002"}
    assert schema_version.refusal(None, None, **args) is None
    assert schema_version.refusal("0001", None, **args) is None  # older: not this check's
    assert schema_version.refusal("0003", Marker("0003", "1.1.0", "0002", "1.0.0"), **args) is None
    assert schema_version.refusal("0004", Marker("0004", "1.2.0", "0003", "1.1.0"), **args)
    # A marker left by an earlier migrate does not describe the revision now there.
    assert schema_version.refusal("0004", Marker("0003", "1.1.0", "0002", "1.0.0"), **args)
