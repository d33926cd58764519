"""With OTEL_EXPORTER_OTLP_ENDPOINT set, the three processes send spans and metrics over
OTLP/HTTP: a collector stand-in on 127.0.0.1 decodes what arrives."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from jobcore.kernel.settings import Settings
from tests.e2e.stack import E2EStack, until

pytestmark = pytest.mark.timeout(240)


class Collector:
    """Accepts OTLP/HTTP protobuf exports and keeps what they carried."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str]] = []  # (service, span name)
        self.metrics: set[tuple[str, str]] = set()  # (service, metric name)
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                collector.receive(self.path, body)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]

    @staticmethod
    def _service(resource: object) -> str:
        for attribute in resource.attributes:  # type: ignore[attr-defined]
            if attribute.key == "service.name":
                return str(attribute.value.string_value)
        return ""

    def receive(self, path: str, body: bytes) -> None:
        with self.lock:
            if path == "/v1/traces":
                traces = ExportTraceServiceRequest.FromString(body)
                for rs in traces.resource_spans:
                    service = self._service(rs.resource)
                    self.spans.extend(
                        (service, span.name) for ss in rs.scope_spans for span in ss.spans
                    )
            elif path == "/v1/metrics":
                metrics = ExportMetricsServiceRequest.FromString(body)
                for rm in metrics.resource_metrics:
                    service = self._service(rm.resource)
                    self.metrics.update(
                        (service, m.name) for sm in rm.scope_metrics for m in sm.metrics
                    )


@pytest.fixture
def collector() -> Iterator[Collector]:
    collector = Collector()
    thread = threading.Thread(target=collector.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield collector
    finally:
        collector.server.shutdown()
        collector.server.server_close()


@pytest.fixture
async def stack(
    settings: Settings, tmp_path: Path, collector: Collector
) -> AsyncIterator[E2EStack]:
    stack = E2EStack(
        settings,
        tmp_path,
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.port}",
            "OTEL_METRIC_EXPORT_INTERVAL": "500",
        },
    )
    try:
        await stack.start()
        yield stack
    finally:
        await stack.stop()


def operation(span_name: str) -> str:
    first, _, rest = span_name.partition(" ")
    return first if first in ("publish", "process") and rest else span_name


async def test_spans_and_metrics_go_out_over_otlp(stack: E2EStack, collector: Collector) -> None:
    async with stack.client() as client:
        answer = await client.post("/jobs/echo", json={"text": "otlp"})
        assert answer.status_code == 202
        await stack.wait_status(client, answer.json()["job_id"], "succeeded")
    codes = await stack.stop()
    assert codes == {"api": 0, "relay": 0, "worker": 0}

    def received() -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
        with collector.lock:
            spans, metrics = set(collector.spans), set(collector.metrics)
        # Messaging spans are named "{operation} {destination}": compared by operation.
        return {(service, operation(name)) for service, name in spans}, metrics

    wanted_spans = {
        ("jobcore-api-e2e", "POST /jobs/echo"),
        ("jobcore-api-e2e", "enqueue"),
        ("jobcore-relay-e2e", "publish"),
        ("jobcore-worker-e2e", "process"),
        ("jobcore-worker-e2e", "handler"),
    }
    wanted_metrics = {
        ("jobcore-api-e2e", "jobcore_api_enqueue_requests"),
        ("jobcore-relay-e2e", "jobcore_relay_published_messages"),
        ("jobcore-relay-e2e", "jobcore_jobs_pending"),
        ("jobcore-worker-e2e", "jobcore_worker_jobs_completed"),
        ("jobcore-worker-e2e", "jobcore_worker_handler_seconds"),
    }

    async def arrived() -> bool:
        spans, metrics = received()
        return wanted_spans <= spans and wanted_metrics <= metrics

    await until(arrived, timeout=15, what="spans and metrics at the OTLP collector")
