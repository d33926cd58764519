"""Confirmed, pipelined publishing over one broker connection whose state this module owns.

A batch is written to the socket in one go and its publisher confirms are awaited
together: one round trip per batch, not per message (`jobcore bench relay` measures the
gain against a publisher that awaits each confirm). The channel is opened with confirms
on and returns raising, so a ``mandatory`` message that no queue takes fails instead of
being confirmed silently.

Each message of a batch ends in exactly one of three states: confirmed (the broker has
it), failed (*this* message was not taken, for a :class:`Failure` that says whether it is
worth retrying), or unconfirmed (the connection broke or timed out first: nothing is
known, the message is not to blame, and the caller publishes it again later).

A message that can never be published is found before it is sent, so it fails alone:
sent, it would cost the whole batch its channel or connection, batch after batch. The
broker closes the connection on a frame over ``frame_max`` (501 FRAME_ERROR) and the
channel on a body over its ``max_message_size`` (406 PRECONDITION_FAILED); pamqp refuses
what AMQP cannot encode.

The batch goes out through aiormq's channel, one layer under aio-pika, in one socket
write (see ``_publish_batched``); where aiormq's internals are not the expected ones the
publisher falls back to aiormq's public per-message publish, with the same outcomes.

After a batch the broker nacked, the next one goes out on a new channel of the same
connection. RabbitMQ (3.10; fixed in 3.11.x and 3.12.x by rabbitmq-server#9221) gives each
channel, at its first publish to a quorum queue, a client that starts from the leader its
queue record names. If that leader was just killed and the record not yet updated, the
client asks the dead node for its version, gets ``nodedown``, nacks the message and stays
as it was: that channel's every publish to the queue is then nacked until the dead node
is back, while a new channel, started from the updated record, publishes normally.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import re
import struct
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.abc import ChannelFrame
from pamqp import encode as amqp_encode
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.frame import marshal as marshal_frame
from pamqp.header import ContentHeader

from jobcore.amqp.connection import BROKER_ERRORS, connect, connected_to, redact_all
from jobcore.amqp.topology import WEBHOOKS_QUEUE, DeclaredTopology, Topology
from jobcore.kernel.envelope import CONTENT_TYPE, ENVELOPE_VERSION
from jobcore.kernel.errors import BrokerUnavailable, ConfigurationError
from jobcore.kernel.retry import backoff_delay
from jobcore.kernel.settings import DEFAULT_MAX_MESSAGE_SIZE, Settings

log = logging.getLogger(__name__)

# What a broken connection or channel raises into a publish; anything else a publish
# raises is the message's own fault.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    *BROKER_ERRORS,
    aiormq.exceptions.ChannelInvalidStateError,
)
_CONNECT_ERRORS: tuple[type[BaseException], ...] = (BrokerUnavailable, *CONNECTION_ERRORS)
_CHANNEL_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, *CONNECTION_ERRORS)

PERSISTENT = 2
# Marshalled Basic.Publish frames are reused per (exchange, routing key); rows name a few.
MAX_CACHED_ROUTES = 1024
ENVELOPE_HEADER = "x-envelope-version"
# A frame's type, channel, size and end octets around its payload: a content header frame
# may be at most the negotiated frame_max long, these included.
FRAME_OVERHEAD = len(marshal_frame(ContentBody(b""), 0))
# The content header frame of a job message, written by hand (``_header_frame``) for the
# common shape: pamqp's generic marshalling of the properties and their headers table was
# the relay's largest cost per message after the confirms. The flags are content_type,
# headers, delivery_mode, message_id and type (AMQP 0-9-1, basic class properties).
_HEADER_FLAGS = struct.pack(">H", 0x8000 | 0x2000 | 0x1000 | 0x0080 | 0x0020)
_CONTENT_TYPE_FIELD = amqp_encode.short_string(CONTENT_TYPE)
_ENVELOPE_KEY = ENVELOPE_HEADER.encode()
_ENVELOPE_VALUE = amqp_encode.encode_table_value(ENVELOPE_VERSION)
_FRAME_START = struct.Struct(">BHI")
_HEADER_START = struct.Struct(">HHQ")
_LONG = struct.Struct(">I")
_FRAME_END = b"\xce"
# How RabbitMQ (3.8 to 3.13) closes a channel that published a body over its limit.
_MESSAGE_SIZE_REFUSED = re.compile(r"message size (\d+) is larger than configured max size (\d+)")


class Failure(enum.StrEnum):
    """Why one message was not published, which decides what becomes of its row."""

    # Transient: the broker's state is to blame, not the message (a queue or binding missing
    # during a deploy, an exchange not declared yet, a quorum queue without a leader). The
    # row is retried, with capped backoff, until the broker takes it.
    NACKED = "nacked"
    RETURNED = "returned"
    NO_EXCHANGE = "no_exchange"
    # Permanent: the message can never be published; its row is quarantined at once.
    # Not encodable as AMQP: headers that are not a table of AMQP values, a name (exchange,
    # routing key, type) over 255 bytes.
    MALFORMED = "malformed"
    # Properties over one frame (the broker's frame_max), or a body over its max_message_size.
    TOO_LARGE = "too_large"
    # Ambiguous: the client library refused this one message for a reason not classified
    # above (only aiormq's per-message path can raise one). Retried up to a limit.
    UNEXPECTED = "unexpected"

    def quarantines(self, attempts: int, max_attempts: int) -> bool:
        """Whether a row that has now failed ``attempts`` times, this way, is quarantined."""
        if self in _TRANSIENT:
            return False
        if self in _PERMANENT:
            return True
        return attempts >= max_attempts

    @property
    def is_missing_route(self) -> bool:
        """Declaring the topology may cure it (a queue, binding or exchange was deleted)."""
        return self in (Failure.RETURNED, Failure.NO_EXCHANGE)


_TRANSIENT = frozenset({Failure.NACKED, Failure.RETURNED, Failure.NO_EXCHANGE})
_PERMANENT = frozenset({Failure.MALFORMED, Failure.TOO_LARGE})


class _Unpublishable(Exception):
    """A message that can never be put on the wire as it is."""

    def __init__(self, failure: Failure, reason: str) -> None:
        super().__init__(reason)
        self.failure = failure


def refused_size_limit(error: BaseException) -> int | None:
    """The broker's max_message_size, when ``error`` is its refusal of a body over it."""
    if not isinstance(error, aiormq.exceptions.ChannelPreconditionFailed):
        return None
    match = _MESSAGE_SIZE_REFUSED.search(str(error))
    return int(match.group(2)) if match else None


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    exchange: str
    routing_key: str
    message_id: str
    message_type: str
    # W3C trace context (traceparent / tracestate) captured when the row was written.
    headers: Mapping[str, Any]
    body: bytes


