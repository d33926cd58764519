"""The API's own span: ``enqueue``, around writing a job and its outbox row.

The request's SERVER span is FastAPI's native telemetry (``FastAPI(telemetry=...)``): it
continues the caller's ``traceparent`` and is named ``METHOD route-template``; it is on
whenever an SDK tracer provider is installed (:func:`jobcore.telemetry.traces.setup_tracing`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from opentelemetry.trace import Span

from jobcore.telemetry.traces import span_if_enabled


def enqueue_span(job_type: str) -> AbstractContextManager[Span | None]:
    """The INTERNAL ``enqueue`` span (``None`` when tracing is off), current while the
    statement runs, so the outbox row carries its context. The caller adds ``tenant`` and
    ``job.id`` once the statement returned them."""
    return span_if_enabled("enqueue", attributes={"job.type": job_type})
