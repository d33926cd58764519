"""A TCP proxy on 127.0.0.1 that can be told to cut its connections.

``jobcore demo`` puts it between the relay/worker and RabbitMQ to show enqueue keeps
answering 202 while the broker is unreachable; the fault tests use the ``blackhole``
mode to cut connections *silently* (no FIN, no RST: bytes just stop), which only
heartbeats and timeouts can detect.

:meth:`TcpProxy.cut_after_commit` is a one-shot for PostgreSQL connections: the next
statement (whose request carries given bytes) reaches the server and runs to its end —
in autocommit, commits — but its answer is swallowed and the connection closed. The client
sees a broken connection and cannot tell whether the statement took effect: the case a
retry must recognise (docs/operations.md, "Statements whose commit is unknown").
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging

log = logging.getLogger(__name__)

# PostgreSQL's ReadyForQuery message: the server finished the request (and, outside a
# transaction block, committed it) and waits for the next one.
READY_FOR_QUERY = ord("Z")


class Mode(enum.Enum):
    FORWARD = "forward"
    # Close every connection and refuse new ones (like a broker that went away).
    REFUSE = "refuse"
    # Keep connections open but forward nothing (like a cable pulled mid-flight).
    BLACKHOLE = "blackhole"


class _ReplyCut:
    """An armed one-shot cut: which request it waits for, and the future it completes."""

    def __init__(self, match: bytes, done: asyncio.Future[None]) -> None:
        self.match = match
        self.done = done
        self.answer = b""  # the server's bytes swallowed so far, up to a whole message

    def ready_for_query(self, data: bytes) -> bool:
        """Whether the server's answer (fed in pieces) has reached its ReadyForQuery.

        The answer is read as backend messages (a type byte, then a length that counts
        itself) from its first byte: the request went out on an idle connection, whose
        previous answer the client had read whole."""
        self.answer += data
        while len(self.answer) >= 5:
            length = int.from_bytes(self.answer[1:5], "big")
            if len(self.answer) < 1 + length:
                return False
            if self.answer[0] == READY_FOR_QUERY:
                return True
            self.answer = self.answer[1 + length :]
        return False


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, *, listen_port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.listen_port = listen_port
        self.mode = Mode.FORWARD
        self._server: asyncio.Server | None = None
        self._stopped = False
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        # An armed cut_after_commit, until a request takes it; then the connection's.
        self._armed: _ReplyCut | None = None
        self._cutting: dict[asyncio.StreamWriter, _ReplyCut] = {}
        self.cuts = 0

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

    def cut_after_commit(self, match: bytes = b"") -> asyncio.Future[None]:
        """Arm a one-shot for PostgreSQL connections: the next request sent through the
        proxy that contains ``match`` (any request when empty) is forwarded, the server's
        whole answer to it, up to its ReadyForQuery, is swallowed, and then the connection
        is closed on both sides. The future completes when the cut is done; cancelling it
        disarms the cut. A new arming replaces one not yet taken."""
        if self._armed is not None and not self._armed.done.done():
            self._armed.done.cancel()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._armed = _ReplyCut(match, done)
        return done

    def _take_armed(self, data: bytes) -> _ReplyCut | None:
        armed = self._armed
        if armed is None or armed.done.done() or armed.match not in data:
            return None
        self._armed = None
        return armed

    def _refusing(self) -> bool:
        return self.mode is Mode.REFUSE

    def _cut(self, pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter], cut: _ReplyCut) -> None:
        for writer in pair:
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._pairs.discard(pair)
        self._cutting.pop(pair[0], None)
        self.cuts += 1
        log.info("proxy to %s:%s cut a connection after its statement's answer", *self.target)
        if not cut.done.done():
            cut.done.set_result(None)

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
            task = asyncio.create_task(self._pipe(src, dst, pair, to_server=dst is up_writer))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
        *,
        to_server: bool,
    ) -> None:
        client = pair[0]
        try:
            while data := await src.read(65536):
                if self.mode is Mode.BLACKHOLE:
                    continue  # swallow: the peer never hears back, and never hears a close
                if to_server:
                    # Marked before the request goes out: its answer cannot come sooner.
                    armed = self._take_armed(data)
                    if armed is not None:
                        self._cutting[client] = armed
                elif (cut := self._cutting.get(client)) is not None:
                    if cut.ready_for_query(data):
                        self._cut(pair, cut)
                        return
                    continue  # the answer is swallowed: the client never hears it
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            cut = self._cutting.pop(client, None) if not to_server else None
            if cut is not None and not cut.done.done():
                # The connection ended before the answer did: nothing was cut after a
                # commit, so the next request takes the cut instead.
                self._armed = self._armed or cut
            if self.mode is not Mode.BLACKHOLE:
                for writer in pair:
                    with contextlib.suppress(Exception):
                        writer.close()
                self._pairs.discard(pair)
