"""Prometheus text → OpenTelemetry metric data, encodable as OTLP, pushed by the service."""

from __future__ import annotations

import time
from typing import Any

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client import Gauge as PromGauge
from prometheus_client import Histogram as PromHistogram

from jobcore.telemetry.otlp_metrics import OtlpMetricsPusher, metrics_data, metrics_export_wanted


def registry_text() -> str:
    registry = CollectorRegistry()
    published = Counter("jobcore_relay_published_messages", "published", registry=registry)
    published.inc(20)
    completed = Counter("jobcore_done", "done", ["status"], registry=registry)
    completed.labels("succeeded").inc(3)
    completed.labels("failed").inc(1)
    PromGauge("jobcore_outbox_due", "due", registry=registry).set(7)
    runtime = PromHistogram("jobcore_runtime_seconds", "rt", buckets=(0.1, 1.0), registry=registry)
    for value in (0.05, 0.5, 0.7, 5.0):
        runtime.observe(value)
    return generate_latest(registry).decode()


def by_name(data: MetricsData) -> dict[str, Any]:
    [resource_metrics] = data.resource_metrics
    [scope] = resource_metrics.scope_metrics
    return {metric.name: metric.data for metric in scope.metrics}


def test_counters_gauges_and_histograms_convert() -> None:
    now = time.time_ns() + 1_000_000_000
    data = metrics_data(registry_text(), Resource.create({"service.name": "t"}), now=now)
    metrics = by_name(data)

    published = metrics["jobcore_relay_published_messages"]
    assert isinstance(published, Sum)
    assert published.is_monotonic
    assert published.aggregation_temporality is AggregationTemporality.CUMULATIVE
    [point] = published.data_points
    assert point.value == 20
    assert 0 < point.start_time_unix_nano < point.time_unix_nano  # from _created

    done = {p.attributes["status"]: p.value for p in metrics["jobcore_done"].data_points}
    assert done == {"succeeded": 3, "failed": 1}

    due = metrics["jobcore_outbox_due"]
    assert isinstance(due, Gauge)
    assert due.data_points[0].value == 7
    assert "jobcore_relay_published_messages_created" not in metrics  # a start time, not a metric

    runtime = metrics["jobcore_runtime_seconds"]
    assert isinstance(runtime, Histogram)
    [hist] = runtime.data_points
    assert list(hist.explicit_bounds) == [0.1, 1.0]
    assert list(hist.bucket_counts) == [1, 2, 1]  # per bucket, +Inf last
    assert hist.count == 4
    assert abs(hist.sum - 6.25) < 1e-9

    # The OTLP exporter's own encoder takes it (Prometheus keeps no min/max).
    request = encode_metrics(data)
    [scope] = request.resource_metrics[0].scope_metrics
    encoded = {m.name: m for m in scope.metrics}
    assert encoded["jobcore_runtime_seconds"].histogram.data_points[0].count == 4
    assert not encoded["jobcore_runtime_seconds"].histogram.data_points[0].HasField("min")
    # The unit in a name's suffix is the metric's unit; a count has none.
    assert encoded["jobcore_runtime_seconds"].unit == "s"
    assert encoded["jobcore_relay_published_messages"].unit == ""


class Recording(MetricExporter):
    def __init__(self, result: MetricExportResult = MetricExportResult.SUCCESS) -> None:
        super().__init__()
        self.result = result
        self.exported: list[MetricsData] = []

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **_: Any) -> Any:
        self.exported.append(metrics_data)
        return self.result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **_: Any) -> None:
        return None


async def test_the_pusher_exports_on_its_interval_and_once_more_at_stop() -> None:
    scrapes: list[int] = []

    async def metrics_text() -> str:
        scrapes.append(1)
        return registry_text()

    exporter = Recording()
    pusher = OtlpMetricsPusher("jobcore-test", metrics_text, exporter=exporter, interval=3600)
    await pusher.start()
    await pusher.stop(5)
    assert len(exporter.exported) == 1  # the final push at stop
    assert len(scrapes) == 1
    resource = exporter.exported[0].resource_metrics[0].resource
    assert resource.attributes["service.name"] == "jobcore-test"


async def test_a_failing_collector_is_reported_not_raised() -> None:
    async def metrics_text() -> str:
        return registry_text()

    pusher = OtlpMetricsPusher(
        "t", metrics_text, exporter=Recording(MetricExportResult.FAILURE), interval=3600
    )
    assert await pusher.push() is False
    assert await pusher.push() is False
    assert pusher.failures == 2


def test_when_metrics_export_is_wanted() -> None:
    assert not metrics_export_wanted({})
    assert metrics_export_wanted({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert metrics_export_wanted({"OTEL_METRICS_EXPORTER": "otlp"})
    assert not metrics_export_wanted(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_METRICS_EXPORTER": "none"}
    )
    assert not metrics_export_wanted({"OTEL_METRICS_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"})
