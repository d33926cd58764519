"""A minimal keep-alive HTTP/1.1 load generator: cheaper per request than httpx, so the
load takes less of the cores the server shares with it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

HOST = "127.0.0.1"
S = TypeVar("S")


class Connection:
    """One keep-alive connection sending requests and reading whole answers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        return cls(*await asyncio.open_connection(HOST, port))

    def close(self) -> None:
        self.writer.close()

    async def send(self, request: bytes) -> tuple[int, bytes]:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        body = await self.reader.readexactly(length) if length else b""
        return status, body


def post(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {HOST}:{port}", f"Content-Length: {len(body)}"]
    lines += ["Content-Type: application/json"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def run_clients(
    clients: int,
    total: int,
    make_state: Callable[[], Awaitable[S]],
    one: Callable[[S], Awaitable[bool]],
    close: Callable[[S], None] = lambda state: None,
) -> tuple[list[float], float, int]:
    """``total`` calls of ``one`` spread over ``clients`` concurrent tasks, each with its own
    state (a connection, say): every call's latency, the wall time, the failed calls."""
    latencies: list[float] = []
    errors = 0

    async def client(count: int) -> None:
        nonlocal errors
        state = await make_state()
        try:
            for _ in range(count):
                t0 = time.perf_counter()
                ok = await one(state)
                latencies.append(time.perf_counter() - t0)
                errors += not ok
        finally:
            close(state)

    shares = [total // clients + (i < total % clients) for i in range(clients)]
    started = time.perf_counter()
    await asyncio.gather(*(client(n) for n in shares if n))
    return latencies, time.perf_counter() - started, errors


async def http_load(
    port: int, request: bytes, clients: int, total: int, expect: int = 202
) -> tuple[list[float], float, int]:
    """The same request ``total`` times over ``clients`` keep-alive connections."""

    async def one(conn: Connection) -> bool:
        status, _ = await conn.send(request)
        return status == expect

    return await run_clients(clients, total, lambda: Connection.open(port), one, Connection.close)
