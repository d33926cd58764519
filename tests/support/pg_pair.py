"""The PostgreSQL failover pair of ``scripts/pg_failover_pair.sh``: two scratch clusters of
this machine's PostgreSQL on 5441 and 5442, a primary and its synchronous streaming
replica, reached with one multi-host URL. The machine's own cluster (5432) is not involved.

:func:`ensure` creates the pair when it is missing (so ``make test`` works on a fresh
machine) and repairs it after a failover; :func:`locked` keeps two runs on this machine
(two checkouts, say) from failing it over under each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql

from jobcore.testing.scratch import migrations_fingerprint

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "pg_failover_pair.sh"
PORTS = {"jcfail_a": 5441, "jcfail_b": 5442}
HOSTS = ",".join(f"127.0.0.1:{port}" for port in PORTS.values())
# libpq tries the hosts in order and keeps the first that takes writes.
ADMIN_URL = f"postgresql://postgres@{HOSTS}/postgres?target_session_attrs=read-write"
LOCK_PATH = Path(tempfile.gettempdir()) / "jobcore-pg-failover-pair.lock"
# A cold start creates two clusters and a base backup: tens of seconds on a busy machine.
SCRIPT_TIMEOUT = 300.0


def run(*args: str, timeout: float = SCRIPT_TIMEOUT) -> str:
    """``pg_failover_pair.sh ARGS``; its output. A failure says what the script said."""
    try:
        result = subprocess.run(
            [str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{SCRIPT.name} {' '.join(args)}: no answer in {timeout:g} s") from exc
    if result.returncode != 0:
        said = (result.stderr.strip() or result.stdout.strip())[-2000:]
        raise RuntimeError(f"{SCRIPT.name} {' '.join(args)} failed: {said}")
    return result.stdout


def ensure() -> None:
    """Both clusters exist and run, one the primary, the other its synchronous replica."""
    run("create")


def status() -> dict[str, str]:
    """Each node's state: ``running primary``, ``running replica``, ``stopped``, ``missing``."""
    nodes = {}
    for line in run("status", timeout=60).splitlines():
        name, _port, state = line.split(" ", 2)
        nodes[name] = state
    return nodes


def primary() -> str:
    """The name of the node that is the primary now."""
    port = int(run("primary", timeout=60).strip())
    return next(name for name, p in PORTS.items() if p == port)


def other(name: str) -> str:
    return next(n for n in PORTS if n != name)


def url(database: str, port: int | None = None) -> str:
    """The pair's multi-host URL for ``database``, or one node's (``port``)."""
    if port is not None:
        return f"postgresql://postgres@127.0.0.1:{port}/{database}"
    return ADMIN_URL.replace("/postgres?", f"/{database}?", 1)


# The test's databases, and the templates it clones them from.
DATABASE_PREFIX = "jobcore_fo_"
TEMPLATE_PREFIX = "jobcore_tpl_"


def drop_leftovers() -> None:
    """Drop the databases a killed run left on the pair and the templates of older
    migrations: every base backup copies them all. Call it holding :func:`locked`."""
    keep = f"{TEMPLATE_PREFIX}{migrations_fingerprint()}"
    with psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        names = [
            str(name)
            for (name,) in conn.execute(
                "SELECT datname FROM pg_database WHERE (datname LIKE %s OR datname LIKE %s)"
                " AND datname <> %s",
                (f"{DATABASE_PREFIX}%", f"{TEMPLATE_PREFIX}%", keep),
            ).fetchall()
        ]
        for name in names:
            conn.execute(
                sql.SQL("ALTER DATABASE {} IS_TEMPLATE false").format(sql.Identifier(name))
            )
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@contextlib.contextmanager
def locked(timeout: float = 300.0) -> Iterator[None]:
    """Hold the pair alone: another run's failover test waits (up to ``timeout``)."""
    with open(LOCK_PATH, "a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"the PostgreSQL failover pair stayed busy for {timeout:g} s "
                        f"(another run holds {LOCK_PATH})"
                    ) from None
                time.sleep(0.5)  # the lock's poll interval, bounded by the deadline
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
