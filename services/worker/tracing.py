"""The worker's spans: CONSUMER ``consume`` per delivery, INTERNAL ``handler`` per attempt.

``consume`` continues the context in the AMQP headers (the relay's ``publish`` span) and
covers decoding, the inbox + claim statement, the acknowledgement and the handler run;
``handler`` is its child around the handler call alone. A retry's or a reaped job's new
message carries the job's stored context (its ``enqueue`` span), so every attempt's
publish, consume and handler spans stay in the trace of the original request.
With tracing off both are empty context managers.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

from opentelemetry.trace import Span, SpanKind

from jobcore.amqp.deliveries import Delivery
from jobcore.telemetry import context_from_headers, span_if_enabled, tracing_enabled

if TYPE_CHECKING:
    from services.worker.claims import Claim


def consume_span(message: Delivery) -> AbstractContextManager[Span | None]:
    if not tracing_enabled():
        return nullcontext()
    return span_if_enabled(
        "consume",
        kind=SpanKind.CONSUMER,
        context=context_from_headers(message.headers),
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "process",
            "messaging.message.id": str(message.message_id),
            "messaging.rabbitmq.message.redelivered": message.redelivered,
        },
    )


def handler_span(claim: Claim) -> AbstractContextManager[Span | None]:
    if not tracing_enabled():
        return nullcontext()
    return span_if_enabled(
        "handler",
        attributes={
            "job.id": str(claim.job_id),
            "job.type": claim.job_type.name,
            "job.attempt": claim.attempt,
            "messaging.message.id": str(claim.message_id) if claim.message_id else "",
        },
    )
