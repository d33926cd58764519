"""OpenTelemetry for jobcore: setup from the standard ``OTEL_*`` variables, and the trace
context that travels through the outbox.

The context is captured when the job and outbox rows are written, injected by the relay
into the AMQP headers, and extracted by the worker, so one trace covers the HTTP request,
the publish, the consume and the handler.

With no exporter configured, no SDK provider is installed and spans are the API's
no-op spans: tracing then costs next to nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)

from jobcore.telemetry.semconv import ERROR_TYPE

TRACER_NAME = "jobcore"
TRACE_HEADERS = ("traceparent", "tracestate")


# Once an SDK provider is installed it stays (OpenTelemetry refuses to replace it).
_recording = False


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


def tracing_enabled() -> bool:
    """Whether spans are recorded: an SDK tracer provider is installed in this process.

    The cheap check hot paths make before doing any per-message tracing work.
    """
    global _recording
    if not _recording:
        _recording = isinstance(trace.get_tracer_provider(), TracerProvider)
    return _recording


@contextlib.contextmanager
def span_if_enabled(
    name: str,
    *,
    kind: trace.SpanKind = trace.SpanKind.INTERNAL,
    context: otel_context.Context | None = None,
    attributes: Mapping[str, Any] | None = None,
    links: Sequence[trace.Link] | None = None,
) -> Iterator[trace.Span | None]:
    """A current span when tracing is on; nothing at all (``None``) when it is off.

    An exception that escapes it ends the span failed, with ``error.type`` its class
    name (the status and the exception event are the SDK's) unless one was set already.
    """
    if not tracing_enabled():
        yield None
        return
    with tracer().start_as_current_span(
        name, context=context, kind=kind, attributes=attributes, links=links
    ) as span:
        try:
            yield span
        except Exception as exc:
            if span.is_recording() and ERROR_TYPE not in getattr(span, "attributes", {}):
                span.set_attribute(ERROR_TYPE, type(exc).__qualname__)
            raise


def current_ids() -> tuple[str, str] | None:
    """The current span's (trace id, span id) in hex, or None outside a valid span."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}"


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
        if k in TRACE_HEADERS
    }
    return propagate.extract(carrier)


class JsonLinesSpanExporter(SpanExporter):
    """Appends finished spans to a file, one JSON object a line.

    For tests and local debugging across processes: each export is one ``write`` to a file
    opened with O_APPEND, so several processes can share the file without tearing lines.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()

    @staticmethod
    def _span_dict(span: ReadableSpan) -> dict[str, Any]:
        ctx = span.get_span_context()
        parent = span.parent
        return {
            "name": span.name,
            "kind": span.kind.name if span.kind else None,
            "trace_id": f"{ctx.trace_id:032x}" if ctx else None,
            "span_id": f"{ctx.span_id:016x}" if ctx else None,
            "parent_span_id": f"{parent.span_id:016x}" if parent else None,
            "links": [
                {
                    "trace_id": f"{link.context.trace_id:032x}",
                    "span_id": f"{link.context.span_id:016x}",
                }
                for link in span.links
            ],
            "service": span.resource.attributes.get("service.name"),
            "attributes": dict(span.attributes or {}),
            "start": span.start_time,
            "end": span.end_time,
            "status": span.status.status_code.name,
        }

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        data = b"".join(orjson.dumps(self._span_dict(s), default=str) + b"\n" for s in spans)
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def setup_tracing(service_name: str) -> TracerProvider | None:
    """Install an SDK tracer provider if the environment asks for an exporter.

    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) → OTLP over HTTP;
    ``OTEL_TRACES_EXPORTER=console`` → stdout; ``JOBCORE_TRACE_FILE`` → JSON lines.
    ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_TRACES_SAMPLER`` are
    honoured by the SDK itself. Returns the provider, or None when tracing stays off.
    """
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    exporters: list[SpanExporter] = []
    wanted = {e.strip() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()}
    if "none" in wanted:
        return None
    if (
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or "otlp" in wanted
    ):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporters.append(OTLPSpanExporter())
    if "console" in wanted:
        exporters.append(ConsoleSpanExporter())
    if path := env.get("JOBCORE_TRACE_FILE"):
        exporters.append(JsonLinesSpanExporter(path))
    if not exporters:
        return None
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
    trace.set_tracer_provider(provider)
    atexit.register(provider.shutdown)
    return provider
