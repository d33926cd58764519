"""The suite's PgBouncer in transaction mode (``scripts/pgbouncer.sh``), started on demand.

One instance on 127.0.0.1:6441 serves every test and every pytest-xdist worker: the script
does nothing when it already answers, and concurrent starts take turns on its lock. It
serves any database name, so a test's scratch database is reached through it by swapping
the port in the test's URL (:func:`through_pgbouncer`).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tests.support.scripts import start_with_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "pgbouncer.sh"
PORT = 6441
START_TIMEOUT = 60.0
PSQL = ("psql", "-X", "-A", "-F", "\t", "-P", "footer=off", "-h", "127.0.0.1", "-p", str(PORT))
PSQL += ("-U", "postgres", "-d", "pgbouncer")


def ensure_pgbouncer() -> None:
    """Start the suite's PgBouncer unless it runs; raise with its own words if it cannot."""
    start_with_script(SCRIPT, {"PGBOUNCER_PORT": str(PORT)}, timeout=START_TIMEOUT)


def through_pgbouncer(url: str) -> str:
    """The same database and user, reached through the suite's PgBouncer."""
    parts = urlsplit(url)
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit((parts.scheme, f"{user}127.0.0.1:{PORT}", parts.path, parts.query, ""))


def admin_console(command: str) -> list[dict[str, str]]:
    """Rows of one PgBouncer admin command (SHOW CLIENTS, SHOW POOLS, ...), by column name.

    Through psql: the admin console speaks only the simple query protocol."""
    result = subprocess.run(
        [*PSQL, "-c", command],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    lines = result.stdout.splitlines()
    if not lines:
        return []
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=False)) for line in lines[1:]]
