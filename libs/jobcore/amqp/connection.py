"""Opening broker connections with settings applied and errors translated.

``JOBCORE_AMQP_URL`` may list several brokers (the nodes of one cluster, comma-separated).
A connection goes to the first that answers, starting with the one that answered last:
:func:`connect` tries each in turn, and the robust connection of :func:`connect_robust`
(the worker's) moves on to the next broker on every reconnect attempt after its
connection dropped or an attempt failed, so a dead node costs one refused connect, not
a reconnect loop stuck on it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import aiormq
from aio_pika.abc import AbstractRobustConnection
from aio_pika.robust_connection import RobustConnection

from jobcore.kernel.errors import BrokerUnavailable
from jobcore.kernel.settings import Settings
from jobcore.telemetry.semconv import server_attributes

BROKER_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ConnectionError,
    asyncio.TimeoutError,
    aiormq.exceptions.AMQPError,
    aio_pika.exceptions.AMQPException,
    # "No active transport": a channel opened or used on a connection that another task
    # has just closed (a RuntimeError, not an AMQPError).
    aiormq.exceptions.ChannelInvalidStateError,
)

# When the peer closes the socket during the handshake, aiormq's frame reader can end with
# StopAsyncIteration, which escapes aio_pika.connect as it is (seen with uvloop, the broker
# cut by a proxy in `jobcore demo`): it ended the relay's loop instead of being retried.
_CONNECT_ERRORS: tuple[type[BaseException], ...] = (*BROKER_ERRORS, StopAsyncIteration)


def redact(url: str) -> str:
    """The URL without its password, for logs and error messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _with_heartbeat(url: str, heartbeat: int) -> str:
    parts = urlsplit(url)
    query = parts.query
    if "heartbeat=" not in query:
        query = f"{query}&heartbeat={heartbeat}".lstrip("&")
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def connection_urls(settings: Settings) -> list[str]:
    """Every broker's URL with the settings applied, in the configured order."""
    return [_with_heartbeat(url, settings.amqp_heartbeat) for url in settings.amqp_urls]


def connection_url(settings: Settings) -> str:
    """The first broker's URL with the settings applied."""
    return connection_urls(settings)[0]


def connected_to(connection: object) -> str:
    """The broker a connection is open to, without password or options, for logs."""
    url = getattr(connection, "url", None)
    if url is None:
        return "?"
    parts = urlsplit(str(url))
    return redact(urlunsplit((parts.scheme, parts.netloc, parts.path, "", "")))


def redact_all(settings: Settings) -> str:
    """The configured brokers without their passwords, for logs and error messages."""
    return ",".join(redact(url) for url in settings.amqp_urls)


# The broker each list of brokers last connected to (by position): the next connection
# starts there, so that a dead first node is not tried first again and again.
_preferred: dict[tuple[str, ...], int] = {}


def _in_turn(urls: Sequence[str]) -> list[int]:
    start = _preferred.get(tuple(urls), 0) % len(urls)
    return [(start + n) % len(urls) for n in range(len(urls))]


def broker_server(settings: Settings) -> dict[str, Any]:
    """The broker's ``server.address`` / ``server.port`` for spans, from the configured
    URL (no look-up: the conventions ask for what is known without one). Nothing when
    the URL does not name one host and port (a list of brokers)."""
    if len(settings.amqp_urls) != 1:
        return {}
    parts = urlsplit(settings.amqp_url)
    try:
        port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    except ValueError:
        return {}
    return server_attributes(parts.hostname, port)


def _reason(exc: BaseException) -> str:
    return str(exc) or f"{type(exc).__name__} (the connection closed during the handshake)"


def _unavailable(
    settings: Settings, failures: Sequence[tuple[str, BaseException]]
) -> BrokerUnavailable:
    if len(failures) == 1:
        url, exc = failures[0]
        return BrokerUnavailable(
            f"JOBCORE_AMQP_URL: cannot connect to {redact(url)}: {_reason(exc)}"
        )
    tried = "; ".join(f"{redact(url)}: {_reason(exc)}" for url, exc in failures)
    return BrokerUnavailable(f"JOBCORE_AMQP_URL: cannot connect to any broker ({tried})")


async def connect(settings: Settings, *, timeout: float = 5.0) -> aio_pika.abc.AbstractConnection:
    """One plain connection to the first broker that answers (each given ``timeout``); the
    caller owns reconnecting (and logging it once)."""
    urls = connection_urls(settings)
    failures: list[tuple[str, BaseException]] = []
    for n in _in_turn(urls):
        try:
            connection = await aio_pika.connect(urls[n], timeout=timeout)
        except _CONNECT_ERRORS as exc:
            failures.append((settings.amqp_urls[n], exc))
            continue
        _preferred[tuple(urls)] = n
        return connection
    raise _unavailable(settings, failures) from failures[-1][1]


class FailoverConnection(RobustConnection):
    """aio-pika's robust connection over a list of brokers: each reconnect attempt after a
    drop or a failed attempt goes to the next broker of the list. Reconnecting restores the
    channels, re-declares their exchanges and queues and restarts their consumers, on
    whichever node answered (a quorum queue is reachable through any node of its cluster).
    """

    def __init__(self, urls: Sequence[str], start: int, **kwargs: Any) -> None:
        self.broker_urls = list(urls)
        self.broker_index = start
        self._attempted = False
        super().__init__(aio_pika.connection.make_url(self.broker_urls[start]), **kwargs)

    # Overrides RobustConnection's private ``__connect_transport`` (name-mangled), which its
    # reconnect loop awaits for every attempt: the one place that sees each attempt.
    async def _RobustConnection__connect_transport(self) -> None:
        if self._attempted:
            self.broker_index = (self.broker_index + 1) % len(self.broker_urls)
            self.url = aio_pika.connection.make_url(self.broker_urls[self.broker_index])
        self._attempted = True
        await super()._RobustConnection__connect_transport()  # type: ignore[misc]
        _preferred[tuple(self.broker_urls)] = self.broker_index


async def connect_robust(settings: Settings, *, timeout: float = 5.0) -> AbstractRobustConnection:
    """A robust connection to the first broker that answers; it reconnects by itself,
    to the next broker of the list each time (see :class:`FailoverConnection`)."""
    urls = connection_urls(settings)
    failures: list[tuple[str, BaseException]] = []
    for n in _in_turn(urls):
        connection = FailoverConnection(urls, n)
        try:
            await connection.connect(timeout=timeout)
        except _CONNECT_ERRORS as exc:
            failures.append((settings.amqp_urls[n], exc))
            with contextlib.suppress(Exception):
                await connection.close()
            continue
        return connection
    raise _unavailable(settings, failures) from failures[-1][1]
