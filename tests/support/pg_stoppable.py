"""A PostgreSQL cluster of this machine's own PostgreSQL that a test may stop and start:
``jcstop`` on 127.0.0.1:5452, trust auth, never started at boot. The machine's own cluster
(5432) is never touched.

:func:`ensure` creates it when it is missing and starts it, :func:`stop` and
:func:`start` stop and start it; :func:`locked` keeps two runs on this machine from
stopping it under each other. Run as root (the cluster runs as the postgres user) or as
postgres, like scripts/pg_failover_pair.sh.
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

NAME = "jcstop"
PORT = 5452
ADMIN_URL = f"postgresql://postgres@127.0.0.1:{PORT}/postgres"
LOCK_PATH = Path(tempfile.gettempdir()) / "jobcore-pg-stoppable.lock"
# Creating a cluster runs initdb: seconds, more on a busy machine.
COMMAND_TIMEOUT = 120.0


def _version() -> str:
    versions = sorted(
        (p.name for p in Path("/usr/lib/postgresql").glob("*") if (p / "bin").is_dir()),
        key=float,
    )
    if not versions:
        raise RuntimeError("no PostgreSQL server under /usr/lib/postgresql (install postgresql)")
    return versions[-1]


def _run(*args: str) -> str:
    try:
        result = subprocess.run(
            list(args), capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{' '.join(args)}: no answer in {COMMAND_TIMEOUT:g} s") from exc
    if result.returncode != 0:
        said = (result.stderr.strip() or result.stdout.strip())[-2000:]
        raise RuntimeError(f"{' '.join(args)} failed: {said}")
    return result.stdout


def _ctl(action: str) -> None:
    _run("pg_ctlcluster", "--skip-systemctl-redirect", _version(), NAME, action)


def _running() -> bool:
    status = subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", _version(), NAME, "status"],
        capture_output=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
    )
    return status.returncode == 0


def url(database: str) -> str:
    return f"postgresql://postgres@127.0.0.1:{PORT}/{database}"


def ensure() -> None:
    """The cluster exists, runs and answers."""
    version = _version()
    if not Path(f"/etc/postgresql/{version}/{NAME}/postgresql.conf").is_file():
        _run(
            "pg_createcluster",
            version,
            NAME,
            "--port",
            str(PORT),
            "--start-conf",
            "manual",
            "--",
            "--auth=trust",
        )
        conf = Path(f"/etc/postgresql/{version}/{NAME}/conf.d/jobcore-test.conf")
        conf.write_text("listen_addresses = '127.0.0.1'\nshared_buffers = '32MB'\n")
    start()


def start() -> None:
    if not _running():
        _ctl("start")
    deadline = time.monotonic() + COMMAND_TIMEOUT
    while True:
        try:
            with psycopg.connect(ADMIN_URL, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)  # the poll interval, bounded by the deadline


def stop() -> None:
    if _running():
        _ctl("stop")


@contextlib.contextmanager
def locked(timeout: float = 300.0) -> Iterator[None]:
    """Hold the cluster alone: another run's test that stops it waits (up to ``timeout``)."""
    with open(LOCK_PATH, "a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"the stoppable PostgreSQL cluster stayed busy for {timeout:g} s "
                        f"(another run holds {LOCK_PATH})"
                    ) from None
                time.sleep(0.5)  # the lock's poll interval, bounded by the deadline
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
