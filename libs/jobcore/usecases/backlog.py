"""Backlog gauges computed when /metrics is scraped: open jobs per queue from PostgreSQL,
queue depth from RabbitMQ, and what keeps vacuum from cleaning up after them (the age of
the database's xmin horizon, the hot tables' dead rows).

A few statements (``open_jobs_by_queue``, ``database_xmin_horizon``, ``hot_table_tuples``)
and one passive declare per queue, at most once per ``cache_seconds`` however often
Prometheus (or several of them) scrape. A source that does not answer within ``timeout``
leaves its gauges at their last values and counts a failed refresh, so a scrape never hangs
on a database or broker that is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable

import aiormq
from aio_pika.abc import AbstractConnection
from prometheus_client import CollectorRegistry, Counter, Gauge

from jobcore.amqp.connection import BROKER_ERRORS
from jobcore.amqp.topology import WEBHOOKS_QUEUE, Topology
from jobcore.database.gateway import Database
from jobcore.database.store import database_store, flow_pause_store, job_store
from jobcore.database.table_names import HOT_TABLES
from jobcore.kernel.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

DEFAULT_CACHE_SECONDS = 1.0
DEFAULT_TIMEOUT = 2.0
_BROKER_REFRESH_ERRORS: tuple[type[BaseException], ...] = (TimeoutError, *BROKER_ERRORS)


class BacklogGauges:
    def __init__(
        self,
        registry: CollectorRegistry,
        db: Database,
        topology: Topology,
        queues: Iterable[str],
        broker: Callable[[], AbstractConnection | None],
        *,
        cache_seconds: float = DEFAULT_CACHE_SECONDS,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.db = db
        self.topology = topology
        self.queues = sorted({*queues, WEBHOOKS_QUEUE})
        self.broker = broker
        self.cache_seconds = cache_seconds
        self.timeout = timeout
        self._refreshed_at: float | None = None
        self._lock = asyncio.Lock()
        self.pending = Gauge(
            "jobcore_jobs_pending",
            "Jobs waiting to run (due or scheduled), per queue.",
            ["queue"],
            registry=registry,
        )
        self.running = Gauge(
            "jobcore_jobs_running",
            "Jobs running under a lease, per queue.",
            ["queue"],
            registry=registry,
        )
        self.queue_messages = Gauge(
            "jobcore_queue_messages",
            "Messages ready in the RabbitMQ queue of each job queue (not yet delivered).",
            ["queue"],
            registry=registry,
        )
        self.queue_consumers = Gauge(
            "jobcore_queue_consumers",
            "Consumers (worker channels) on the RabbitMQ queue of each job queue.",
            ["queue"],
            registry=registry,
        )
        self.dead_letters = Gauge(
            "jobcore_dead_letter_queue_messages",
            "Messages waiting in the dead-letter queue.",
            registry=registry,
        )
        self.paused = Gauge(
            "jobcore_paused",
            "1 for each queue or job type an operator paused (jobcore queues|types pause).",
            ["kind", "name"],
            registry=registry,
        )
        self.horizon_age = Gauge(
            "jobcore_database_xmin_horizon_age_seconds",
            "How long the oldest transaction holding back the database's xmin horizon has "
            "been open: vacuum cannot remove a row that died after it began.",
            registry=registry,
        )
        self.horizon_xids = Gauge(
            "jobcore_database_xmin_horizon_age_transactions",
            "Transactions since the database's xmin horizon (also a replication slot's).",
            registry=registry,
        )
        self.dead_tuples = Gauge(
            "jobcore_table_dead_tuples",
            "Dead row versions in each of jobcore's hot tables (pg_stat_user_tables).",
            ["table"],
            registry=registry,
        )
        self.live_tuples = Gauge(
            "jobcore_table_live_tuples",
            "Live rows in each of jobcore's hot tables (pg_stat_user_tables).",
            ["table"],
            registry=registry,
        )
        self.refresh_failures = Counter(
            "jobcore_backlog_refresh_failures",
            "Scrapes whose backlog source (database or broker) did not answer in time.",
            ["source"],
            registry=registry,
        )

    async def refresh(self) -> None:
        """Bring the gauges up to date unless they were refreshed within the cache time."""
        async with self._lock:  # concurrent scrapes share one refresh
            now = time.monotonic()
            if self._refreshed_at is not None and now - self._refreshed_at < self.cache_seconds:
                return
            self._refreshed_at = now
            await asyncio.gather(self._refresh_jobs(), self._refresh_queues())

    async def _refresh_jobs(self) -> None:
        try:
            async with asyncio.timeout(self.timeout), self.db.connection() as conn:
                rows = await job_store.count_open_by_queue(conn)
                pauses = await flow_pause_store.list_pauses(conn)
                horizon = await database_store.xmin_horizon(conn)
                tuples = await database_store.hot_table_tuples(conn, {"tables": list(HOT_TABLES)})
        except (DatabaseUnavailable, TimeoutError):
            self.refresh_failures.labels("database").inc()
            return
        counts = {queue: (0, 0) for queue in self.queues}
        for row in rows:
            counts[row["queue"]] = (int(row["pending"]), int(row["running"]))
        for queue, (pending, running) in counts.items():
            self.pending.labels(queue).set(pending)
            self.running.labels(queue).set(running)
        # A resumed one disappears from the scrape rather than staying at 0 for ever.
        self.paused.clear()
        for pause in pauses:
            self.paused.labels(pause["kind"], pause["name"]).set(1)
        assert horizon is not None  # aggregates without GROUP BY: one row
        self.horizon_age.set(float(horizon["seconds"]))
        self.horizon_xids.set(int(horizon["xids"]))
        for row in tuples:
            self.dead_tuples.labels(row["name"]).set(int(row["dead"]))
            self.live_tuples.labels(row["name"]).set(int(row["live"]))

    async def _refresh_queues(self) -> None:
        connection = self.broker()
        if connection is None:
            self.refresh_failures.labels("broker").inc()
            return
        try:
            async with asyncio.timeout(self.timeout):
                depths = await self._depths(connection)
        except _BROKER_REFRESH_ERRORS:
            self.refresh_failures.labels("broker").inc()
            return
        for queue, (messages, consumers) in depths.items():
            if queue is None:
                self.dead_letters.set(messages)
            else:
                self.queue_messages.labels(queue).set(messages)
                self.queue_consumers.labels(queue).set(consumers)

    async def _depths(self, connection: AbstractConnection) -> dict[str | None, tuple[int, int]]:
        """(messages, consumers) per job queue, and for the dead-letter queue (key None)."""
        names: dict[str | None, str] = {q: self.topology.queue_name(q) for q in self.queues}
        names[None] = self.topology.dead_letter_queue
        depths: dict[str | None, tuple[int, int]] = {}
        channel = await connection.channel(publisher_confirms=False)
        try:
            for queue, name in names.items():
                try:
                    declared = await channel.declare_queue(name, passive=True)
                except aiormq.exceptions.ChannelNotFoundEntity:
                    # Not declared yet; the failed declare closed the channel.
                    channel = await connection.channel(publisher_confirms=False)
                    continue
                result = declared.declaration_result
                depths[queue] = (int(result.message_count or 0), int(result.consumer_count or 0))
        finally:
            if not channel.is_closed:
                with contextlib.suppress(*BROKER_ERRORS):
                    await channel.close()
        return depths
