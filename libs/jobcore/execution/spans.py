"""An attempt's INTERNAL ``handler`` span, around the handler call alone.

In the worker it is a child of the delivery's CONSUMER ``process`` span (the handler's
task copies the delivery's context); a handler that raises ends it failed, with
``error.type`` the exception's class. With tracing off it is an empty context manager.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry.trace import Span

from jobcore.execution.job import ClaimedJob
from jobcore.telemetry import span_if_enabled, tracing_enabled


def handler_span(job: ClaimedJob) -> AbstractContextManager[Span | None]:
    if not tracing_enabled():
        return nullcontext()
    attributes: dict[str, Any] = {
        "job.id": str(job.job_id),
        "job.type": job.job_type.name,
        "job.attempt": job.attempt,
    }
    if job.message_id:
        attributes["messaging.message.id"] = str(job.message_id)
    return span_if_enabled("handler", attributes=attributes)
