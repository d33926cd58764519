"""Opening broker connections with settings applied and errors translated."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import aiormq
from aio_pika.abc import AbstractRobustConnection

from jobcore.errors import BrokerUnavailable
from jobcore.semconv import server_attributes
from jobcore.settings import Settings

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


def connection_url(settings: Settings) -> str:
    parts = urlsplit(settings.amqp_url)
    query = parts.query
    if "heartbeat=" not in query:
        query = f"{query}&heartbeat={settings.amqp_heartbeat}".lstrip("&")
    return urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment))


def broker_server(settings: Settings) -> dict[str, Any]:
    """The broker's ``server.address`` / ``server.port`` for spans, from the configured
    URL (no look-up: the conventions ask for what is known without one). Nothing when
    the URL does not name one host and port (a list of brokers)."""
    parts = urlsplit(settings.amqp_url)
    try:
        port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    except ValueError:
        return {}
    return server_attributes(parts.hostname, port)


def _unavailable(settings: Settings, exc: BaseException) -> BrokerUnavailable:
    reason = str(exc) or f"{type(exc).__name__} (the connection closed during the handshake)"
    return BrokerUnavailable(
        f"JOBCORE_AMQP_URL: cannot connect to {redact(settings.amqp_url)}: {reason}"
    )


async def connect(settings: Settings, *, timeout: float = 5.0) -> aio_pika.abc.AbstractConnection:
    """One plain connection; the caller owns reconnecting (and logging it once)."""
    try:
        return await aio_pika.connect(connection_url(settings), timeout=timeout)
    except _CONNECT_ERRORS as exc:
        raise _unavailable(settings, exc) from exc


async def connect_robust(settings: Settings, *, timeout: float = 5.0) -> AbstractRobustConnection:
    try:
        return await aio_pika.connect_robust(connection_url(settings), timeout=timeout)
    except _CONNECT_ERRORS as exc:
        raise _unavailable(settings, exc) from exc
