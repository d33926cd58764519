"""The TCP proxy the demo and the fault tests use, against a local echo server."""

from __future__ import annotations

import asyncio

import pytest

from jobcore.testing import tcpproxy
from jobcore.testing.tcpproxy import Mode, TcpProxy
from jobcore.testing.waiting import eventually


async def _echo_server() -> asyncio.Server:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(echo, "127.0.0.1", 0)


async def test_forward_refuse_and_blackhole() -> None:
    server = await _echo_server()
    proxy = TcpProxy("127.0.0.1", server.sockets[0].getsockname()[1])
    await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.read(4), 2) == b"ping"

        proxy.set_mode(Mode.BLACKHOLE)
        writer.write(b"lost")
        # Silence, not a close: the read times out instead of returning b"".
        try:
            await asyncio.wait_for(reader.read(4), 0.3)
            raise AssertionError("blackholed data came back")
        except TimeoutError:
            pass

        proxy.set_mode(Mode.REFUSE)
        assert await asyncio.wait_for(reader.read(4), 2) == b""  # the open connection is cut
        r2, w2 = await asyncio.open_connection("127.0.0.1", proxy.port)
        assert await asyncio.wait_for(r2.read(4), 2) == b""  # new ones are refused
        w2.close()

        proxy.set_mode(Mode.FORWARD)
        r3, w3 = await asyncio.open_connection("127.0.0.1", proxy.port)
        w3.write(b"back")
        assert await asyncio.wait_for(r3.read(4), 2) == b"back"
        w3.close()
        writer.close()
    finally:
        await proxy.stop()
        server.close()
        await server.wait_closed()


async def test_a_connection_still_connecting_upstream_is_closed_by_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The upstream connect hangs until released: stop() comes while it is pending.
    connecting = asyncio.Event()
    release = asyncio.Event()
    real_open_connection = asyncio.open_connection

    async def slow_open_connection(*args: object, **kwargs: object) -> object:
        connecting.set()
        await release.wait()
        return await real_open_connection(*args, **kwargs)  # type: ignore[arg-type]

    server = await _echo_server()
    proxy = TcpProxy("127.0.0.1", server.sockets[0].getsockname()[1])
    await proxy.start()
    monkeypatch.setattr(tcpproxy.asyncio, "open_connection", slow_open_connection)
    try:
        reader, writer = await real_open_connection("127.0.0.1", proxy.port)
        await asyncio.wait_for(connecting.wait(), 2)
        await proxy.stop()
        # The client's connection is closed, not left to the garbage collector.
        assert await asyncio.wait_for(reader.read(4), 2) == b""
        assert not proxy._tasks
        writer.close()
    finally:
        release.set()
        await proxy.stop()
        server.close()
        await server.wait_closed()


async def test_a_blackhole_reaches_no_server_and_its_closes_arrive_when_it_ends() -> None:
    """A connection made during a cut never reaches the server, and one whose client closed
    during the cut is closed at the server when the cut ends: a PostgreSQL backend behind
    either would otherwise live (holding its locks) until the proxy stops."""
    accepted: list[asyncio.StreamReader] = []
    writers: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(reader)
        writers.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    proxy = TcpProxy("127.0.0.1", server.sockets[0].getsockname()[1])
    await proxy.start()
    try:
        _, before = await asyncio.open_connection("127.0.0.1", proxy.port)

        async def server_accepted() -> bool:
            return len(accepted) == 1

        await eventually(server_accepted, timeout=2, what="the server's accept")
        proxy.set_mode(Mode.BLACKHOLE)
        during_reader, during = await asyncio.open_connection("127.0.0.1", proxy.port)
        during.write(b"startup")
        before.close()  # the client gives up during the cut
        server_side = accepted[0]
        try:
            await asyncio.wait_for(server_side.read(1), 0.3)
            raise AssertionError("the server heard of the close during the cut")
        except TimeoutError:
            pass
        assert len(accepted) == 1  # the connection made during the cut reached no server

        proxy.set_mode(Mode.FORWARD)
        assert await asyncio.wait_for(server_side.read(1), 2) == b""  # closed now
        assert await asyncio.wait_for(during_reader.read(1), 2) == b""  # reset, not forwarded
        assert len(accepted) == 1
        during.close()
    finally:
        await proxy.stop()
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()
