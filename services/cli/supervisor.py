"""Running the API, relays and workers as child processes with prefixed, coloured logs.

Used by `jobcore dev` and `jobcore demo`. Children get their own session, so Ctrl-C
reaches only the supervisor, which then stops them in order: SIGTERM, the grace period,
SIGKILL for any still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import TextIO

import orjson

COLOURS = ("\033[36m", "\033[35m", "\033[33m", "\033[32m", "\033[34m", "\033[31m")
RESET = "\033[0m"
_SKIP_FIELDS = {"ts", "level", "service", "logger", "msg"}


def readable(line: str) -> str:
    """A JSON log line as ``level message key=value ...``; other lines unchanged."""
    try:
        entry = orjson.loads(line)
    except orjson.JSONDecodeError:
        return line
    if not isinstance(entry, dict):
        return line
    extras = " ".join(f"{k}={v}" for k, v in entry.items() if k not in _SKIP_FIELDS)
    text = f"{str(entry.get('level', '')).upper():7} {entry.get('msg', '')}"
    return f"{text}  {extras}" if extras else text


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    process: asyncio.subprocess.Process | None = None


class Supervisor:
    def __init__(
        self,
        *,
        base_env: dict[str, str],
        grace: float,
        out: TextIO = sys.stdout,
        colour: bool | None = None,
    ) -> None:
        self.base_env = base_env
        self.grace = grace
        self.out = out
        self.colour = out.isatty() if colour is None else colour
        self.children: list[Child] = []
        self._pumps: list[asyncio.Task[None]] = []
        self.quiet = False

    def add(self, name: str, *args: str, **env: str) -> Child:
        child = Child(name, [sys.executable, "-m", "services", *args], env)
        self.children.append(child)
        return child

    def _prefix(self, index: int, name: str) -> str:
        width = max(len(c.name) for c in self.children)
        label = name.ljust(width)
        if self.colour:
            return f"{COLOURS[index % len(COLOURS)]}{label}{RESET} | "
        return f"{label} | "

    async def start(self) -> None:
        for index, child in enumerate(self.children):
            child.process = await asyncio.create_subprocess_exec(
                *child.argv,
                env={**self.base_env, **child.env},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
            self._pumps.append(asyncio.create_task(self._pump(index, child)))

    async def _pump(self, index: int, child: Child) -> None:
        assert child.process is not None
        assert child.process.stdout is not None
        prefix = self._prefix(index, child.name)
        while raw := await child.process.stdout.readline():
            if not self.quiet:
                line = readable(raw.decode(errors="replace").rstrip("\n"))
                self.out.write(f"{prefix}{line}\n")
                self.out.flush()

    async def wait_any(self) -> Child:
        """Until one child exits; return it."""
        waits = {asyncio.create_task(c.process.wait()): c for c in self.children if c.process}
        done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        return waits[next(iter(done))]

    async def stop(self) -> dict[str, int | None]:
        """SIGTERM every child, wait the grace period, SIGKILL the rest; return exit codes."""
        alive = [c for c in self.children if c.process and c.process.returncode is None]
        for child in alive:
            assert child.process is not None
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(signal.SIGTERM)
        waits = [c.process.wait() for c in alive if c.process]
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), self.grace + 2)
        for child in alive:
            assert child.process is not None
            if child.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.process.pid, signal.SIGKILL)
                await child.process.wait()
        for pump in self._pumps:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(pump, 2)
        return {c.name: c.process.returncode if c.process else None for c in self.children}
