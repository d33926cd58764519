"""The relay's Prometheus metrics, in one registry per relay (tests run several at once)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

BATCH_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class RelayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.published = Counter(
            "jobcore_relay_published_messages",
            "Outbox messages the broker confirmed and the relay marked done.",
            registry=r,
        )
        self.failed = Counter(
            "jobcore_relay_publish_failures",
            "Messages not published, by reason: refused by the broker (nacked, returned, "
            "no_exchange: retried until taken), never publishable (malformed, too_large: "
            "quarantined), unexpected (retried up to the max publish attempts).",
            ["reason"],
            registry=r,
        )
        self.quarantined = Counter(
            "jobcore_relay_quarantined_rows",
            "Outbox rows quarantined: their message can never be published as it is.",
            registry=r,
        )
        self.topology_declares = Counter(
            "jobcore_relay_topology_declares",
            "Topology declared again after a return for a route this relay declares "
            "(result: declared, failed); throttled to one per redeclare interval.",
            ["result"],
            registry=r,
        )
        self.unconfirmed = Counter(
            "jobcore_relay_unconfirmed_messages",
            "Messages whose confirm never came (connection lost); published again later.",
            registry=r,
        )
        self.already_gone = Counter(
            "jobcore_relay_rows_already_gone",
            "Confirmed rows that were no longer in the outbox when marked done.",
            registry=r,
        )
        self.reconnects = Counter(
            "jobcore_relay_broker_reconnects",
            "Broker connections re-established after a loss.",
            registry=r,
        )
        self.queue_full = Counter(
            "jobcore_relay_queue_full",
            "Looks at a broker queue that found it too full for a batch (at its depth limit, "
            "JOBCORE_RELAY_QUEUE_DEPTH_LIMIT): its rows waited in the outbox, by queue.",
            ["queue"],
            registry=r,
        )
        self.confirm_latency = Histogram(
            "jobcore_relay_batch_confirm_seconds",
            "From the first publish of a batch to its last confirm.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "jobcore_relay_batch_rows",
            "Rows claimed per batch.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.broker_connected = Gauge(
            "jobcore_relay_broker_connected", "1 while the broker connection is up.", registry=r
        )
        self.backlog_due = Gauge(
            "jobcore_relay_outbox_due_rows", "Outbox rows due for publishing.", registry=r
        )
        self.backlog_quarantined = Gauge(
            "jobcore_relay_outbox_quarantined_rows", "Quarantined outbox rows.", registry=r
        )
        self.backlog_failing = Gauge(
            "jobcore_relay_outbox_failing_rows",
            "Outbox rows the broker refused at least once and that are still retried.",
            registry=r,
        )
        self.longest_failing = Gauge(
            "jobcore_relay_outbox_longest_failing_seconds",
            "How long the longest-failing outbox row has been refused (since its first refusal).",
            registry=r,
        )
        self.oldest_due_age = Gauge(
            "jobcore_relay_outbox_oldest_due_age_seconds",
            "How long the oldest due outbox row has been waiting.",
            registry=r,
        )

    def observe_backlog(self, backlog: dict[str, Any]) -> None:
        self.backlog_due.set(backlog["due"])
        self.backlog_quarantined.set(backlog["quarantined"])
        self.backlog_failing.set(backlog["failing"])
        self.longest_failing.set(backlog["longest_failing_seconds"])
        self.oldest_due_age.set(backlog["oldest_due_age_seconds"])

    def render(self) -> str:
        return generate_latest(self.registry).decode()
