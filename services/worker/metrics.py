"""The worker's counters, for /metrics (Prometheus) and /healthz (a JSON snapshot).

Each worker gets its own collector registry, so several workers in one process (tests)
never collide on metric names. The observability issue adds histograms here.
"""

from __future__ import annotations

import collections
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class WorkerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._processed = Counter(
            "jobcore_worker_jobs_processed",
            "Attempts that ended, by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        self._duplicates = Counter(
            "jobcore_worker_duplicate_messages",
            "Messages already in the inbox (redelivered or re-published), acknowledged.",
            registry=self.registry,
        )
        self._skipped = Counter(
            "jobcore_worker_skipped_messages",
            "New messages whose job was not claimable (finished, running, cancelled, stale).",
            registry=self.registry,
        )
        self._dead_lettered = Counter(
            "jobcore_worker_dead_lettered_messages",
            "Messages rejected to the dead-letter queue, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self._retries = Counter(
            "jobcore_worker_retries_scheduled",
            "Failed attempts that were scheduled to run again.",
            registry=self.registry,
        )
        self._reaped = Counter(
            "jobcore_worker_reaped_jobs",
            "Jobs whose lease expired, by what the reaper did with them.",
            ["outcome"],
            registry=self.registry,
        )
        self.running_handlers = Gauge(
            "jobcore_worker_running_handlers",
            "Handlers running now.",
            registry=self.registry,
        )
        self.counts: collections.Counter[str] = collections.Counter()

    def processed(self, outcome: str) -> None:
        self._processed.labels(outcome).inc()
        self.counts[f"processed.{outcome}"] += 1

    def duplicate(self) -> None:
        self._duplicates.inc()
        self.counts["duplicates"] += 1

    def skipped(self) -> None:
        self._skipped.inc()
        self.counts["skipped"] += 1

    def dead_lettered(self, reason: str) -> None:
        self._dead_lettered.labels(reason).inc()
        self.counts[f"dead_lettered.{reason}"] += 1
        self.counts["dead_lettered"] += 1

    def retry_scheduled(self) -> None:
        self._retries.inc()
        self.counts["retries"] += 1

    def reaped(self, outcome: str, count: int = 1) -> None:
        self._reaped.labels(outcome).inc(count)
        self.counts[f"reaped.{outcome}"] += count

    def snapshot(self) -> dict[str, Any]:
        return dict(sorted(self.counts.items()))

    def render(self) -> str:
        return generate_latest(self.registry).decode()