@dataclass(slots=True)
class BatchResult:
    """Indexes into the published batch, by outcome."""

    confirmed: list[int] = field(default_factory=list)
    failed: list[tuple[int, Failure, str]] = field(default_factory=list)
    unconfirmed: list[int] = field(default_factory=list)
    # Set when the connection failed during the batch; the publisher is then disconnected.
    broker_error: str | None = None
    confirm_seconds: float = 0.0


def describe_topology(
    topology: Topology, queues: Iterable[str], *, at_most_once: Collection[str] = ()
) -> dict[str, Any]:
    """What `jobcore topology` prints; ``at_most_once``: queues that still dead-letter at
    most once (declared before at-least-once dead-lettering)."""

    def row(q: str) -> dict[str, Any]:
        name = topology.queue_name(q)
        strategy = "at-most-once" if name in at_most_once else "at-least-once"
        return {"queue": name, "routing_key": topology.routing_key(q), "dead_lettering": strategy}

    return {
        "exchange": topology.jobs_exchange,
        "queues": [row(q) for q in sorted(set(queues) | {WEBHOOKS_QUEUE})],
        "dead_letter_exchange": topology.dead_letter_exchange,
        "dead_letter_queue": topology.dead_letter_queue,
        "dead_letter_notes_queue": topology.dead_letter_notes_queue,
        "delivery_limit": topology.delivery_limit,
    }


async def _declare(
    connection: AbstractConnection, topology: Topology, queues: Collection[str]
) -> DeclaredTopology:
    # Its own channel: a failed declaration closes the channel it ran on.
    channel = await connection.channel(publisher_confirms=False)
    try:
        return await topology.declare_all(channel, queues)
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        raise ConfigurationError(
            f"the broker already has this topology with other arguments: {exc}"
        ) from exc
    finally:
        if not channel.is_closed:
            await channel.close()


async def declare_topology(
    settings: Settings, queues: Collection[str], *, connect_timeout: float = 5.0
) -> dict[str, Any]:
    """Declare the topology on demand (`jobcore topology`); return what was declared."""
    topology = Topology.from_settings(settings)
    connection = await connect(settings, timeout=connect_timeout)
    try:
        try:
            declared = await _declare(connection, topology, queues)
        except BROKER_ERRORS as exc:
            raise BrokerUnavailable(f"declaring the topology failed: {exc}") from exc
    finally:
        await connection.close()
    return describe_topology(topology, queues, at_most_once=declared.at_most_once)


