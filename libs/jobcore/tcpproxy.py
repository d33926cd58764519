"""A TCP proxy on 127.0.0.1 that can be told to cut its connections.

``jobcore demo`` puts it between the relay/worker and RabbitMQ to show enqueue keeps
answering 202 while the broker is unreachable; the fault tests use the ``blackhole``
mode to cut connections *silently* (no FIN, no RST: bytes just stop), which only
heartbeats and timeouts can detect.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging

log = logging.getLogger(__name__)


class Mode(enum.Enum):
    FORWARD = "forward"
    # Close every connection and refuse new ones (like a broker that went away).
    REFUSE = "refuse"
    # Keep connections open but forward nothing (like a cable pulled mid-flight).
    BLACKHOLE = "blackhole"


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, *, listen_port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.listen_port = listen_port
        self.mode = Mode.FORWARD
        self._server: asyncio.Server | None = None
        self._stopped = False
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("proxy not started")
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._stopped = False
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.listen_port)

    async def stop(self) -> None:
        # First: a connection accepted meanwhile, still connecting upstream, closes itself.
        self._stopped = True
        if self._server is not None:
            self._server.close()
            self._close_all()
            await self._server.wait_closed()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def set_mode(self, mode: Mode) -> None:
        if mode is not self.mode:
            log.info("proxy to %s:%s now %s", *self.target, mode.value)
        self.mode = mode
        if mode is Mode.REFUSE:
            self._close_all()

    def _refusing(self) -> bool:
        return self.mode is Mode.REFUSE

    def _close_all(self) -> None:
        for client, upstream in list(self._pairs):
            for writer in (client, upstream):
                with contextlib.suppress(Exception):
                    writer.transport.abort()
        self._pairs.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Tracked like the pipes, so stop() cancels an accept still connecting upstream:
        # left to finish after the stop, its sockets were never closed.
        accepting = asyncio.current_task()
        if accepting is not None:
            self._tasks.add(accepting)
            accepting.add_done_callback(self._tasks.discard)
        if self.mode is Mode.REFUSE or self._stopped:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        except asyncio.CancelledError:
            writer.transport.abort()
            raise
        if self._refusing() or self._stopped:
            # Refused (or stopped) while this connection was being made upstream: closing
            # every pair could not see it, so it would have outlived the refusal.
            writer.transport.abort()
            up_writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst, pair))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        try:
            while data := await src.read(65536):
                if self.mode is Mode.BLACKHOLE:
                    continue  # swallow: the peer never hears back, and never hears a close
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if self.mode is not Mode.BLACKHOLE:
                for writer in pair:
                    with contextlib.suppress(Exception):
                        writer.close()
                self._pairs.discard(pair)
