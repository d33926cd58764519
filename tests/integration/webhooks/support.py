"""What the webhook tests share: a scripted HTTP receiver on 127.0.0.1, settings that make
retries take about a second, and the relay and worker as real processes."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.testing.processes import jobcore_process
from tests.integration.worker.support import WORKER_TEST_MODULES

HOOK_PATH = "/hooks/jobs"
# Retries after about 1 s, then 2 s: quick tests, and a gap the jitter cannot blur.
BACKOFF_BASE = 1.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def webhook_settings(settings: Settings, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "job_modules": WORKER_TEST_MODULES,
        "webhook_allowed_hosts": ("127.0.0.1",),
        "webhook_backoff_base": BACKOFF_BASE,
        "webhook_backoff_cap": 4.0,
        "webhook_max_attempts": 4,
        "worker_health_port": 0,
        "worker_reaper_interval": 0.2,
        "shutdown_grace": 2.0,
        **overrides,
    }
    return settings.model_copy(update=values)


def process_env(settings: Settings) -> dict[str, str]:
    """What a relay or worker process needs beyond ``settings_env``."""
    return {
        "JOBCORE_WEBHOOK_ALLOWED_HOSTS": ",".join(settings.webhook_allowed_hosts),
        "JOBCORE_WEBHOOK_BACKOFF_BASE": str(settings.webhook_backoff_base),
        "JOBCORE_WEBHOOK_BACKOFF_CAP": str(settings.webhook_backoff_cap),
        "JOBCORE_WEBHOOK_MAX_ATTEMPTS": str(settings.webhook_max_attempts),
        "JOBCORE_WORKER_HEALTH_PORT": "0",
        "JOBCORE_WORKER_REAPER_INTERVAL": str(settings.worker_reaper_interval),
        "JOBCORE_RELAY_HEALTH_PORT": "0",
        "JOBCORE_RELAY_POLL_INTERVAL": "0.2",
        "JOBCORE_RELAY_RECONNECT_BASE_DELAY": "0.05",
        "JOBCORE_RELAY_RECONNECT_MAX_DELAY": "0.5",
    }


@contextlib.contextmanager
def service_process(
    settings: Settings, role: str, log_dir: Path, name: str | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``jobcore relay`` or ``jobcore worker``, logging to ``log_dir/<name>.log``; killed
    on exit."""
    log_path = log_dir / f"{name or role}.log"
    with jobcore_process(settings, role, log_path=log_path, **process_env(settings)) as proc:
        yield proc


# --- the receiver ---------------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    at: float  # time.time()
    monotonic: float


@dataclass
class Answer:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    # Hold the request (send nothing) until this event is set.
    hold: asyncio.Event | None = None


_REASONS = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    500: "Internal Server Error",
}


class Receiver:
    """A tiny HTTP/1.1 server: records every request, answers from a script (then 200), or
    with the status ``judge`` gives each request when there is one."""

    def __init__(self, *answers: Answer, judge: Callable[[Received], int] | None = None) -> None:
        self.script = list(answers)
        self.judge = judge
        self.requests: list[Received] = []
        self.arrived = asyncio.Event()
        self.bytes_sent = 0
        self._server: asyncio.Server | None = None
        self._port: int | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._port is not None, "the receiver is not started"
        return self._port

    def url(self, path: str = HOOK_PATH) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self._port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for answer in self.script:
            if answer.hold is not None:
                answer.hold.set()
        for task in set(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            await self._one_request(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the sender went away (a killed worker)
        finally:
            self._handlers.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one_request(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.requests.append(Received(method, path, headers, body, time.time(), time.monotonic()))
        self.arrived.set()
        received = self.requests[-1]
        if self.judge is not None:
            answer = Answer(self.judge(received))
        elif len(self.requests) <= len(self.script):
            answer = self.script[len(self.requests) - 1]
        else:
            answer = Answer()
        if answer.hold is not None:
            await answer.hold.wait()
        reason = _REASONS.get(answer.status, "Status")
        extra = "".join(f"{k}: {v}\r\n" for k, v in answer.headers.items())
        writer.write(
            f"HTTP/1.1 {answer.status} {reason}\r\nContent-Length: {len(answer.body)}\r\n"
            f"Connection: close\r\n{extra}\r\n".encode()
        )
        # In pieces, so a client that stops reading leaves the rest unsent.
        for start in range(0, len(answer.body), 16 * 1024):
            writer.write(answer.body[start : start + 16 * 1024])
            await writer.drain()
            self.bytes_sent += min(16 * 1024, len(answer.body) - start)
        await writer.drain()


@contextlib.asynccontextmanager
async def receiving(
    *answers: Answer, judge: Callable[[Received], int] | None = None
) -> AsyncIterator[Receiver]:
    receiver = Receiver(*answers, judge=judge)
    await receiver.start()
    try:
        yield receiver
    finally:
        await receiver.close()


# --- reading the database ------------------------------------------------------------------


async def deliveries(db: Database, job_id: uuid.UUID | str) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT * FROM webhook_deliveries WHERE job_id = %s ORDER BY created_at",
            (uuid.UUID(str(job_id)),),
        )
        return [dict(r) for r in await cur.fetchall()]


async def webhook_outbox_rows(db: Database) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT * FROM outbox WHERE message_type = 'webhook'")
        return [dict(r) for r in await cur.fetchall()]


def delivery_in(db: Database, job_id: uuid.UUID | str, *statuses: str) -> Any:
    """A probe for ``eventually``: the job's one delivery once its status is one of these."""

    async def probe() -> dict[str, Any] | None:
        rows = await deliveries(db, job_id)
        return rows[0] if rows and rows[0]["status"] in statuses else None

    return probe
