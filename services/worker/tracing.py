"""The worker's delivery span: CONSUMER ``process {exchange}:{routing key}:{queue}`` per
delivery; the INTERNAL ``handler`` span per attempt is the execution core's
(:func:`jobcore.execution.executor.handler_span`).

``process`` continues the context in the AMQP headers (the relay's ``publish`` span, the
message's creation context: one message per span, so the conventions allow it as the
parent; it is linked too) and covers decoding, the inbox + claim statement, the
acknowledgement and the handler run; ``handler`` is its child around the handler call
alone. A delivery that is dead-lettered or meets an unexpected error ends its ``process``
span with ``error.type`` (see :mod:`jobcore.telemetry.semconv`); a handler that raises ends its
``handler`` span failed, with ``error.type`` the exception's class, and not the
``process`` span: the message itself was processed (acknowledged, the attempt recorded).
A retry's or a reaped job's new message carries the job's stored context (its ``enqueue``
span), so every attempt's publish, process and handler spans stay in the trace of the
original request. With tracing off both are empty context managers.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from jobcore.amqp.deliveries import Delivery
from jobcore.telemetry.semconv import (
    process_attributes,
    process_destination,
    record_failure,
    span_name,
)
from jobcore.telemetry.traces import context_from_headers, span_if_enabled, tracing_enabled


def process_span(
    message: Delivery, server: Mapping[str, Any]
) -> AbstractContextManager[Span | None]:
    if not tracing_enabled():
        return nullcontext()
    destination = process_destination(message.exchange, message.routing_key, message.queue)
    attributes = process_attributes(
        message.exchange,
        message.routing_key,
        message.queue,
        message_id=message.message_id,
        delivery_tag=message.delivery_tag,
        server=dict(server),
    )
    attributes["jobcore.message.redelivered"] = message.redelivered
    creation = context_from_headers(message.headers)
    # Parented by the message's creation context, and linked to it as the conventions
    # ask of every process span (a link survives where a backend drops remote parents).
    created = trace.get_current_span(creation).get_span_context()
    return span_if_enabled(
        span_name("process", destination),
        kind=SpanKind.CONSUMER,
        context=creation,
        attributes=attributes,
        links=[trace.Link(created)] if created.is_valid else None,
    )


def delivery_failed(error_type: str, description: str | None = None) -> None:
    """End the current process span as failed (it is current wherever a delivery fails)."""
    if tracing_enabled():
        record_failure(trace.get_current_span(), error_type, description)
