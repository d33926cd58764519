"""Trace context capture/extract and the JSON-lines exporter, with the real SDK."""

from __future__ import annotations

from pathlib import Path

import orjson
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from jobcore.telemetry import (
    JsonLinesSpanExporter,
    capture_trace_headers,
    context_from_headers,
)


def test_headers_carry_the_trace_across_a_boundary(tmp_path: Path) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    path = tmp_path / "spans.jsonl"
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(str(path))))
    tracer = provider.get_tracer("test")

    with tracer.start_as_current_span("request") as request:
        headers = capture_trace_headers()
    assert headers["traceparent"].split("-")[1] == f"{request.get_span_context().trace_id:032x}"

    # Elsewhere (another process): the extracted context parents the consumer's span.
    with tracer.start_as_current_span("consume", context=context_from_headers(headers)):
        pass
    request_span, consume_span = memory.get_finished_spans()
    assert consume_span.context.trace_id == request_span.context.trace_id
    assert consume_span.parent is not None
    assert consume_span.parent.span_id == request_span.context.span_id

    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [line["name"] for line in lines] == ["request", "consume"]
    assert lines[1]["parent_span_id"] == lines[0]["span_id"]
    assert lines[0]["trace_id"] == lines[1]["trace_id"]


def test_no_context_means_no_headers_and_an_empty_extract() -> None:
    assert trace.get_current_span().get_span_context().is_valid is False
    assert capture_trace_headers() == {}
    ctx = context_from_headers({"other": b"x"})
    assert trace.get_current_span(ctx).get_span_context().is_valid is False
