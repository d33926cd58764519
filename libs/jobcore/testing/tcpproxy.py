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
    # Keep connections open but forward nothing (like a cable pulled mid-flight). A
    # connection made meanwhile reaches no server. When the cut ends, a connection one side
    # of which closed during it is closed on the other side too: across a healed network
    # the peer's next keepalive probe or write meets a reset.
    BLACKHOLE = "blackhole"


class _Armed:
    """An armed one-shot cut: which request's answer it waits for, the proxy's mode after
    it, and its future."""

    def __init__(
        self, match: bytes, transaction_end: bool, then: Mode, done: asyncio.Future[None]
    ) -> None:
        self.match = match
        self.transaction_end = transaction_end
        self.then = then
        self.done = done


class _Answer:
    """A request's answer, held back (read as backend messages: a type byte, then a length
    that counts itself) until its ReadyForQuery says how the request left the connection.

    Reading starts at the answer's first byte: the request went out on a connection whose
    previous answer the client had read whole."""

    def __init__(self, armed: _Armed, *, doomed: bool) -> None:
        self.armed = armed
        self.doomed = doomed  # cut whatever it says (the request matched)
        self.held = bytearray()
        self._at = 0
        self.status: int | None = None  # ReadyForQuery's: I (idle), T (in a block), E

    def complete(self, data: bytes) -> bool:
        self.held += data
        while self.status is None and len(self.held) - self._at >= 5:
            end = self._at + 1 + int.from_bytes(self.held[self._at + 1 : self._at + 5], "big")
            if len(self.held) < end:
                break
            if self.held[self._at] == READY_FOR_QUERY:
                self.status = self.held[end - 1]
            self._at = end
        return self.status is not None


class _Watch:
    """A connection watched while a cut is armed."""

    def __init__(self) -> None:
        self.answer: _Answer | None = None
        # The transaction status its last answer left (None: not seen since armed).
        self.status: int | None = None


IN_BLOCK = ord("T")
IDLE = ord("I")


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, *, listen_port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.listen_port = listen_port
        self.mode = Mode.FORWARD
        self._server: asyncio.Server | None = None
        self._stopped = False
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        # During a blackhole: pairs one side of which closed, and connections accepted
        # without a server behind them (both closed when it ends).
        self._closed_in_cut: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._unconnected: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        # An armed cut_after_commit (until it is done), and the connections it watches.
        self._armed: _Armed | None = None
        self._watches: dict[asyncio.StreamWriter, _Watch] = {}
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
        leaving_cut = self.mode is Mode.BLACKHOLE and mode is not Mode.BLACKHOLE
        self.mode = mode
        if leaving_cut:
            self._end_cut()
        if mode is Mode.REFUSE:
            self._close_all()

    def _end_cut(self) -> None:
        for pair in self._closed_in_cut:
            for writer in pair:
                with contextlib.suppress(Exception):
                    writer.transport.abort()
            self._pairs.discard(pair)
        self._closed_in_cut.clear()
        for writer in self._unconnected:
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._unconnected.clear()

    def cut_after_commit(
        self, match: bytes = b"", *, transaction_end: bool = False, then: Mode = Mode.FORWARD
    ) -> asyncio.Future[None]:
        """Arm a one-shot for PostgreSQL connections: a request is forwarded and runs to
        its end on the server, its whole answer (up to its ReadyForQuery) is swallowed,
        and the connection is closed on both sides. Which request: the next one that
        contains ``match`` (any when empty), or with ``transaction_end`` the next one that
        ends a transaction block (a COMMIT: its connection's previous answer said "in a
        block", its own says "idle"). ``then``: the mode the proxy is in from the cut on,
        set in the same step (a client cannot reconnect in between). The future completes
        when the cut is done; cancelling it disarms the cut. A new arming replaces one not
        yet done."""
        if self._armed is not None and not self._armed.done.done():
            self._armed.done.cancel()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._armed = _Armed(match, transaction_end, then, done)
        self._watches.clear()
        return done

    def _request(self, client: asyncio.StreamWriter, data: bytes) -> None:
        """A request goes out on ``client``'s connection: hold its answer back if the armed
        cut may take it. Called before it is forwarded: its answer cannot come sooner."""
        armed = self._armed
        if armed is None or armed.done.done():
            self._watches.clear()
            return
        if not data or data[0] == 0:
            return  # an untyped start-up packet (SSLRequest's answer is one bare byte)
        watch = self._watches.setdefault(client, _Watch())
        if watch.answer is not None:
            return  # more of a pipelined request: its answer is already held back whole
        if armed.transaction_end:
            watch.answer = _Answer(armed, doomed=False)
        elif armed.match in data and not any(
            w.answer is not None and w.answer.doomed for w in self._watches.values()
        ):
            watch.answer = _Answer(armed, doomed=True)

    def _answered(
        self, pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter], data: bytes
    ) -> bytes | None:
        """The server's bytes to pass on to the client (None: hold them, or the connection
        was cut)."""
        watch = self._watches.get(pair[0])
        if watch is None or watch.answer is None:
            return data
        answer = watch.answer
        if not answer.complete(data):
            return None
        watch.answer = None
        before, watch.status = watch.status, answer.status
        ends_block = before == IN_BLOCK and answer.status == IDLE
        if not answer.armed.done.done() and (answer.doomed or ends_block):
            self._cut(pair, answer.armed)
            return None
        return bytes(answer.held)

    def _refusing(self) -> bool:
        return self.mode is Mode.REFUSE

    def _cut(self, pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter], armed: _Armed) -> None:
        for writer in pair:
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._pairs.discard(pair)
        self._watches.pop(pair[0], None)
        self.cuts += 1
        log.info("proxy to %s:%s cut a connection after its statement's answer", *self.target)
        self.set_mode(armed.then)
        armed.done.set_result(None)

    def _close_all(self) -> None:
        for client, upstream in list(self._pairs):
            for writer in (client, upstream):
                with contextlib.suppress(Exception):
                    writer.transport.abort()
        self._pairs.clear()
        self._closed_in_cut.clear()
        for writer in self._unconnected:
            with contextlib.suppress(Exception):
                writer.transport.abort()
        self._unconnected.clear()

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
        if self.mode is Mode.BLACKHOLE:
            # A connection attempt across a cut network never reaches the server (which
            # would otherwise hold a backend for it). Its bytes go nowhere.
            self._unconnected.add(writer)
            try:
                while await reader.read(65536):
                    pass
            except OSError:
                pass
            finally:
                self._unconnected.discard(writer)
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
                    self._request(client, data)
                else:
                    passed = self._answered(pair, data)
                    if passed is None:
                        continue  # held back, or swallowed by a cut
                    data = passed
                dst.write(data)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if not to_server:
                self._watches.pop(client, None)
            if self.mode is Mode.BLACKHOLE:
                if pair in self._pairs:
                    self._closed_in_cut.add(pair)
            else:
                for writer in pair:
                    with contextlib.suppress(Exception):
                        writer.close()
                self._pairs.discard(pair)
