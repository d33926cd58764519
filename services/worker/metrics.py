"""The worker's counters and histograms, for /metrics (Prometheus) and /healthz (a JSON
snapshot of the counters).

Each worker gets its own collector registry, so several workers in one process (tests)
never collide on metric names. Job timings are measured on the worker's clock against the
database's ``created_at`` (clocks are assumed NTP-synchronised).
"""

from __future__ import annotations

import collections
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from jobcore.kernel.states import TERMINAL
from jobcore.maintenance.retention import TABLES as PRUNED_TABLES

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from jobcore.execution.claims import ClaimedJob
    from jobcore.maintenance.periodic import Schedule
    from jobcore.maintenance.retention import Kind
    from jobcore.maintenance.schedule_ticks import ScheduleRound, ScheduleState

ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 7, 10, 15, 20, 25, 50, 100)
# Handlers take milliseconds to many minutes; waiting covers up to hours (backoff, backlog).
RUNTIME_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1800,
)
WAIT_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
    1800,
    3600,
    7200,
    21600,
)


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
        self._parked = Counter(
            "jobcore_worker_parked_messages",
            "Messages of a paused queue or job type, parked back in the outbox unclaimed.",
            registry=self.registry,
        )
        self._held = Counter(
            "jobcore_worker_held_messages",
            "New messages whose job a gate held (reason: concurrency, rate_limit, ordering): "
            "acknowledged, the job left pending for the gate releaser.",
            ["reason"],
            registry=self.registry,
        )
        self._released = Counter(
            "jobcore_worker_released_jobs",
            "Held jobs the gate releaser published again.",
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
        self._rescued = Counter(
            "jobcore_worker_rescued_jobs",
            "Pending jobs that could never run (their message was quarantined), failed by the "
            "rescuer.",
            ["reason"],
            registry=self.registry,
        )
        self.running_handlers = Gauge(
            "jobcore_worker_running_handlers",
            "Handlers running now.",
            registry=self.registry,
        )
        self._completed = Counter(
            "jobcore_worker_jobs_completed",
            "Jobs this worker ended, by type and final status (succeeded, failed, cancelled).",
            ["type", "status"],
            registry=self.registry,
        )
        self._attempts = Histogram(
            "jobcore_worker_job_attempts",
            "Attempts a job took, observed when a worker ends it.",
            ["type"],
            buckets=ATTEMPT_BUCKETS,
            registry=self.registry,
        )
        self._handler_seconds = Histogram(
            "jobcore_worker_handler_seconds",
            "How long a handler ran (one attempt), whatever its outcome.",
            ["type"],
            buckets=RUNTIME_BUCKETS,
            registry=self.registry,
        )
        self._time_to_start = Histogram(
            "jobcore_worker_time_to_start_seconds",
            "From a job's creation (or the time it was scheduled for) to its first claim.",
            ["type"],
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self._time_to_complete = Histogram(
            "jobcore_worker_time_to_complete_seconds",
            "From a job's creation to the worker recording its final status.",
            ["type"],
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        # Retention (the pruner). Every worker's pruner refreshes the gauges each round,
        # leader or not, so they are current wherever they are scraped: aggregate with max.
        self._pruned = Counter(
            "jobcore_worker_pruned_rows",
            "Rows the pruner deleted, by table (result files count as table result_files).",
            ["table"],
            registry=self.registry,
        )
        self._oldest_terminal = Gauge(
            "jobcore_oldest_terminal_job_age_seconds",
            "How long ago the oldest finished job still kept finished, by status (0: none).",
            ["status"],
            registry=self.registry,
        )
        self._prune_overdue = Gauge(
            "jobcore_prune_overdue_seconds",
            "How far past its retention the most overdue finished job is (0: none is): "
            "rising means the pruner is not keeping up.",
            registry=self.registry,
        )
        # The compactor (jobcore.maintenance.compactor): only the maintenance leader counts.
        self._compactions = Counter(
            "jobcore_worker_compactions",
            "Hot-table compactions after a pinned xmin horizon, by table and outcome: done, "
            "lock_timeout (gave up waiting for the lock), too_slow (rolled back past "
            "JOBCORE_COMPACT_MAX_SECONDS), failed.",
            ["table", "outcome"],
            registry=self.registry,
        )
        self._compacted_bytes = Counter(
            "jobcore_worker_compacted_bytes",
            "Bytes of disk the compactor gave back, by table.",
            ["table"],
            registry=self.registry,
        )
        self._compaction_lock = Histogram(
            "jobcore_worker_compaction_lock_seconds",
            "How long each compaction waited for its table's exclusive lock (phase wait) and "
            "held it (phase held): every statement on the table waits that long.",
            ["phase"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10),
            registry=self.registry,
        )
        self._overdue_queues: set[str] = set()
        for table in PRUNED_TABLES:
            self._pruned.labels(table)
        for status in sorted(TERMINAL):
            self._oldest_terminal.labels(status).set(0)
        # Every delivery is settled even after an unexpected error; each such error is
        # counted by where it struck, since no job row records it. And whether a consumer
        # is stuck, which is also what /readyz answers.
        self._delivery_errors = Counter(
            "jobcore_worker_delivery_errors",
            "Deliveries that met an unexpected error, by stage: before_claim (requeued), "
            "after_claim (acknowledged; the attempt failed), webhook (requeued).",
            ["stage"],
            registry=self.registry,
        )
        self.stalled = Gauge(
            "jobcore_worker_stalled",
            "1 while a consumer of this worker cannot make progress (its /readyz is 503).",
            registry=self.registry,
        )
        self.counts: collections.Counter[str] = collections.Counter()
        # For alerts (deploy/prometheus/alerts.yaml): a queue with ready messages whose
        # deliveries stopped, and due jobs that wait too long.
        self._deliveries = Counter(
            "jobcore_worker_deliveries",
            "Messages the broker delivered to this worker, by job queue (webhooks: the "
            "webhook queue), whatever became of them.",
            ["queue"],
            registry=self.registry,
        )
        self._taken_from_outbox = Counter(
            "jobcore_worker_outbox_pickups",
            "Outbox rows this worker took itself while its handlers were idle (direct pickup, "
            "JOBCORE_DIRECT_PICKUP), unpublished, by job queue (unclaimed: rows whose job was "
            "held, parked or not claimable).",
            ["queue"],
            registry=self.registry,
        )
        self._overdue = Gauge(
            "jobcore_jobs_overdue_seconds",
            "How long the longest-waiting due pending job of each queue has been due (0: "
            "none), not counting jobs a gate holds; surveyed each sweeper round by the "
            "sweeper's lease holder (0 on the other workers): aggregate with max.",
            ["queue"],
            registry=self.registry,
        )
        # Anti-entropy (jobcore.maintenance.stranded): the sweeper and the dead-letter notes.
        self._republished = Counter(
            "jobcore_worker_republished_jobs",
            "Pending jobs whose message was published again by the sweeper, by reason "
            "(stale: no sign of it for the staleness; dead_lettered: the broker dead-lettered it).",
            ["reason"],
            registry=self.registry,
        )
        self._broker_dead_letters = Counter(
            "jobcore_worker_broker_dead_letters",
            "Messages the broker dead-lettered (not those a worker rejected), by RabbitMQ's "
            "reason: delivery_limit, expired, maxlen.",
            ["reason"],
            registry=self.registry,
        )

    def processed(self, outcome: str, job: ClaimedJob | None = None) -> None:
        """An attempt ended with ``outcome``; a final status also completes the job."""
        self._processed.labels(outcome).inc()
        self.counts[f"processed.{outcome}"] += 1
        # `processed` outcomes other than the terminal statuses are not the end.
        if job is not None and outcome in TERMINAL:
            job_type = job.job_type.name
            self._completed.labels(job_type, outcome).inc()
            self._attempts.labels(job_type).observe(job.attempt)
            if job.created_at is not None:
                age = (datetime.now(UTC) - job.created_at).total_seconds()
                self._time_to_complete.labels(job_type).observe(max(age, 0.0))

    def started(self, job: ClaimedJob) -> None:
        """A job's first attempt was claimed."""
        if job.attempt == 1 and job.due_at is not None:
            waited = (datetime.now(UTC) - job.due_at).total_seconds()
            self._time_to_start.labels(job.job_type.name).observe(max(waited, 0.0))

    def handler_ran(self, job_type: str, seconds: float) -> None:
        self._handler_seconds.labels(job_type).observe(seconds)

    def duplicate(self) -> None:
        self._duplicates.inc()
        self.counts["duplicates"] += 1

    def skipped(self) -> None:
        self._skipped.inc()
        self.counts["skipped"] += 1

    def parked(self) -> None:
        self._parked.inc()
        self.counts["parked"] += 1

    def held(self, reason: str) -> None:
        self._held.labels(reason).inc()
        self.counts[f"held.{reason}"] += 1

    def released(self, count: int) -> None:
        self._released.inc(count)
        self.counts["released"] += count

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

    def rescued(self, reason: str, count: int = 1) -> None:
        self._rescued.labels(reason).inc(count)
        self.counts[f"rescued.{reason}"] += count

    def compacted(
        self, table: str, outcome: str, *, freed: int, lock_wait: float, lock_held: float
    ) -> None:
        """A compaction ended (or gave up): its outcome, what it gave back, its lock."""
        self._compactions.labels(table, outcome).inc()
        self.counts[f"compacted.{table}.{outcome}"] += 1
        if freed:
            self._compacted_bytes.labels(table).inc(freed)
        self._compaction_lock.labels("wait").observe(lock_wait)
        if outcome == "done" or lock_held > 0:
            self._compaction_lock.labels("held").observe(lock_held)

    def pruned(self, counts: Mapping[str, int]) -> None:
        """A pruner batch committed: rows (and result files) deleted, by table."""
        for table, count in counts.items():
            if count:
                self._pruned.labels(table).inc(count)
                self.counts[f"pruned.{table}"] += count

    def surveyed(self, kinds: Sequence[Kind]) -> None:
        """The finished jobs as a pruner round left them."""
        for status in sorted(TERMINAL):
            ages = [kind.oldest_age for kind in kinds if kind.status == status]
            self._oldest_terminal.labels(status).set(max(ages, default=0.0))
        self._prune_overdue.set(max((kind.overdue for kind in kinds), default=0.0))

    def consuming(self, queues: Iterable[str]) -> None:
        """Start these queues' delivery counts at zero, so rate() reads 0, not no data."""
        for queue in queues:
            self._deliveries.labels(queue)

    def delivered(self, queue: str) -> None:
        self._deliveries.labels(queue).inc()

    def taken_from_outbox(self, queue: str) -> None:
        self._taken_from_outbox.labels(queue).inc()
        self.counts["taken_from_outbox"] += 1

    def overdue(self, seconds_by_queue: Mapping[str, float]) -> None:
        """The sweeper's survey: a queue no longer listed reads 0."""
        for queue in self._overdue_queues - seconds_by_queue.keys():
            self._overdue.labels(queue).set(0)
        for queue, seconds in seconds_by_queue.items():
            self._overdue.labels(queue).set(seconds)
        self._overdue_queues |= seconds_by_queue.keys()

    def republished(self, reason: str, count: int = 1) -> None:
        self._republished.labels(reason).inc(count)
        self.counts[f"republished.{reason}"] += count

    def broker_dead_letter(self, reason: str) -> None:
        self._broker_dead_letters.labels(reason).inc()
        self.counts[f"broker_dead_letters.{reason}"] += 1

    def delivery_error(self, stage: str) -> None:
        self._delivery_errors.labels(stage).inc()
        self.counts[f"delivery_errors.{stage}"] += 1

    def snapshot(self) -> dict[str, Any]:
        return dict(sorted(self.counts.items()))

    def render(self) -> str:
        return generate_latest(self.registry).decode()


class SchedulerMetrics:
    """The scheduler's instruments, on the worker's collector registry: made only when
    schedules are declared (the scheduler runs only then)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._enqueued = Counter(
            "jobcore_schedule_jobs_enqueued",
            "Jobs enqueued for schedule ticks, by schedule (the scheduler lease's holder).",
            ["schedule"],
            registry=registry,
        )
        self._skipped = Counter(
            "jobcore_schedule_ticks_skipped",
            "Missed ticks the missed-tick policy left out, by schedule (at least).",
            ["schedule"],
            registry=registry,
        )
        self._refused = Counter(
            "jobcore_schedule_enqueue_refusals",
            "Schedule ticks the enqueue refused, by schedule and reason (unique_key, "
            "enqueue_rate, max_unfinished): each made no job and is not tried again.",
            ["schedule", "reason"],
            registry=registry,
        )
        self._next_tick = Gauge(
            "jobcore_schedule_next_tick_timestamp_seconds",
            "When the schedule's next tick is due (Unix time; 0 while paused).",
            ["schedule"],
            registry=registry,
        )
        self._last_tick = Gauge(
            "jobcore_schedule_last_tick_timestamp_seconds",
            "The latest tick enqueued (Unix time; before the first, when the schedule was "
            "first seen).",
            ["schedule"],
            registry=registry,
        )
        self._paused = Gauge(
            "jobcore_schedule_paused",
            "1 while the schedule is paused (jobcore schedules pause).",
            ["schedule"],
            registry=registry,
        )

    def round(self, done: ScheduleRound) -> None:
        made = sum(1 for tick in done.enqueued if tick.job_id is not None and not tick.replayed)
        if made:
            self._enqueued.labels(done.name).inc(made)
        if done.skipped:
            self._skipped.labels(done.name).inc(done.skipped)
        for tick in done.enqueued:
            if tick.refusal is not None:
                self._refused.labels(done.name, tick.refusal).inc()

    def states(
        self, schedules: Sequence[Schedule], states: dict[str, ScheduleState], now: datetime
    ) -> None:
        for schedule in schedules:
            state = states.get(schedule.name)
            if state is None:
                continue
            upcoming = None if state.paused else schedule.next_tick(max(state.last_tick, now))
            self._next_tick.labels(schedule.name).set(upcoming.timestamp() if upcoming else 0)
            self._last_tick.labels(schedule.name).set(state.last_tick.timestamp())
            self._paused.labels(schedule.name).set(1 if state.paused else 0)
