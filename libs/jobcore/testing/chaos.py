"""Disrupting the shared services from tests, and always putting them back.

Tests that use these are marked ``serial``: `make test` runs them alone, after the
parallel phase, so no other test sees the outage. A process-wide file lock also keeps two
disruptions (two developers' runs on one machine) from overlapping.
"""

from __future__ import annotations

import contextlib
import fcntl
import socket
import subprocess
import time
from collections.abc import Iterator

LOCK_PATH = "/tmp/jobcore-tests-disruption.lock"


def _run(*args: str, timeout: float = 120) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=timeout)


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_for_port(port: int, *, up: bool, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while _port_open(port) is not up:
        if time.monotonic() > deadline:
            state = "open" if up else "closed"
            raise AssertionError(f"port {port} did not become {state} within {timeout}s")
        time.sleep(0.1)  # the poll interval, bounded by the deadline above


@contextlib.contextmanager
def disruption_lock() -> Iterator[None]:
    with open(LOCK_PATH, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def start_broker() -> None:
    """Start the RabbitMQ app (idempotent) and wait until it accepts connections."""
    _run("rabbitmqctl", "-q", "start_app")
    _run("rabbitmqctl", "-q", "await_startup")
    wait_for_port(5672, up=True)


@contextlib.contextmanager
def broker_stopped() -> Iterator[None]:
    """``rabbitmqctl stop_app`` for the body of the block; started again whatever happens."""
    with disruption_lock():
        try:
            _run("rabbitmqctl", "-q", "stop_app")
            wait_for_port(5672, up=False)
            yield
        finally:
            start_broker()


def pg_cluster() -> str:
    out = subprocess.run(["ls", "/etc/postgresql"], capture_output=True, text=True, check=True)
    return out.stdout.split()[0]


def start_postgres() -> None:
    with contextlib.suppress(subprocess.CalledProcessError):
        _run("pg_ctlcluster", "--skip-systemctl-redirect", pg_cluster(), "main", "start")
    wait_for_port(5432, up=True)


@contextlib.contextmanager
def postgres_stopped() -> Iterator[None]:
    """PostgreSQL stopped (fast mode) for the body of the block; started again whatever."""
    with disruption_lock():
        try:
            _run(
                "pg_ctlcluster",
                "--skip-systemctl-redirect",
                pg_cluster(),
                "main",
                "stop",
                "--",
                "-m",
                "fast",
            )
            wait_for_port(5432, up=False)
            yield
        finally:
            start_postgres()
