"""The paced scenario's load generator (services/bench/scenarios/paced.py): batches POSTed
open loop on the wall clock, as an independent harness for PostgreSQL-backed queues does.

Every :data:`TICK` the generator works out how many jobs the elapsed time has made due
since the step began (``int(rate × elapsed)`` minus those already offered: the credit
comes from the clock, never from the loop's iterations, so a late tick sends more, not
fewer) and sends them in batches of at most :data:`MAX_BATCH`, each its own request,
without waiting for earlier answers. Beyond :data:`MAX_IN_FLIGHT` requests unanswered a
due batch is counted as shed, not sent late. Each batch's clock reading just before its
request is what the systems' pickup latency is measured from.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from services.bench.http import Connection

TICK = 0.025
MAX_BATCH = 128
MAX_IN_FLIGHT = 64
HTTP_TIMEOUT = 30.0


@dataclass
class PaceCounts:
    """What the generator did over one step."""

    seconds: float = 0.0
    offered: int = 0
    accepted: int = 0
    shed: int = 0  # due while MAX_IN_FLIGHT requests were unanswered: never sent
    failed: int = 0  # answered other than 2xx, or the connection failed
    requests: int = 0
    ticks: int = 0
    late_ticks: int = 0  # ticks that woke more than one TICK after they were due


# Sends ``count`` jobs as one batch; ``enqueued`` is time.time() just before the request.
# Returns how many were accepted.
Send = Callable[[int, float], Awaitable[int]]


@dataclass
class Pacer:
    send: Send
    rate: float
    counts: PaceCounts = field(default_factory=PaceCounts)
    _in_flight: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(self, seconds: float) -> PaceCounts:
        """Offer ``rate`` jobs a second for ``seconds``; then wait for every answer."""
        counts = self.counts = PaceCounts()
        started = time.monotonic()
        # Bounded: one pass per tick, and the last one is past the step's end.
        for tick in range(1, math.ceil(seconds / TICK) + 2):
            now = time.monotonic()
            elapsed = min(seconds, now - started)
            due = int(self.rate * elapsed) - counts.offered
            counts.ticks += 1
            while due > 0:
                size = min(MAX_BATCH, due)
                due -= size
                counts.offered += size
                if self._in_flight >= MAX_IN_FLIGHT:
                    counts.shed += size
                    continue
                self._in_flight += 1
                task = asyncio.create_task(self._batch(size))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            if elapsed >= seconds:
                break
            wake = started + tick * TICK
            if (wait := wake - time.monotonic()) > 0:
                await asyncio.sleep(wait)  # the pacing tick, against the step's start
            elif -wait > TICK:
                counts.late_ticks += 1
        counts.seconds = time.monotonic() - started
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=HTTP_TIMEOUT + 5)
        return counts

    async def _batch(self, size: int) -> None:
        try:
            self.counts.requests += 1
            accepted = await self.send(size, time.time())
            self.counts.accepted += accepted
            self.counts.failed += size - accepted
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
            self.counts.failed += size
        finally:
            self._in_flight -= 1


class HttpPool:
    """Keep-alive connections to one server, opened as requests need them."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._idle: list[Connection] = []

    async def post(self, request: bytes) -> tuple[int, bytes]:
        # A kept-alive connection the server closed meanwhile (uvicorn closes one idle for
        # 5 s) fails before any answer: tried again once on a new one, as HTTP clients do.
        if self._idle:
            conn = self._idle.pop()
            try:
                return await self._exchange(conn, request)
            except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError):
                pass
        return await self._exchange(await Connection.open(self.port), request)

    async def _exchange(self, conn: Connection, request: bytes) -> tuple[int, bytes]:
        try:
            status, body = await asyncio.wait_for(conn.send(request), HTTP_TIMEOUT)
        except BaseException:
            conn.close()
            raise
        self._idle.append(conn)
        return status, body

    def close(self) -> None:
        for conn in self._idle:
            with contextlib.suppress(Exception):
                conn.close()
        self._idle.clear()
