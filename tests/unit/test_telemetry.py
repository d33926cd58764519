"""Trace context capture/extract and the JSON-lines exporter, with the real SDK."""

from __future__ import annotations

import logging
from pathlib import Path

import orjson
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from jobcore.amqp.connection import broker_server
from jobcore.amqp.publisher import BatchResult, Failure, OutgoingMessage
from jobcore.database.sql.jobs.enqueue import JOB_INSERT
from jobcore.database.sql.jobs.run import JOB_CLAIM_MANY
from jobcore.database.statement_spans import operation_name, statement_name
from jobcore.kernel.settings import Settings
from jobcore.telemetry.logs import JsonFormatter
from jobcore.telemetry.semconv import process_destination, publish_destination
from jobcore.telemetry.traces import (
    JsonLinesSpanExporter,
    capture_trace_headers,
    context_from_headers,
    setup_tracing,
)
from services.relay.tracing import PublishSpans


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


def sdk_tracer() -> tuple[trace.Tracer, InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return provider.get_tracer("test"), memory


def test_log_lines_inside_a_span_carry_its_ids() -> None:
    tracer, _ = sdk_tracer()
    formatter = JsonFormatter("test")
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", (), None)
    record.job_id = "j1"
    outside = orjson.loads(formatter.format(record))
    assert "trace_id" not in outside
    assert outside["job_id"] == "j1"
    with tracer.start_as_current_span("work") as span:
        inside = orjson.loads(formatter.format(record))
    ctx = span.get_span_context()
    assert inside["trace_id"] == f"{ctx.trace_id:032x}"
    assert inside["span_id"] == f"{ctx.span_id:016x}"


def test_statements_are_named_after_their_query() -> None:
    assert statement_name(JOB_INSERT.sql) == "job_insert"
    assert statement_name(JOB_CLAIM_MANY.sql) == "job_claim_many"
    assert statement_name("COMMIT") == "COMMIT"
    assert statement_name("  select 1") == "SELECT"
    assert statement_name("") == "postgresql"


@pytest.mark.parametrize(
    ("text", "operation"),
    [
        ("select 1", "SELECT"),
        ("SELECT * FROM outbox FOR UPDATE SKIP LOCKED", "SELECT"),
        ("INSERT INTO t (a, b) SELECT a, b FROM u ON CONFLICT (a) DO UPDATE SET b = 1", "INSERT"),
        ("UPDATE t SET a = 1 WHERE id IN (SELECT id FROM u)", "UPDATE"),
        ("WITH c AS (UPDATE t SET a = 1 RETURNING id) SELECT * FROM c", "UPDATE"),
        ("WITH c AS MATERIALIZED (DELETE FROM t RETURNING id) DELETE FROM u", "DELETE"),
        ("WITH c AS (UPDATE t SET a = 1 RETURNING id) INSERT INTO u SELECT id FROM c", None),
        ("-- DELETE in a comment\nSELECT 'INSERT' AS \"UPDATE\"", "SELECT"),
        ("BEGIN", "BEGIN"),
        ("LISTEN outbox", "LISTEN"),
        ("", None),
    ],
)
def test_a_statement_has_an_operation_name_only_when_one_describes_it(
    text: str, operation: str | None
) -> None:
    assert operation_name(text) == operation


def test_the_library_statements_with_one_operation_name_it() -> None:
    assert operation_name(JOB_INSERT.sql) == "INSERT"
    # Inbox insert and job update in one statement: no single operation describes it.
    assert operation_name(JOB_CLAIM_MANY.sql) is None


@pytest.mark.parametrize(
    ("exchange", "routing_key", "destination"),
    [
        ("x.jobs", "q", "x.jobs:q"),
        ("", "q", "q"),
        ("x.jobs", "", "x.jobs"),
        ("", "", "amq.default"),
    ],
)
def test_publish_destinations_follow_the_rabbitmq_conventions(
    exchange: str, routing_key: str, destination: str
) -> None:
    assert publish_destination(exchange, routing_key) == destination


@pytest.mark.parametrize(
    ("exchange", "routing_key", "queue", "destination"),
    [
        ("x.jobs", "rk", "x.q", "x.jobs:rk:x.q"),
        ("x.jobs", "x.q", "x.q", "x.jobs:x.q"),  # routing key = queue: named once
        ("", "x.q", "x.q", "x.q"),  # the default exchange is left out
        ("x.dlx", "", "x.dlq", "x.dlx:x.dlq"),
    ],
)
def test_process_destinations_follow_the_rabbitmq_conventions(
    exchange: str, routing_key: str, queue: str, destination: str
) -> None:
    assert process_destination(exchange, routing_key, queue) == destination


def test_publish_spans_continue_each_row_and_replace_its_context() -> None:
    tracer, memory = sdk_tracer()
    with tracer.start_as_current_span("enqueue") as enqueue:
        row_headers = capture_trace_headers()
    messages = [
        OutgoingMessage("x.jobs", "q", f"m{i}", "echo", {**row_headers, "other": "kept"}, b"{}")
        for i in range(2)
    ] + [OutgoingMessage("x.jobs", "q", "m-untraced", "echo", {}, b"{}")]
    server = {"server.address": "broker.example", "server.port": 5672}
    spans = PublishSpans(messages, server=server, tracer=tracer)
    result = BatchResult(confirmed=[0], failed=[(1, Failure.RETURNED, "no route")], unconfirmed=[2])
    spans.end(result)

    published = {
        s.attributes["messaging.message.id"]: s
        for s in memory.get_finished_spans()
        if s.name == "publish x.jobs:q" and s.attributes is not None
    }
    first, second, third = (published[m] for m in ("m0", "m1", "m-untraced"))
    for span in (first, second):
        assert span.kind is trace.SpanKind.PRODUCER
        assert span.parent is not None
        assert span.parent.span_id == enqueue.get_span_context().span_id
        assert span.context.trace_id == enqueue.get_span_context().trace_id
    assert third.parent is None  # a row written without a trace starts one
    assert first.status.status_code is trace.StatusCode.UNSET
    assert second.status.status_code is trace.StatusCode.ERROR
    assert third.status.status_code is trace.StatusCode.ERROR
    assert first.attributes is not None
    assert second.attributes is not None
    assert third.attributes is not None
    assert "error.type" not in first.attributes
    assert second.attributes["error.type"] == "returned"
    assert third.attributes["error.type"] == "unconfirmed"
    assert first.attributes["messaging.destination.name"] == "x.jobs:q"
    assert first.attributes["messaging.rabbitmq.destination.routing_key"] == "q"
    assert first.attributes["messaging.operation.name"] == "publish"
    assert first.attributes["messaging.operation.type"] == "send"
    assert first.attributes["server.address"] == "broker.example"
    assert first.attributes["server.port"] == 5672

    # The message now carries the publish span's context, and its other headers.
    outgoing = spans.messages[0]
    assert outgoing.headers["other"] == "kept"
    consumer_parent = trace.get_current_span(context_from_headers(outgoing.headers))
    assert consumer_parent.get_span_context().span_id == first.context.span_id


def test_tracing_stays_off_without_an_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "JOBCORE_TRACE_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert setup_tracing("test") is None
    monkeypatch.setenv("JOBCORE_TRACE_FILE", "/dev/null")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert setup_tracing("test") is None
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert setup_tracing("test") is None


@pytest.mark.parametrize(
    ("url", "server"),
    [
        (
            "amqp://u:p@broker.example:5673/vh",
            {"server.address": "broker.example", "server.port": 5673},
        ),
        ("amqps://u:p@broker.example/", {"server.address": "broker.example", "server.port": 5671}),
        ("amqp://u:p@10.0.0.1/", {"server.address": "10.0.0.1", "server.port": 5672}),
    ],
)
def test_spans_name_the_configured_broker(url: str, server: dict[str, object]) -> None:
    assert broker_server(Settings(environment="test", amqp_url=url)) == server