class ConfirmedPublisher:
    """One connection and one confirming channel; reconnects on demand with backoff.

    State changes are logged once each: connected, lost (or unreachable), connected again.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        queues: Collection[str],
        publish_timeout: float = 10.0,
        connect_timeout: float = 5.0,
        reconnect_base: float = 0.2,
        reconnect_cap: float = 30.0,
        on_reconnect: Callable[[], None] | None = None,
        batched_writes: bool = True,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    ) -> None:
        self.settings = settings
        self.topology = Topology.from_settings(settings)
        self.queues = frozenset(queues)
        # The routes that declaring this topology creates: a return for one of them means a
        # queue or binding was deleted under us, and declaring again cures it.
        self._routes = frozenset(
            (self.topology.jobs_exchange, self.topology.routing_key(q))
            for q in self.queues | {WEBHOOKS_QUEUE}
        )
        # Bodies over this are never sent; lowered to the broker's own limit when it says so.
        self.max_message_size = max_message_size
        self.publish_timeout = publish_timeout
        self.connect_timeout = connect_timeout
        self.reconnect_base = reconnect_base
        self.reconnect_cap = reconnect_cap
        self._on_reconnect = on_reconnect
        self._want_batched_writes = batched_writes
        self._batched_writes = False
        self._method_frames: dict[tuple[str, str], bytes] = {}
        # Set whenever the connection is lost, so an idle caller can reconnect promptly.
        self.lost = asyncio.Event()
        self._connection: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._raw: aiormq.Channel | None = None
        # Exchanges known to exist on this connection. Publishing to a missing exchange
        # closes the channel (404) and with it every publish in flight, so an unknown
        # exchange is checked first, on a throwaway channel.
        self._exchanges: set[str] = set()
        self._ever_connected = False
        self._down_since: float | None = None
        self._down_reported = False
        # Failed connection attempts since the broker was last reachable (for /healthz).
        self.connect_failures = 0
        # Channels opened in place of one whose batch the broker nacked (see the module's
        # docstring), and batches nacked in a row (the first of a run is logged).
        self.channel_renewals = 0
        self._nacked_batches = 0
        # Batches in flight per channel (the relay's lanes share the publisher), and the
        # replaced channels that the last of their batches closes.
        self._in_flight: Counter[aiormq.Channel] = Counter()
        self._retiring: dict[aiormq.Channel, AbstractChannel] = {}

    @property
    def connected(self) -> bool:
        return self._raw is not None and not self._raw.is_closed

    @property
    def connection(self) -> AbstractConnection | None:
        """The broker connection while connected, for read-only side uses (queue depth
        on /metrics) on channels of their own."""
        return self._connection if self.connected else None

    async def connect(self) -> None:
        """Open the connection and channel and declare the topology (idempotent)."""
        if self.connected:
            return
        await self._discard_connection()
        connection = await connect(self.settings, timeout=self.connect_timeout)
        try:
            await _declare(connection, self.topology, self.queues)
            channel, raw = await self._open_channel(connection)
        except BaseException:
            with contextlib.suppress(Exception):
                await connection.close()
            raise
        connection.close_callbacks.add(self._on_close)
        self._connection = connection
        self._use_channel(channel, raw)
        self._exchanges = {"", self.topology.jobs_exchange}
        if self._want_batched_writes and not self._batched_writes:
            log.warning("aiormq internals differ; publishing one message at a time")
        self.lost.clear()
        if self._down_since is not None:
            log.info(
                "broker connected again",
                extra={
                    "down_seconds": round(time.monotonic() - self._down_since, 3),
                    "broker": connected_to(connection),
                },
            )
            if self._on_reconnect is not None:
                self._on_reconnect()
        elif not self._ever_connected:
            log.info("broker connected", extra={"broker": connected_to(connection)})
        self._ever_connected = True
        self._down_since = None
        self._down_reported = False
        self.connect_failures = 0

    @staticmethod
    async def _open_channel(
        connection: AbstractConnection,
    ) -> tuple[AbstractChannel, aiormq.Channel]:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        # aiormq's own channel: its publish can skip waiting for each socket write.
        return channel, cast(aiormq.Channel, await channel.get_underlay_channel())

    def _use_channel(self, channel: AbstractChannel, raw: aiormq.Channel) -> None:
        channel.close_callbacks.add(self._on_close)
        self._channel, self._raw = channel, raw
        self._method_frames.clear()  # they carry the channel number
        self._batched_writes = self._want_batched_writes and supports_batched_writes(raw)
        if self._batched_writes:
            settle_confirms_in_order(raw)

    async def _renew_channel(self, nacked: int) -> None:
        """Publish on a new channel of the same connection from now on, after a batch the
        broker nacked (see the module's docstring); the connection is dropped if it cannot
        open one."""
        connection, old, old_raw = self._connection, self._channel, self._raw
        if connection is None or old is None or old_raw is None:
            return
        self._nacked_batches += 1
        if self._nacked_batches == 1:
            log.warning(
                "the broker nacked messages; publishing on a new channel",
                extra={"messages": nacked, "broker": connected_to(connection)},
            )
        try:
            channel, raw = await asyncio.wait_for(
                self._open_channel(connection), timeout=self.publish_timeout
            )
        except _CHANNEL_ERRORS as exc:
            await self._disconnect(f"opening a channel failed: {type(exc).__name__}: {exc}")
            return
        # Replaced first: closing the old channel then runs a callback that ignores it.
        self._use_channel(channel, raw)
        self.channel_renewals += 1
        if self._in_flight[old_raw]:
            # Another lane's batch still waits for its confirms there: closing the channel
            # now would cost that batch its confirms and the connection.
            self._retiring[old_raw] = old
        else:
            await self._close_channel(old)

    async def _batch_done(self, raw: aiormq.Channel) -> None:
        """A batch on ``raw`` is settled; the last one on a replaced channel closes it."""
        self._in_flight[raw] -= 1
        if self._in_flight[raw] <= 0:
            del self._in_flight[raw]
            retired = self._retiring.pop(raw, None)
            if retired is not None:
                await self._close_channel(retired)

    async def _close_channel(self, channel: AbstractChannel) -> None:
        with contextlib.suppress(*_CHANNEL_ERRORS):
            await asyncio.wait_for(channel.close(), timeout=self.publish_timeout)

    async def ensure_connected(self, stopping: asyncio.Event) -> bool:
        """Connect, retrying with backoff; False if ``stopping`` was set first."""
        while not self.connected:
            if stopping.is_set():
                return False
            try:
                await self.connect()
            except _CONNECT_ERRORS as exc:
                self._mark_down(f"{type(exc).__name__}: {exc}")
                self.connect_failures += 1
                delay = backoff_delay(
                    self.connect_failures, base=self.reconnect_base, cap=self.reconnect_cap
                )
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stopping.wait(), timeout=delay)
        return True

    def _mark_down(self, reason: str) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
        if not self._down_reported:
            self._down_reported = True
            message = "broker connection lost" if self._ever_connected else "broker unreachable"
            log.warning(message, extra={"error": reason, "broker": redact_all(self.settings)})
        self.lost.set()

    def _on_close(self, sender: object, exc: BaseException | None = None) -> None:
        if sender is not self._connection and sender is not self._channel:
            return  # a callback of a connection we already replaced
        self._raw = None
        self._mark_down(f"{type(exc).__name__}: {exc}" if exc else "closed")

    async def _discard_connection(self) -> None:
        connection, self._connection = self._connection, None
        self._channel = self._raw = None
        self._retiring.clear()  # closed with their connection
        if connection is not None and not connection.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), timeout=self.connect_timeout)

    async def close(self) -> None:
        await self._discard_connection()

    async def _disconnect(self, reason: str) -> None:
        self._mark_down(reason)
        await self._discard_connection()

    async def disconnect(self, reason: str) -> None:
        """Drop a connection a side use found dead or silent; ``ensure_connected`` then
        connects again, as after a publish that failed."""
        await self._disconnect(reason)

    def declares_route(self, exchange: str, routing_key: str) -> bool:
        """Whether declaring this publisher's topology creates the route."""
        return (exchange, routing_key) in self._routes

    async def redeclare(self) -> None:
        """Declare the topology again on the open connection (idempotent), for a queue,
        binding or exchange deleted while connected. Raises ConfigurationError when the
        broker holds it with other arguments, BrokerUnavailable or a broker error else."""
        connection = self.connection
        if connection is None:
            raise BrokerUnavailable("not connected to the broker")
        await asyncio.wait_for(
            _declare(connection, self.topology, self.queues), timeout=self.publish_timeout
        )

    async def _missing_exchanges(self, names: set[str]) -> set[str]:
        unknown = names - self._exchanges
        missing: set[str] = set()
        if not unknown or self._connection is None:
            return missing
        for name in unknown:
            probe = await self._connection.channel(publisher_confirms=False)
            try:
                await probe.get_exchange(name, ensure=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                missing.add(name)
                continue
            finally:
                if not probe.is_closed:
                    await probe.close()
            self._exchanges.add(name)
        return missing

    async def publish_batch(self, messages: Sequence[OutgoingMessage]) -> BatchResult:
        """Publish every message, then wait (bounded) for all their confirms together."""
        result = BatchResult()
        raw = self._raw
        if raw is None or raw.is_closed:
            result.unconfirmed = list(range(len(messages)))
            result.broker_error = "not connected"
            return result
        # Encoded first: what can never be published fails alone, before anything is sent
        # or any exchange is probed under a name AMQP cannot carry.
        frames: dict[int, bytes] = {}
        for index, message in enumerate(messages):
            try:
                frames[index] = self._encode(message, raw)
            except _Unpublishable as exc:
                result.failed.append((index, exc.failure, str(exc)))
        try:
            missing = await self._missing_exchanges({messages[i].exchange for i in frames})
        except CONNECTION_ERRORS as exc:
            result.unconfirmed.extend(frames)
            result.broker_error = f"{type(exc).__name__}: {exc}"
            await self._disconnect(result.broker_error)
            return result
        sendable: list[int] = []
        for index in frames:
            exchange = messages[index].exchange
            if exchange in missing:
                reason = f"no exchange {exchange!r} on the broker"
                result.failed.append((index, Failure.NO_EXCHANGE, reason))
            else:
                sendable.append(index)

        started = time.monotonic()
        self._in_flight[raw] += 1
        try:
            if self._batched_writes:
                outcomes = await self._publish_batched(raw, messages, sendable, frames)
            else:
                outcomes = await self._publish_each(raw, messages, sendable)
        except CONNECTION_ERRORS as exc:
            result.unconfirmed.extend(sendable)
            result.broker_error = f"{type(exc).__name__}: {exc}"
            await self._disconnect(result.broker_error)
            return result
        finally:
            await self._batch_done(raw)
        result.confirm_seconds = time.monotonic() - started
        self._settle(outcomes, messages, result)
        if result.broker_error is not None:
            await self._disconnect(result.broker_error)
            return result
        nacked = sum(1 for _, failure, _ in result.failed if failure is Failure.NACKED)
        if nacked:
            await self._renew_channel(nacked)
        elif result.confirmed:
            self._nacked_batches = 0
        return result

    async def _publish_batched(
        self,
        raw: aiormq.Channel,
        messages: Sequence[OutgoingMessage],
        sendable: list[int],
        frames: Mapping[int, bytes],
    ) -> list[tuple[int, Outcome]]:
        """Write the whole batch with one socket write and wait for its confirms together.

        Each message is registered the way aiormq's own ``basic_publish`` registers one
        (delivery tag -> confirmation, message id -> delivery tag for returns), so aiormq's
        reader settles them; the confirmation objects count down to one future for the
        batch instead of being a future each. Per message this saves a task, a lock round,
        a socket write and a future with its callbacks: the relay's cost per message is
        little more than encoding it. A closed channel rejects aiormq's own futures, so
        one of those (``closed``) ends the wait when the channel goes.
        """
        encoded = [(index, messages[index].message_id, frames[index]) for index in sendable]
        if not encoded:
            return []
        batch = _BatchConfirms(len(encoded))
        async with raw.lock:
            closed = raw.create_future()
            first = raw.delivery_tag + 1
            for offset, (_, message_id, _) in enumerate(encoded):
                # aiormq's reader uses a confirmation only as far as _Confirmation goes.
                confirmation = cast("asyncio.Future[Any]", _Confirmation(batch, offset))
                raw.confirmations[first + offset] = confirmation
                raw.message_id_delivery_tag[message_id] = first + offset
            raw.delivery_tag += len(encoded)
            try:
                payload = b"".join(frames for _, _, frames in encoded)
                await raw.write_queue.put(ChannelFrame(payload=payload, should_close=False))
            except BaseException:
                # Not written: give the delivery tags back, as aiormq does for one publish.
                raw.delivery_tag = first - 1
                self._forget(raw, encoded, first)
                closed.cancel()
                raise
        try:
            await asyncio.wait(
                (batch.all_settled, closed),
                timeout=self.publish_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            self._forget(raw, encoded, first)
            batch.stop()
            gone = closed.exception() if closed.done() and not closed.cancelled() else None
            closed.cancel()
        no_answer: Outcome = gone if gone is not None else NO_CONFIRM
        return [
            (index, no_answer if outcome is NO_CONFIRM else outcome)
            for (index, _, _), outcome in zip(encoded, batch.outcomes, strict=True)
        ]

    @staticmethod
    def _forget(raw: aiormq.Channel, encoded: list[tuple[int, str, bytes]], first: int) -> None:
        """Unregister a batch: late confirms are then ignored, and the maps do not grow."""
        confirmations, ids = raw.confirmations, raw.message_id_delivery_tag
        for offset, (_, message_id, _) in enumerate(encoded):
            tag = first + offset
            if isinstance(confirmations.get(tag), _Confirmation):
                del confirmations[tag]
            if ids.get(message_id) == tag:
                del ids[message_id]

    def _encode(self, message: OutgoingMessage, raw: aiormq.Channel) -> bytes:
        """The message's frames; _Unpublishable if they could never be sent as they are."""
        body = message.body
        if self._too_large(message):
            raise _Unpublishable(Failure.TOO_LARGE, self._too_large_reason(message))
        try:
            method = self._method_frame(message.exchange, message.routing_key, raw)
            header = _header_frame(message, raw.number)
        except Exception as exc:  # the encoding is pure: whatever it rejects is the message's
            raise _Unpublishable(Failure.MALFORMED, f"cannot encode: {exc}") from exc
        if header is None:
            header = self._generic_header_frame(message, raw)
        frame_max = raw.max_content_size + FRAME_OVERHEAD
        if len(header) > frame_max:
            raise _Unpublishable(
                Failure.TOO_LARGE,
                f"its properties take a {len(header)}-byte frame, over the broker's "
                f"frame_max of {frame_max}",
            )
        step = raw.max_content_size
        if 0 < len(body) <= step:  # an empty body has no body frame
            return b"".join((method, header, _body_frame(body, raw.number)))
        parts = [method, header]
        parts.extend(
            marshal_frame(ContentBody(body[i : i + step]), raw.number)
            for i in range(0, len(body), step)
        )
        return b"".join(parts)

    @staticmethod
    def _generic_header_frame(message: OutgoingMessage, raw: aiormq.Channel) -> bytes:
        """pamqp's marshalling, for what ``_header_frame`` leaves to it."""
        try:
            properties = Basic.Properties(
                content_type=CONTENT_TYPE,
                delivery_mode=PERSISTENT,
                message_id=message.message_id,
                message_type=message.message_type,
                headers={**message.headers, ENVELOPE_HEADER: ENVELOPE_VERSION},
            )
            return marshal_frame(
                ContentHeader(properties=properties, body_size=len(message.body)), raw.number
            )
        except Exception as exc:  # the encoding is pure: whatever it rejects is the message's
            raise _Unpublishable(Failure.MALFORMED, f"cannot encode: {exc}") from exc

    def _method_frame(self, exchange: str, routing_key: str, raw: aiormq.Channel) -> bytes:
        route = (exchange, routing_key)
        method = self._method_frames.get(route)
        if method is None:
            if len(self._method_frames) > MAX_CACHED_ROUTES:
                self._method_frames.clear()
            method = marshal_frame(
                Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=True),
                raw.number,
            )
            self._method_frames[route] = method
        return method

    async def _publish_each(
        self, raw: aiormq.Channel, messages: Sequence[OutgoingMessage], sendable: list[int]
    ) -> list[tuple[int, Outcome]]:
        """aiormq's public publish, one task per message: the path when its internals are
        not the ones :meth:`_publish_batched` was written against. The messages were
        encoded once already, so what can never be published does not get here."""
        create_task = asyncio.get_running_loop().create_task
        pending: list[tuple[int, asyncio.Task[Any]]] = []
        for index in sendable:
            message = messages[index]
            properties = Basic.Properties(
                content_type=CONTENT_TYPE,
                delivery_mode=PERSISTENT,
                message_id=message.message_id,
                message_type=message.message_type,
                headers={**message.headers, ENVELOPE_HEADER: ENVELOPE_VERSION},
            )
            publish = raw.basic_publish(
                message.body,
                exchange=message.exchange,
                routing_key=message.routing_key,
                properties=properties,
                mandatory=True,
                # The confirm is what we wait for; it comes after the socket write anyway.
                wait=False,
            )
            pending.append((index, create_task(publish)))
        if not pending:
            return []
        _, late = await asyncio.wait([t for _, t in pending], timeout=self.publish_timeout)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)
        return [
            (index, NO_CONFIRM if task.cancelled() else task.exception()) for index, task in pending
        ]

    def _settle(
        self,
        outcomes: list[tuple[int, Outcome]],
        messages: Sequence[OutgoingMessage],
        result: BatchResult,
    ) -> None:
        for index, outcome in outcomes:
            if outcome is None:
                result.confirmed.append(index)
            elif outcome is NO_CONFIRM:
                result.unconfirmed.append(index)
                result.broker_error = result.broker_error or (
                    f"no confirm within {self.publish_timeout}s"
                )
            elif isinstance(outcome, aiormq.exceptions.PublishError):
                result.failed.append((index, Failure.RETURNED, _returned_reason(outcome)))
            elif isinstance(outcome, aiormq.exceptions.DeliveryError):
                result.failed.append((index, Failure.NACKED, "nacked by the broker"))
            elif isinstance(outcome, CONNECTION_ERRORS) or self._batched_writes:
                # Batched writes encode before sending: any later error is the connection's.
                result.unconfirmed.append(index)
                result.broker_error = result.broker_error or f"{type(outcome).__name__}: {outcome}"
                if isinstance(outcome, BaseException):
                    self._learn_size_limit(outcome)
            else:
                reason = f"cannot publish: {type(outcome).__name__}: {outcome}"
                result.failed.append((index, Failure.UNEXPECTED, reason))
        # After the broker refused a body over its limit (and told us the limit): that
        # message, and any other over it, fail now; sent again, they would close the
        # channel again, batch after batch.
        for index in [i for i in result.unconfirmed if self._too_large(messages[i])]:
            result.unconfirmed.remove(index)
            reason = self._too_large_reason(messages[index])
            result.failed.append((index, Failure.TOO_LARGE, reason))

    def _too_large(self, message: OutgoingMessage) -> bool:
        return len(message.body) > self.max_message_size

    def _too_large_reason(self, message: OutgoingMessage) -> str:
        return (
            f"its body of {len(message.body)} bytes is over the broker's max_message_size "
            f"of {self.max_message_size}"
        )

    def _learn_size_limit(self, error: BaseException) -> None:
        limit = refused_size_limit(error)
        if limit is not None and limit < self.max_message_size:
            log.warning(
                "the broker refuses messages over its max_message_size, lower than "
                "configured here; using its limit",
                extra={"broker_limit": limit, "configured": self.max_message_size},
            )
            self.max_message_size = limit


class _NoConfirm:
    """No answer from the broker for this message (timeout, or the channel went)."""


NO_CONFIRM = _NoConfirm()
# None: confirmed; an exception: refused or failed; NO_CONFIRM: no answer.
Outcome = BaseException | None | _NoConfirm


class _BatchConfirms:
    """The outcomes of one batch's messages, and a future set when all are known."""

    __slots__ = ("all_settled", "outcomes", "remaining")

    def __init__(self, size: int) -> None:
        self.outcomes: list[Outcome] = [NO_CONFIRM] * size
        self.remaining = size
        self.all_settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if size == 0:
            self.all_settled.set_result(None)

    def settle(self, offset: int, outcome: BaseException | None) -> None:
        self.outcomes[offset] = outcome
        self.remaining -= 1
        if self.remaining == 0 and not self.all_settled.done():
            self.all_settled.set_result(None)

    def stop(self) -> None:
        if not self.all_settled.done():
            self.all_settled.cancel()


class _Confirmation:
    """What aiormq's reader settles for one published message, in place of a future.

    aiormq calls exactly these on a confirmation: ``done``/``cancelled`` (to skip one that
    is already settled), ``set_result`` on an ack, ``set_exception`` on a nack or return.
    """

    __slots__ = ("_batch", "_done", "_offset")

    def __init__(self, batch: _BatchConfirms, offset: int) -> None:
        self._batch = batch
        self._offset = offset
        self._done = False

    def done(self) -> bool:
        return self._done

    def cancelled(self) -> bool:
        return False

    def set_result(self, _: object) -> None:
        self._settle(None)

    def set_exception(self, exc: BaseException) -> None:
        self._settle(exc)

    def _settle(self, outcome: BaseException | None) -> None:
        if not self._done:
            self._done = True
            self._batch.settle(self._offset, outcome)


def _header_frame(message: OutgoingMessage, channel: int) -> bytes | None:
    """The content header frame pamqp would marshal for ``message``, built directly, for
    the shape every job message has: string headers (trace context) with short keys, a
    message id and a type of 1 to 255 bytes. None for anything else (pamqp then encodes
    it, or refuses it). Byte for byte pamqp's output, keys sorted as it sorts them (a
    property test compares the two)."""
    headers = message.headers
    if ENVELOPE_HEADER in headers:
        return None
    entries = [(_ENVELOPE_KEY, _ENVELOPE_VALUE)]
    for key, value in headers.items():
        if type(key) is not str or type(value) is not str:
            return None
        encoded_key = key.encode()
        if not encoded_key or len(encoded_key) > 128:
            return None
        encoded = value.encode()
        entries.append((encoded_key, b"S" + _LONG.pack(len(encoded)) + encoded))
    # pamqp sorts the keys as str; UTF-8 bytes sort in the same (code point) order.
    entries.sort()
    table = b"".join(bytes((len(k),)) + k + v for k, v in entries)
    message_id = message.message_id.encode()
    message_type = message.message_type.encode()
    if not 0 < len(message_id) <= 255 or not 0 < len(message_type) <= 255:
        return None
    payload = b"".join(
        (
            _HEADER_START.pack(Basic.frame_id, 0, len(message.body)),
            _HEADER_FLAGS,
            _CONTENT_TYPE_FIELD,
            _LONG.pack(len(table)),
            table,
            bytes((PERSISTENT, len(message_id))),
            message_id,
            bytes((len(message_type),)),
            message_type,
        )
    )
    return _FRAME_START.pack(2, channel, len(payload)) + payload + _FRAME_END


def _body_frame(body: bytes, channel: int) -> bytes:
    """One content body frame (a body within frame_max), as pamqp marshals it."""
    return _FRAME_START.pack(3, channel, len(body)) + body + _FRAME_END


def settle_confirms_in_order(raw: aiormq.Channel) -> bool:
    """Make the channel settle a *multiple* ack or nack in time proportional to the tags it
    covers, instead of aiormq's scan of every confirmation in flight (plus a scheduled
    call per settled tag) on each such frame: with a thousand in flight that scan was the
    relay's largest cost (a fifth of its samples under py-spy).

    Delivery tags only grow on a channel, so the tags a multiple frame covers that are
    still unsettled lie between the highest tag an earlier multiple frame covered and this
    frame's tag. Each is settled by aiormq's own ``_confirm_delivery``, as before. Installed
    on this channel object only; False (and nothing changed) where aiormq's internals are
    not the expected ones.
    """
    confirm = getattr(raw, "_confirm_delivery", None)
    confirmations = getattr(raw, "confirmations", None)
    if not callable(confirm) or not isinstance(confirmations, dict):
        return False
    if not callable(getattr(raw, "_on_confirm_frame", None)):
        return False
    settled_through = 0

    async def on_confirm_frame(frame: Any) -> None:
        nonlocal settled_through
        tag = frame.delivery_tag
        if tag not in confirmations:
            log.debug("confirm for a delivery tag no longer awaited", extra={"tag": tag})
            return
        if not getattr(frame, "multiple", False):
            confirm(tag, frame)
            return
        for covered in range(settled_through + 1, tag + 1):
            if covered in confirmations:
                confirm(covered, frame)
        settled_through = max(settled_through, tag)

    # An instance attribute shadows the method: aiormq's reader calls
    # ``self._on_confirm_frame(frame)`` for every Basic.Ack and Basic.Nack.
    raw._on_confirm_frame = on_confirm_frame  # type: ignore[method-assign]
    return True


def supports_batched_writes(raw: object) -> bool:
    """Whether this aiormq channel has the internals ``_publish_batched`` relies on."""
    return (
        isinstance(getattr(raw, "confirmations", None), dict)
        and isinstance(getattr(raw, "message_id_delivery_tag", None), dict)
        and isinstance(getattr(raw, "delivery_tag", None), int)
        and isinstance(getattr(raw, "write_queue", None), asyncio.Queue)
        and isinstance(getattr(raw, "max_content_size", None), int)
        and callable(getattr(raw, "create_future", None))
        and getattr(raw, "publisher_confirms", False) is True
        and getattr(raw, "on_return_raises", False) is True
    )


def _returned_reason(exc: aiormq.exceptions.PublishError) -> str:
    frame = exc.frame
    if isinstance(frame, Basic.Return):
        return (
            f"returned by the broker: {frame.reply_code} {frame.reply_text} "
            f"(exchange {frame.exchange!r}, routing key {frame.routing_key!r})"
        )
    return f"returned by the broker: {exc}"
