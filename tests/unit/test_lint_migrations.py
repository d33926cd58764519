"""`make lint`'s migration check (scripts/lint_migrations.py): squawk over each revision's
offline SQL, whatever revisions exist; a new migration that would block traffic fails it,
one written as docs/operations.md says passes, the released ones are not linted."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from alembic.config import Config
from alembic.script import ScriptDirectory

from jobcore.database.migrate import migrations_dir

ROOT = Path(__file__).resolve().parents[2]

UNSAFE = """
from alembic import op
import sqlalchemy as sa

revision = "9999"
down_revision = "{head}"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("region", sa.Text(), nullable=True))
    op.create_index("jobs_region_idx", "jobs", ["region"])
"""

SAFE = """
from alembic import op

from jobcore.database.migration_steps import create_indexes_concurrently

revision = "9999"
down_revision = "{head}"


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("ALTER TABLE jobs ADD COLUMN IF NOT EXISTS region text")
    create_indexes_concurrently({{"jobs_region_idx": "(region)"}}, table="jobs")
"""

# Concurrent builds, but each by itself: squawk passes them; the helper check does not.
UNHELPED = {
    "sql": """
from alembic import op

revision = "9999"
down_revision = "{head}"


def upgrade() -> None:
    \"\"\"Prose may say CREATE INDEX CONCURRENTLY.\"\"\"
    with op.get_context().autocommit_block():
        op.execute("SET lock_timeout = '5s'")
        op.execute("CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_region_idx ON jobs (region)")
""",
    "create_index": """
from alembic import op

revision = "9999"
down_revision = "{head}"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.execute("SET lock_timeout = '5s'")
        op.create_index(
            "jobs_region_idx", "jobs", ["region"],
            postgresql_concurrently=True, if_not_exists=True,
        )
""",
}


def _head() -> str:
    """The newest shipped revision: the test's migration goes after it, whatever exists."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    (head,) = ScriptDirectory.from_config(config).get_heads()
    return str(head)


def _shipped() -> int:
    return sum(1 for p in (migrations_dir() / "versions").glob("[0-9]*.py"))


def _lint(tmp_path: Path, migration: str) -> subprocess.CompletedProcess[str]:
    migrations = tmp_path / "migrations"
    shutil.copytree(migrations_dir(), migrations, ignore=shutil.ignore_patterns("__pycache__"))
    (migrations / "versions" / "9999_region.py").write_text(migration.format(head=_head()))
    return subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "lint_migrations.py"),
            "--migrations",
            str(migrations),
            "--out",
            str(tmp_path / "sql"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("migration", "flagged"),
    [(UNSAFE, True), (SAFE, False)],
    ids=["index-without-concurrently-or-lock-timeout", "expand-step-as-documented"],
)
def test_a_new_migration_is_linted(tmp_path: Path, migration: str, flagged: bool) -> None:
    result = _lint(tmp_path, migration)
    # Every revision's SQL is written, the new one included.
    assert (tmp_path / "sql" / "0001.sql").exists()
    assert "CREATE INDEX" in (tmp_path / "sql" / "9999.sql").read_text()
    if flagged:
        assert result.returncode != 0, result.stdout
        assert "require-concurrent-index-creation" in result.stdout
        assert "require-lock-timeout" in result.stdout
        assert "9999.sql" in result.stdout
        assert "0019.sql" not in result.stdout  # released: not linted
    else:
        assert result.returncode == 0, result.stdout + result.stderr
        assert "none flagged" in result.stdout
        assert f"of {_shipped() + 1} migrations linted" in result.stdout


@pytest.mark.parametrize("way", sorted(UNHELPED))
def test_a_concurrent_build_not_made_by_the_helper_is_refused(tmp_path: Path, way: str) -> None:
    result = _lint(tmp_path, UNHELPED[way])
    assert result.returncode == 1, result.stdout + result.stderr
    assert "9999_region.py:" in result.stdout
    assert "jobcore.database.migration_steps.create_indexes_concurrently" in result.stdout
    # Only the new migration: the shipped ones build through the helper.
    assert result.stdout.count(".py:") == 1, result.stdout


def test_every_shipped_concurrent_build_goes_through_the_helper() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import lint_migrations
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert lint_migrations.unhelped_concurrent_builds(migrations_dir() / "versions") == []


def _lint_module() -> ModuleType:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import lint_migrations
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return lint_migrations


DEFINER = """
CREATE OR REPLACE FUNCTION jobcore_f(a text, b text DEFAULT 'x') RETURNS text
LANGUAGE sql SECURITY DEFINER SET search_path = public, pg_temp
AS $fn$ SELECT a || b $fn$;
"""

# A function dropped, not created again: squawk's ban-drop-function still flags it.
DROPPED = """
from alembic import op

revision = "9999"
down_revision = "{head}"


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("DROP FUNCTION jobcore_canonical_json(jsonb)")
"""

# A SECURITY DEFINER function PUBLIC may execute: refused.
OPEN_DEFINER = (
    '''
from alembic import op

revision = "9999"
down_revision = "{head}"


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute("""'''
    + DEFINER.replace("{", "{{").replace("}", "}}")
    + '''""")
'''
)


def test_a_function_dropped_and_created_again_passes_squawk_and_only_that() -> None:
    lint = _lint_module()
    replaced = "DROP FUNCTION jobcore_f(text);\n" + DEFINER
    marked = lint.mark_replaced_drops(replaced)
    assert "-- squawk-ignore ban-drop-function\nDROP FUNCTION jobcore_f(text);" in marked
    dropped = "DROP FUNCTION jobcore_g(text);\n" + DEFINER
    assert lint.mark_replaced_drops(dropped) == dropped


def test_a_security_definer_function_must_be_revoked_from_public() -> None:
    lint = _lint_module()
    assert lint.unrevoked_definers(DEFINER) == ["jobcore_f"]
    revoked = DEFINER + "REVOKE EXECUTE ON FUNCTION jobcore_f(text, text) FROM PUBLIC;\n"
    assert lint.unrevoked_definers(revoked) == []
    invoker = DEFINER.replace("SECURITY DEFINER", "")
    assert lint.unrevoked_definers(invoker) == []


def test_a_dropped_function_is_flagged(tmp_path: Path) -> None:
    result = _lint(tmp_path, DROPPED)
    assert result.returncode != 0, result.stdout
    assert "ban-drop-function" in result.stdout
    # Only the new revision: a shipped revision's drop of a function it creates again
    # (a change of signature) passes.
    assert set(re.findall(r"(\d+)\.sql:\d+", result.stdout)) == {"9999"}, result.stdout


def test_a_security_definer_function_open_to_public_is_refused(tmp_path: Path) -> None:
    result = _lint(tmp_path, OPEN_DEFINER)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "jobcore_f (9999.sql): SECURITY DEFINER, and PUBLIC may execute it" in result.stdout
