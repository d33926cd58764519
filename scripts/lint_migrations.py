"""`make lint`: every migration is safe to run under traffic.

Refuses a migration that builds an index CONCURRENTLY other than through
jobcore.database.migration_steps.create_indexes_concurrently, the one build that replaces an index
an interrupted build left INVALID (which ``IF NOT EXISTS`` would keep). Then writes each
revision's offline SQL (`alembic upgrade <previous>:<revision> --sql`) to
var/squawk/<revision>.sql and runs squawk over them with .squawk.toml, which says which
rules are off and which already released revisions are not linted. Iterates over whatever
revisions the migrations directory holds, so a new migration is linted with no change here.

Functions: a linted revision that creates a SECURITY DEFINER function must revoke EXECUTE
on it from PUBLIC, which a new function otherwise grants (a function created again after
a drop is a new function). A DROP FUNCTION is what squawk's ban-drop-function flags,
except where the same revision creates a function of the same name: a change of
signature, which CREATE OR REPLACE cannot make without leaving the old one beside it
(an overload every call naming neither makes ambiguous).
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from jobcore.database.migrate import migrations_dir

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "var" / "squawk"
# Offline mode renders SQL for this dialect and never connects.
OFFLINE_URL = "postgresql+psycopg://lint@127.0.0.1/lint"


# A concurrent build written out in a migration's SQL, not asked of the helper.
CONCURRENT_BUILD = re.compile(r"CREATE\s+(UNIQUE\s+)?INDEX\s+CONCURRENTLY", re.IGNORECASE)
HELPER = "jobcore.database.migration_steps.create_indexes_concurrently"

_NAME = r"(?:\w+\.)?(\w+)"
CREATE_FUNCTION = re.compile(
    rf"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+{_NAME}\s*\((.*?)\$(\w*)\$",
    re.IGNORECASE | re.DOTALL,
)
DROP_FUNCTION = re.compile(rf"^(DROP\s+FUNCTION\s+(?:IF\s+EXISTS\s+)?{_NAME}\s*\()", re.I | re.M)
REVOKE_FROM_PUBLIC = re.compile(
    rf"REVOKE\s+(?:EXECUTE|ALL)\b[^;]*?\bON\s+FUNCTION\s+{_NAME}\s*\([^;]*\bFROM\s+PUBLIC\b",
    re.IGNORECASE,
)
# squawk reads the whole comment as rule names: the reason goes on a line of its own.
REPLACED_DROP = "-- The revision creates this function again.\n-- squawk-ignore ban-drop-function\n"


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the module's, classes' and functions' docstring nodes: prose may name
    the statement."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def unhelped_concurrent_builds(versions: Path) -> list[str]:
    """``file:line`` of each concurrent index build a migration makes by itself: a
    ``CREATE INDEX CONCURRENTLY`` in its SQL or ``postgresql_concurrently=`` on
    ``op.create_index``."""
    found = []
    for path in sorted(versions.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        prose = _docstrings(tree)
        for node in ast.walk(tree):
            written = (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in prose
                and CONCURRENT_BUILD.search(node.value) is not None
            )
            asked = isinstance(node, ast.keyword) and node.arg == "postgresql_concurrently"
            if written or asked:
                found.append(f"{path.name}:{getattr(node, 'lineno', 0)}")
    return found


def _created_functions(sql: str) -> dict[str, bool]:
    """The functions a revision's SQL creates, by name: whether SECURITY DEFINER (read in
    the header, between the name and the body's opening dollar quote)."""
    found: dict[str, bool] = {}
    for match in CREATE_FUNCTION.finditer(sql):
        definer = re.search(r"\bSECURITY\s+DEFINER\b", match.group(2), re.IGNORECASE)
        found[match.group(1).lower()] = found.get(match.group(1).lower(), False) or bool(definer)
    return found


def unrevoked_definers(sql: str) -> list[str]:
    """The SECURITY DEFINER functions the SQL creates without revoking EXECUTE on them
    from PUBLIC."""
    revoked = {match.group(1).lower() for match in REVOKE_FROM_PUBLIC.finditer(sql)}
    return sorted(
        name for name, definer in _created_functions(sql).items() if definer and name not in revoked
    )


def mark_replaced_drops(sql: str) -> str:
    """The SQL with each DROP FUNCTION of a function it creates again marked for squawk's
    ban-drop-function to pass; a drop of anything else stays flagged."""
    created = _created_functions(sql)

    def mark(match: re.Match[str]) -> str:
        return (
            REPLACED_DROP + match.group(1) if match.group(2).lower() in created else match.group(1)
        )

    return DROP_FUNCTION.sub(mark, sql)


def _config(migrations: Path, buffer: io.StringIO | None = None) -> Config:
    config = Config(output_buffer=buffer)
    config.set_main_option("script_location", str(migrations))
    config.attributes["sqlalchemy_url"] = OFFLINE_URL
    config.attributes["connect_args"] = {}
    return config


def write_offline_sql(migrations: Path, out: Path) -> list[Path]:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    script = ScriptDirectory.from_config(_config(migrations))
    paths = []
    for revision in reversed(list(script.walk_revisions())):  # oldest first
        previous = revision.down_revision
        if isinstance(previous, tuple | list):
            sys.exit(f"lint_migrations: {revision.revision} merges {previous}: chain it linearly")
        buffer = io.StringIO()
        target = revision.revision if previous is None else f"{previous}:{revision.revision}"
        command.upgrade(_config(migrations, buffer), target, sql=True)
        path = out / f"{revision.revision}.sql"
        path.write_text(mark_replaced_drops(buffer.getvalue()))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--migrations", type=Path, default=migrations_dir())
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    unhelped = unhelped_concurrent_builds(args.migrations / "versions")
    if unhelped:
        print(
            f"lint_migrations: {', '.join(unhelped)}: build indexes CONCURRENTLY with {HELPER}, "
            "which builds again an index an interrupted build left INVALID"
        )
        return 1
    paths = write_offline_sql(args.migrations, out)
    config = ROOT / ".squawk.toml"
    excluded = set(tomllib.loads(config.read_text()).get("excluded_paths", []))
    linted = [path.name for path in paths if path.name not in excluded]
    open_to_public = [
        f"{name} ({path.name})"
        for path in paths
        if path.name in linted
        for name in unrevoked_definers(path.read_text())
    ]
    if open_to_public:
        print(
            f"lint_migrations: {', '.join(open_to_public)}: SECURITY DEFINER, and PUBLIC may "
            "execute it: REVOKE EXECUTE ON FUNCTION ... FROM PUBLIC in the same revision"
        )
        return 1
    squawk = Path(sys.executable).with_name("squawk")
    if not squawk.exists():
        squawk = Path(shutil.which("squawk") or "squawk")
    # Relative names, from OUT, as .squawk.toml's excluded_paths are written. squawk given
    # only excluded files would fail ("failed to find files"): it checks none then.
    command = [str(squawk), "--config", str(config), *linted] if linted else [str(squawk), "-V"]
    result = subprocess.run(command, cwd=out, check=False, stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        print(result.stdout, end="")
        return result.returncode
    print(
        f"squawk: {len(linted)} of {len(paths)} migrations linted, none flagged; "
        f"{len(paths) - len(linted)} released before the lint (.squawk.toml); SQL in {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
