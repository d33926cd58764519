"""Metrics over OTLP, from the same instruments that /metrics shows.

The processes keep their metrics in prometheus-client registries (exposed as Prometheus
text at /metrics). When the environment asks for OTLP metrics, a small service renders
that same text every ``OTEL_METRIC_EXPORT_INTERVAL`` ms (default 60 s), converts it to
OpenTelemetry metric data (counters → cumulative monotonic sums, gauges → gauges,
histograms → explicit-bucket histograms, start times from the ``_created`` samples) and
sends it with the OTLP/HTTP exporter; a last push happens at shutdown. One set of
instruments, two ways out, and no package beyond the OTLP exporter already installed.
Rendering through the process's own /metrics function also refreshes scrape-time gauges
(the backlog) before each push.

Wanted when ``OTEL_METRICS_EXPORTER`` names ``otlp``, or when an OTLP endpoint is set
(``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``..._METRICS_ENDPOINT``) and ``OTEL_METRICS_EXPORTER``
is not ``none``; never with ``OTEL_SDK_DISABLED=true``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client.metrics_core import Metric as PromFamily
from prometheus_client.parser import text_string_to_metric_families

from jobcore.kernel.startstop import Service

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_MS = 60_000
SCOPE = InstrumentationScope("jobcore")
MetricsText = Callable[[], Awaitable[str]]
Labels = tuple[tuple[str, str], ...]


def metrics_export_wanted(env: dict[str, str] | None = None) -> bool:
    env = dict(os.environ) if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    wanted = {e.strip() for e in env.get("OTEL_METRICS_EXPORTER", "").split(",") if e.strip()}
    if "none" in wanted:
        return False
    return "otlp" in wanted or bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
    )


def _labels(labels: dict[str, str], *without: str) -> Labels:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in without))


def _convert(family: PromFamily, starts: dict[Labels, int], now: int) -> Metric | None:
    def start(labels: Labels) -> int:
        return starts.get(labels, now)

    if family.type == "counter":
        points = [
            NumberDataPoint(dict(key), start(key), now, s.value)
            for s in family.samples
            if s.name.endswith("_total")
            for key in [_labels(s.labels)]
        ]
        data: Any = Sum(points, AggregationTemporality.CUMULATIVE, is_monotonic=True)
    elif family.type == "gauge":
        data = Gauge(
            [NumberDataPoint(dict(_labels(s.labels)), now, now, s.value) for s in family.samples]
        )
    elif family.type == "histogram":
        data = Histogram(_histogram_points(family, start, now), AggregationTemporality.CUMULATIVE)
    else:
        return None
    return Metric(family.name, family.documentation, _unit(family.name), data)


# The unit a Prometheus name ends with, as OTLP's UCUM unit.
_UNITS = {"_seconds": "s", "_bytes": "By"}


def _unit(name: str) -> str | None:
    return next((unit for suffix, unit in _UNITS.items() if name.endswith(suffix)), None)


def _histogram_points(
    family: PromFamily, start: Callable[[Labels], int], now: int
) -> list[HistogramDataPoint]:
    buckets: dict[Labels, list[tuple[float, float]]] = defaultdict(list)
    sums: dict[Labels, float] = {}
    counts: dict[Labels, float] = {}
    for s in family.samples:
        if s.name.endswith("_bucket"):
            buckets[_labels(s.labels, "le")].append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_sum"):
            sums[_labels(s.labels)] = s.value
        elif s.name.endswith("_count"):
            counts[_labels(s.labels)] = s.value
    points = []
    for key, cumulative in buckets.items():
        cumulative.sort()
        bounds = [le for le, _ in cumulative if le != float("inf")]
        # Prometheus buckets are cumulative (le); OTLP's are per bucket, +Inf last.
        per_bucket, previous = [], 0.0
        for _, value in cumulative:
            per_bucket.append(int(value - previous))
            previous = value
        points.append(
            HistogramDataPoint(
                attributes=dict(key),
                start_time_unix_nano=start(key),
                time_unix_nano=now,
                count=int(counts.get(key, previous)),
                sum=sums.get(key, 0.0),
                bucket_counts=per_bucket,
                explicit_bounds=bounds,
                min=None,  # type: ignore[arg-type]  # Prometheus does not keep them
                max=None,  # type: ignore[arg-type]
            )
        )
    return points


def metrics_data(text: str, resource: Resource, now: int | None = None) -> MetricsData:
    """Prometheus text as OpenTelemetry metric data (counters, gauges, histograms)."""
    now = time.time_ns() if now is None else now
    families = {family.name: family for family in text_string_to_metric_families(text)}
    # The text format shows a counter's or histogram's creation time as a gauge of its own
    # (NAME_created): it is the start time of the cumulative series, not a metric.
    starts: dict[str, dict[Labels, int]] = defaultdict(dict)
    for name, family in list(families.items()):
        base = name.removesuffix("_created")
        if base != name and families.get(base, family).type in ("counter", "histogram"):
            del families[name]
            for sample in family.samples:
                starts[base][_labels(sample.labels)] = int(sample.value * 1e9)
    metrics = [_convert(family, starts[name], now) for name, family in families.items()]
    scope = ScopeMetrics(SCOPE, [m for m in metrics if m is not None], "")
    return MetricsData([ResourceMetrics(resource, [scope], "")])


class OtlpMetricsPusher(Service):
    name = "otlp-metrics"

    def __init__(
        self,
        service_name: str,
        metrics_text: MetricsText,
        *,
        exporter: MetricExporter | None = None,
        interval: float | None = None,
    ) -> None:
        super().__init__()
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter,
            )

            exporter = OTLPMetricExporter()
        self.exporter = exporter
        self.metrics_text = metrics_text
        env_ms = os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", "")
        self.interval = (
            interval
            if interval is not None
            else (int(env_ms) if env_ms.isdigit() else DEFAULT_INTERVAL_MS) / 1000
        )
        self.resource = Resource.create(
            {"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)}
        )
        self.failures = 0

    async def run(self) -> None:
        while not await self.sleep(self.interval):
            await self.push()
        await self.push()  # stopping: the final counts

    async def push(self) -> bool:
        error: str | None = None
        try:
            data = metrics_data(await self.metrics_text(), self.resource)
            result = await asyncio.to_thread(self.exporter.export, data)
            if result is not MetricExportResult.SUCCESS:
                error = result.name
        except Exception as exc:  # an unreachable collector must never stop the process
            error = f"{type(exc).__name__}: {exc}"
        if error is None:
            if self.failures:
                log.info("OTLP metrics export works again")
            self.failures = 0
            return True
        self.failures += 1
        if self.failures == 1:
            log.warning("OTLP metrics export failed; retrying", extra={"error": error})
        return False


def metrics_pusher(service_name: str, metrics_text: MetricsText) -> OtlpMetricsPusher | None:
    """The OTLP metrics service when the environment asks for it, else None."""
    return OtlpMetricsPusher(service_name, metrics_text) if metrics_export_wanted() else None
