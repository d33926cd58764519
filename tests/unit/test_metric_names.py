"""Every metric jobcore exposes follows the Prometheus naming rules (promtool's lint rules
and units in names: tests/support/promlint.py), and the linter catches the names it should.

The e2e scrape test runs the same lint on the real processes' /metrics."""

from __future__ import annotations

from typing import cast

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.usecases.backlog import BacklogGauges
from services.api.metrics import ApiMetrics
from services.api.waiters import JobWaiters
from services.relay.metrics import RelayMetrics
from services.worker.metrics import WorkerMetrics
from services.worker.webhook_sender import WebhookDeliverer
from tests.support.promlint import lint


async def exposed_texts() -> dict[str, str]:
    """The exposition of every registry the API, relay and worker fill."""
    settings = Settings(environment="test")
    api = ApiMetrics(["echo"])
    JobWaiters(settings, registry=api.registry)
    worker = WorkerMetrics()
    webhooks = WebhookDeliverer(settings, cast(Database, None), worker)
    await webhooks.sender.close()
    backlog = CollectorRegistry()
    BacklogGauges(backlog, cast(Database, None), Topology("p"), ["default"], lambda: None)
    registries = {
        "api": api.registry,
        "relay": RelayMetrics().registry,
        "worker": worker.registry,
        "backlog": backlog,
    }
    return {role: generate_latest(registry).decode() for role, registry in registries.items()}


async def test_every_exposed_metric_is_well_named() -> None:
    texts = await exposed_texts()
    assert "jobcore_worker_webhook_attempts_total" in texts["worker"]
    assert "jobcore_api_long_poll_waiters" in texts["api"]
    assert {role: lint(text) for role, text in texts.items()} == {role: [] for role in texts}


def exposition(*metrics: tuple[type, str, str]) -> str:
    registry = CollectorRegistry()
    for kind, name, help_text in metrics:
        kind(name, help_text, registry=registry)
    return generate_latest(registry).decode()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (exposition((Histogram, "jobcore_batch_size", "x")), '"size" says no unit'),
        (exposition((Gauge, "jobcore_lag", "x")), '"lag" says no unit'),
        (exposition((Gauge, "jobcore_wait_minutes", "x")), 'use base unit "seconds"'),
        (exposition((Gauge, "jobcore_wait_milliseconds", "x")), 'instead of "milliseconds"'),
        (exposition((Gauge, "jobcore_wait_ms", "x")), "abbreviated units"),
        (exposition((Gauge, "jobcore_seconds_waited", "x")), "should end the name"),
        (exposition((Gauge, "jobcore_queue_gauge", "x")), 'include type "gauge"'),
        (exposition((Counter, "jobcore_things", "")), "no help text"),
        ("# HELP a_b x\n# TYPE a_b counter\na_b 1\n", 'counter metrics should have "_total"'),
        ("# HELP aB x\n# TYPE aB gauge\naB 1\n", "snake_case"),
        ('# HELP a x\n# TYPE a gauge\na{le="1"} 1\n', '"le" label outside a histogram'),
    ],
)
def test_the_lint_catches_badly_named_metrics(text: str, problem: str) -> None:
    found = lint(text)
    assert any(problem in line for line in found), found
