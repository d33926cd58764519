"""The API, a relay and a worker as separate OS processes, for the end-to-end tests.

Every process appends its spans to one JSON-lines file (``JOBCORE_TRACE_FILE``) under its
own ``OTEL_SERVICE_NAME``; :meth:`E2EStack.stop` sends SIGTERM, so each process flushes
its batch span processor at exit before the test reads the file.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.testing.processes import ROOT, jobcore_command, settings_env
from jobcore.usecases import keys as key_usecases

JOB_MODULES = "jobcore.examples.jobtypes,jobcore.examples.demo,jobcore.testing.jobtypes"
# A loaded 2-core machine takes seconds to import and start each process.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0
ROLES = ("api", "relay", "worker")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def until(
    check: Callable[[], Awaitable[bool]], *, timeout: float, what: str, interval: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)  # the poll interval, bounded by the deadline


@dataclass
class E2EStack:
    settings: Settings
    workdir: Path
    env: dict[str, str] = field(default_factory=dict)
    # Per role, on top of env: e.g. one role's broker URL through a proxy.
    role_env: dict[str, dict[str, str]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    api_key: str = ""

    @property
    def span_file(self) -> Path:
        return self.workdir / "spans.jsonl"

    def url(self, role: str) -> str:
        return f"http://127.0.0.1:{self.ports[role]}"

    def log_path(self, role: str) -> Path:
        return self.workdir / f"{role}.log"

    async def start(self) -> None:
        db = Database(self.settings, min_size=0, max_size=1, name="jobcore-e2e")
        await db.open(wait=True)
        try:
            self.api_key = (await key_usecases.create_key(db, "e2e", "e2e", actor="tests")).key
        finally:
            await db.close()
        self.ports = {role: free_port() for role in ROLES}
        common = {
            "JOBCORE_JOB_MODULES": JOB_MODULES,
            "JOBCORE_TRACE_FILE": str(self.span_file),
            "JOBCORE_RELAY_HEALTH_PORT": str(self.ports["relay"]),
            "JOBCORE_WORKER_HEALTH_PORT": str(self.ports["worker"]),
            "JOBCORE_RELAY_POLL_INTERVAL": "0.2",
            "JOBCORE_RETRY_BACKOFF_BASE": "0.2",
            "JOBCORE_RETRY_BACKOFF_CAP": "0.5",
            "JOBCORE_SHUTDOWN_GRACE": "3",
            **self.env,
        }
        args = {"api": ("api", "--port", str(self.ports["api"])), "relay": ("relay",)}
        for role in ROLES:
            env = settings_env(
                self.settings,
                **common,
                OTEL_SERVICE_NAME=f"jobcore-{role}-e2e",
                **self.role_env.get(role, {}),
            )
            log = open(self.log_path(role), "wb")  # noqa: SIM115 - the child keeps it
            self.processes[role] = subprocess.Popen(
                jobcore_command(*args.get(role, (role,))),
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()
        for role in ROLES:
            await until(
                lambda role=role: self._ready(role),  # type: ignore[misc]
                timeout=START_TIMEOUT,
                what=f"the {role} to be ready",
            )

    async def _ready(self, role: str) -> bool:
        proc = self.processes[role]
        if proc.poll() is not None:
            raise AssertionError(f"the {role} exited:\n{self.logs(role)[-3000:]}")
        try:
            async with httpx.AsyncClient(timeout=2) as client:
                return (await client.get(f"{self.url(role)}/readyz")).status_code == 200
        except httpx.HTTPError:
            return False

    def logs(self, role: str) -> str:
        path = self.log_path(role)
        return path.read_text(errors="replace") if path.exists() else ""

    async def stop(self) -> dict[str, int | None]:
        """SIGTERM everything (so spans are flushed at exit); SIGKILL what outlives it."""
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while time.monotonic() < deadline and any(
            p.poll() is None for p in self.processes.values()
        ):
            await asyncio.sleep(0.05)  # the poll interval, bounded by the deadline
        codes: dict[str, int | None] = {}
        for role, proc in self.processes.items():
            codes[role] = proc.poll()
            if codes[role] is None:
                proc.kill()
                proc.wait(timeout=10)
        return codes

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url("api"),
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=10,
        )

    async def wait_status(
        self, client: httpx.AsyncClient, job_id: str, status: str, timeout: float = 60.0
    ) -> dict[str, Any]:
        seen: dict[str, Any] = {}

        async def reached() -> bool:
            seen.update((await client.get(f"/jobs/{job_id}")).json())
            return seen.get("status") == status

        await until(reached, timeout=timeout, what=f"job {job_id} to be {status}")
        return seen

    async def scrape(self, role: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return samples(await self.metrics_text(role))

    async def metrics_text(self, role: str) -> str:
        """The role's /metrics as it is served."""
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(f"{self.url(role)}/metrics")
        response.raise_for_status()
        return response.text

    def spans(self) -> list[dict[str, Any]]:
        if not self.span_file.exists():
            return []
        return [orjson.loads(line) for line in self.span_file.read_bytes().splitlines() if line]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text as {(sample name, sorted labels): value}."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
