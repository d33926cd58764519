"""Trace context that travels through the outbox: captured at enqueue, injected by the
relay into AMQP headers, extracted by the worker. (Exporters and metrics: issue 6.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate


def capture_trace_headers() -> dict[str, str]:
    """The current W3C trace context as headers (``traceparent``, maybe ``tracestate``)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def context_from_headers(headers: Mapping[str, Any] | None) -> otel_context.Context:
    """The trace context carried by message headers (an empty context when there is none)."""
    carrier = {
        k: v.decode() if isinstance(v, bytes) else str(v)
        for k, v in (headers or {}).items()
        if k in ("traceparent", "tracestate")
    }
    return propagate.extract(carrier)
