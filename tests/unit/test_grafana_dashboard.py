"""The Grafana dashboard queries only metrics the processes expose, and covers the ones an
SRE needs (the list in docs/how-to/monitor.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

from prometheus_client import CollectorRegistry

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.usecases.backlog import BacklogGauges
from services.api.metrics import ApiMetrics
from services.relay.metrics import RelayMetrics
from services.worker.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "jobcore-dashboard.json"
MONITORING = ROOT / "docs" / "how-to" / "monitor.md"
METRIC = re.compile(r"\bjobcore_[a-z0-9_]+")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
}


def exposed_names() -> set[str]:
    """Every sample name the API, relay and worker metrics can expose."""
    backlog = CollectorRegistry()
    BacklogGauges(backlog, cast(Database, None), Topology("p"), ["default"], lambda: None)
    registries = [
        ApiMetrics(["echo"]).registry,
        RelayMetrics().registry,
        WorkerMetrics().registry,
        backlog,
    ]
    names: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    queries: list[str] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            queries.extend(target["expr"] for target in panel.get("targets", []))
            walk(panel.get("panels", []))

    walk(board["panels"])
    return queries


def test_every_queried_metric_is_exposed() -> None:
    queries = dashboard_queries()
    assert queries
    queried = {name for query in queries for name in METRIC.findall(query)}
    assert queried - exposed_names() == set()


def test_the_dashboard_covers_what_an_sre_needs() -> None:
    queried = {name for query in dashboard_queries() for name in METRIC.findall(query)}
    needed = {
        "jobcore_api_enqueue_requests_total",
        "jobcore_worker_jobs_completed_total",
        "jobcore_worker_job_attempts_bucket",
        "jobcore_worker_handler_seconds_bucket",
        "jobcore_worker_time_to_start_seconds_bucket",
        "jobcore_worker_time_to_complete_seconds_bucket",
        "jobcore_worker_retries_scheduled_total",
        "jobcore_worker_duplicate_messages_total",
        "jobcore_worker_dead_lettered_messages_total",
        "jobcore_worker_reaped_jobs_total",
        "jobcore_jobs_pending",
        "jobcore_relay_outbox_due_rows",
        "jobcore_relay_outbox_oldest_due_age_seconds",
        "jobcore_relay_outbox_quarantined_rows",
        "jobcore_relay_outbox_failing_rows",
        "jobcore_queue_messages",
        "jobcore_relay_published_messages_total",
        "jobcore_relay_batch_confirm_seconds_bucket",
        "jobcore_relay_publish_failures_total",
        "jobcore_relay_broker_reconnects_total",
    }
    assert needed - queried == set()


def test_panels_use_the_datasource_variable() -> None:
    board = json.loads(DASHBOARD.read_text())
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource"]
    for panel in board["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]


def declared_in_source() -> set[str]:
    """Metric names declared anywhere in the services and the library (other metrics,
    such as the webhook deliverer's, live outside the three metrics modules)."""
    names: set[str] = set()
    for path in [*ROOT.glob("services/**/*.py"), *ROOT.glob("libs/**/*.py")]:
        names.update(re.findall(r'"(jobcore_[a-z0-9_]+)"', path.read_text()))
    return names


def base_name(sample: str) -> str:
    return re.sub(r"_(total|bucket|sum|count|created)$", "", sample)


def test_the_operations_guide_names_only_exposed_metrics() -> None:
    section = MONITORING.read_text().split("\n## Traces", 1)[0]
    documented = set(METRIC.findall(section))
    assert documented, "the metrics section names no metric"
    known = exposed_names() | declared_in_source()
    assert {
        name for name in documented if name not in known and base_name(name) not in known
    } == set()
