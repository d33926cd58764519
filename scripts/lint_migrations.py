"""`make lint`: every migration is safe to run under traffic.

Writes each revision's offline SQL (`alembic upgrade <previous>:<revision> --sql`) to
var/squawk/<revision>.sql and runs squawk over them with .squawk.toml, which says which
rules are off and which already released revisions are not linted. Iterates over whatever
revisions the migrations directory holds, so a new migration is linted with no change here.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from jobcore.migrate import migrations_dir

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "var" / "squawk"
# Offline mode renders SQL for this dialect and never connects.
OFFLINE_URL = "postgresql+psycopg://lint@127.0.0.1/lint"


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
        path.write_text(buffer.getvalue())
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--migrations", type=Path, default=migrations_dir())
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    paths = write_offline_sql(args.migrations, out)
    config = ROOT / ".squawk.toml"
    excluded = set(tomllib.loads(config.read_text()).get("excluded_paths", []))
    linted = [path.name for path in paths if path.name not in excluded]
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
