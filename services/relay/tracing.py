"""PRODUCER ``publish`` spans, one per outbox message, continuing the row's trace.

Each span's parent is the context the row was written with (the API's ``enqueue`` span,
or the job's stored context for a retry), and its own context replaces the row's
``traceparent``/``tracestate`` in the AMQP headers, so the worker's consume span becomes
its child. A span lasts from the batch's publish to its confirm (or refusal). The relay
builds them only when tracing is on: with it off, a batch costs one check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from jobcore.amqp.publisher import BatchResult, OutgoingMessage
from jobcore.telemetry import TRACE_HEADERS, context_from_headers
from jobcore.telemetry import tracer as default_tracer


class PublishSpans:
    """The spans of one batch, and the batch's messages carrying them."""

    def __init__(
        self, messages: Sequence[OutgoingMessage], *, tracer: trace.Tracer | None = None
    ) -> None:
        t = tracer or default_tracer()
        self.spans: list[Span] = []
        self.messages: list[OutgoingMessage] = []
        for message in messages:
            span = t.start_span(
                "publish",
                context=context_from_headers(message.headers),
                kind=SpanKind.PRODUCER,
                attributes=_attributes(message),
            )
            headers = {k: v for k, v in message.headers.items() if k not in TRACE_HEADERS}
            propagate.inject(headers, context=trace.set_span_in_context(span))
            self.spans.append(span)
            self.messages.append(dataclasses.replace(message, headers=headers))

    def end(self, result: BatchResult) -> None:
        for index, reason, error in result.failed:
            self.spans[index].set_status(Status(StatusCode.ERROR, f"{reason}: {error}"))
        for index in result.unconfirmed:
            detail = result.broker_error or "no confirm"
            self.spans[index].set_status(Status(StatusCode.ERROR, f"unconfirmed: {detail}"))
        for span in self.spans:
            span.end()


def _attributes(message: OutgoingMessage) -> dict[str, Any]:
    return {
        "messaging.system": "rabbitmq",
        "messaging.operation.type": "send",
        "messaging.destination.name": message.exchange,
        "messaging.rabbitmq.destination.routing_key": message.routing_key,
        "messaging.message.id": message.message_id,
        "job.type": message.message_type,
    }
