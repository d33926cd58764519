"""The OpenTelemetry semantic conventions jobcore's spans follow, in one place.

RabbitMQ messaging spans
(https://opentelemetry.io/docs/specs/semconv/messaging/rabbitmq/ and
https://opentelemetry.io/docs/specs/semconv/messaging/messaging-spans/): a PRODUCER
``publish {exchange}:{routing key}`` span per message the relay publishes, a CONSUMER
``process {exchange}:{routing key}:{queue}`` span per delivery the worker takes.
PostgreSQL client spans (https://opentelemetry.io/docs/specs/semconv/database/postgresql/):
named by ``db.query.summary``. The attribute names are strings here rather than the incubating
constants of ``opentelemetry-semantic-conventions``, whose module paths still move.

``error.type`` values jobcore reports:

- publish: the :class:`~jobcore.amqp.publisher.Failure` (``nacked``, ``returned``,
  ``no_exchange``, ``malformed``, ``too_large``, ``unexpected``) or ``unconfirmed``;
- process: the dead-letter reason (``bad_envelope``, ``unknown_type``,
  ``invalid_payload``) or the class name of an unexpected exception;
- database: the SQLSTATE PostgreSQL answered, else the client exception's class name.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import Span, StatusCode

MESSAGING_SYSTEM = "rabbitmq"
DB_SYSTEM = "postgresql"
# What the conventions name the destination of a publish to the default exchange ("")
# with no routing key.
DEFAULT_EXCHANGE = "amq.default"

ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"


def publish_destination(exchange: str, routing_key: str) -> str:
    """``{exchange}:{routing key}``; only the non-empty one when the other is empty."""
    return ":".join(part for part in (exchange, routing_key) if part) or DEFAULT_EXCHANGE


def process_destination(exchange: str, routing_key: str, queue: str) -> str:
    """``{exchange}:{routing key}:{queue}`` without the empty parts (the default exchange),
    and with the queue once when the routing key is the queue's name."""
    parts = (exchange, routing_key) if routing_key == queue else (exchange, routing_key, queue)
    return ":".join(part for part in parts if part) or queue


def server_attributes(host: str | None, port: int | None) -> dict[str, Any]:
    """``server.address`` / ``server.port`` of the broker or database a span talks to."""
    if not host:
        return {}
    attributes: dict[str, Any] = {SERVER_ADDRESS: host}
    if port:
        attributes[SERVER_PORT] = port
    return attributes


def publish_attributes(
    exchange: str, routing_key: str, message_id: str | None, server: dict[str, Any]
) -> dict[str, Any]:
    """A publish span's attributes, all known when it starts (the sampler sees them)."""
    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.name": "publish",
        "messaging.operation.type": "send",
        "messaging.destination.name": publish_destination(exchange, routing_key),
        **server,
    }
    if routing_key:
        attributes["messaging.rabbitmq.destination.routing_key"] = routing_key
    if message_id:
        attributes["messaging.message.id"] = message_id
    return attributes


def process_attributes(
    exchange: str,
    routing_key: str,
    queue: str,
    *,
    message_id: str | None,
    delivery_tag: int | None,
    server: dict[str, Any],
) -> dict[str, Any]:
    """A process span's attributes, all known when it starts."""
    attributes: dict[str, Any] = {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": process_destination(exchange, routing_key, queue),
        **server,
    }
    if routing_key:
        attributes["messaging.rabbitmq.destination.routing_key"] = routing_key
    if delivery_tag is not None:
        attributes["messaging.rabbitmq.message.delivery_tag"] = delivery_tag
    if message_id:
        attributes["messaging.message.id"] = message_id
    return attributes


def span_name(operation: str, destination: str) -> str:
    """``{messaging.operation.name} {destination}``."""
    return f"{operation} {destination}"


def record_failure(span: Span, error_type: str, description: str | None = None) -> None:
    """Mark a span failed the way the conventions ask: ``error.type`` and status ERROR."""
    if span.is_recording():
        span.set_attribute(ERROR_TYPE, error_type)
        span.set_status(StatusCode.ERROR, description)
