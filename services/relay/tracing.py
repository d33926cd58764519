"""PRODUCER ``publish {exchange}:{routing key}`` spans, one per outbox message, continuing
the row's trace.

Each span's parent is the context the row was written with (the API's ``enqueue`` span,
or the job's stored context for a retry), and its own context replaces the row's
``traceparent``/``tracestate`` in the AMQP headers: it is the message's creation context,
so the worker's process span becomes its child. A span lasts from the batch's publish to
its confirm (or refusal); a refused or unconfirmed message's span has ``error.type`` (see
:mod:`jobcore.telemetry.semconv`). The relay builds them only when tracing is on: with it off, a
batch costs one check.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind

from jobcore.amqp.publisher import BatchResult, OutgoingMessage
from jobcore.telemetry.semconv import (
    publish_attributes,
    publish_destination,
    record_failure,
    span_name,
)
from jobcore.telemetry.traces import TRACE_HEADERS, context_from_headers
from jobcore.telemetry.traces import tracer as default_tracer

UNCONFIRMED = "unconfirmed"


class PublishSpans:
    """The spans of one batch, and the batch's messages carrying them."""

    def __init__(
        self,
        messages: Sequence[OutgoingMessage],
        *,
        server: Mapping[str, Any] | None = None,
        tracer: trace.Tracer | None = None,
    ) -> None:
        t = tracer or default_tracer()
        self.spans: list[Span] = []
        self.messages: list[OutgoingMessage] = []
        for message in messages:
            span = t.start_span(
                span_name("publish", publish_destination(message.exchange, message.routing_key)),
                context=context_from_headers(message.headers),
                kind=SpanKind.PRODUCER,
                attributes=_attributes(message, server or {}),
            )
            headers = {k: v for k, v in message.headers.items() if k not in TRACE_HEADERS}
            propagate.inject(headers, context=trace.set_span_in_context(span))
            self.spans.append(span)
            self.messages.append(dataclasses.replace(message, headers=headers))

    def end(self, result: BatchResult) -> None:
        for index, reason, error in result.failed:
            record_failure(self.spans[index], str(reason), f"{reason}: {error}")
        for index in result.unconfirmed:
            detail = result.broker_error or "no confirm"
            record_failure(self.spans[index], UNCONFIRMED, f"{UNCONFIRMED}: {detail}")
        for span in self.spans:
            span.end()


def _attributes(message: OutgoingMessage, server: Mapping[str, Any]) -> dict[str, Any]:
    return {
        **publish_attributes(
            message.exchange, message.routing_key, message.message_id, dict(server)
        ),
        "job.type": message.message_type,
    }
