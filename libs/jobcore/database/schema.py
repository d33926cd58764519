"""SQLAlchemy Core metadata: the contract of every table jobcore owns.

Alembic targets this metadata and a test checks the migrated schema has no drift from it.
Runtime SQL lives in :mod:`jobcore.database.sql`, written out as named statements.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from jobcore.database.table_names import HOT_TABLES as HOT_TABLES
from jobcore.kernel.priorities import DEFAULT_PRIORITY, Priority
from jobcore.kernel.scopes import DEFAULT_SCOPES, Scope
from jobcore.kernel.states import TERMINAL, JobStatus

metadata = MetaData(
    naming_convention={
        "ix": "%(table_name)s_%(column_0_N_name)s_idx",
        "uq": "%(table_name)s_%(column_0_N_name)s_key",
        "ck": "%(table_name)s_%(constraint_name)s_check",
        "fk": "%(table_name)s_%(column_0_name)s_fkey",
        "pk": "%(table_name)s_pkey",
    }
)

_STATUSES = ", ".join(f"'{s.value}'" for s in JobStatus)
_PRIORITY_RANGE = f"priority BETWEEN {int(min(Priority))} AND {int(max(Priority))}"
_TERMINAL_STATUSES = "'succeeded', 'failed', 'cancelled'"
# The longest progress message, in characters: what a handler's ``ctx.progress`` accepts
# (jobcore.execution.progress, which the database may not import; a unit test keeps the
# two equal).
PROGRESS_MESSAGE_MAX_CHARS = 500

# The statuses a unique key is held in: every status but the terminal ones, so each
# statement that ends a job frees its key by the same write (jobcore.kernel.states.TERMINAL).
_LIVE_STATUSES = ", ".join(f"'{s.value}'" for s in JobStatus if s not in TERMINAL)


def _timestamp(name: str, *, nullable: bool = True, default_now: bool = False) -> Column[object]:
    return Column(
        name,
        DateTime(timezone=True),
        nullable=nullable,
        server_default=func.now() if default_now else None,
    )


def _timestamp_clock(name: str) -> Column[object]:
    """A timestamp of the moment the row is written (not the transaction's start)."""
    return Column(
        name, DateTime(timezone=True), nullable=False, server_default=func.clock_timestamp()
    )


jobs = Table(
    "jobs",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column("queue", Text, nullable=False),
    Column("status", Text, nullable=False, server_default=JobStatus.PENDING.value),
    Column("idempotency_key", Text),
    Column("payload_fingerprint", Text),
    # Small inputs inline; large ones live in object storage and payload_ref holds the key.
    Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("payload_ref", Text),
    Column("result", JSONB),
    Column("result_ref", Text),
    Column("entity_id", Text),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False, server_default=text("5")),
    # jobcore.kernel.priorities: the job type's default unless the request named one; copied onto
    # every outbox message of the job, where the relay's claim orders by it.
    Column(
        "priority", SmallInteger, nullable=False, server_default=text(str(int(DEFAULT_PRIORITY)))
    ),
    Column("last_error", Text),
    # The fence: every write after the claim names the lease token it holds.
    Column("lease_token", UUID(as_uuid=True)),
    _timestamp("lease_expires_at"),
    Column("worker_id", Text),
    _timestamp("cancel_requested_at"),
    _timestamp("next_attempt_at"),
    Column("traceparent", Text),
    Column("tracestate", Text),
    # Where the job's completion webhook goes (given at enqueue, or the tenant's default
    # endpoint for the type); NULL: no webhook.
    Column("callback_url", Text),
    _timestamp("created_at", nullable=False, default_now=True),
    _timestamp("updated_at", nullable=False, default_now=True),
    _timestamp("started_at"),
    _timestamp("finished_at"),
    # Anti-entropy (jobcore.maintenance.stranded): what was last noticed about the job's
    # message (the broker dead-lettered it, the sweeper published it again), as JSON, kept
    # apart from last_error so a failed attempt's real error survives; and how many times
    # the sweeper published it again, which spaces out its next republish.
    Column("message_note", JSONB),
    # What the job's `accepted` event says (its run_at, the schedule that fired it, a
    # batch), NULL when nothing: the job row is that event, read with created_at by the
    # timeline (jobcore.database.sql.job_events.JOB_TIMELINE), not a job_events row on the hot path.
    Column("accepted_detail", JSONB),
    Column("republish_count", Integer, nullable=False, server_default=text("0")),
    # What the running handler last reported (``ctx.progress``), written by its worker under
    # its lease, at most a few times a second (jobcore.execution.progress_reports); the
    # attempt that reported it, so a retry's reader can tell an older attempt's progress.
    Column("progress_fraction", Float),
    Column("progress_message", Text),
    Column("progress_attempt", Integer),
    _timestamp("progress_updated_at"),
    # At most one live job per (tenant, type, unique key): the request's unique_key, or
    # the value of the payload field its job type names (jobcore.execution.registry). NULL: none.
    Column("unique_key", Text),
    # Flow control (jobcore.kernel.gates), resolved at enqueue from the type's declaration and
    # the payload: the gates the claim checks. A pending job a gate held says why and
    # since when (NULL once it is released or claimed).
    Column("concurrency_key", Text),
    Column("concurrency_limit", Integer),
    Column("rate_key", Text),
    Column("rate_per_second", Float),
    Column("rate_burst", Integer),
    Column("ordering_key", Text),
    # The job's place in its ordering key (per tenant), taken from the key's job_gates
    # counter by the enqueue statement, so places follow commit order.
    Column("ordering_seq", BigInteger),
    # Whether this job, once failed, keeps the later jobs of its key waiting.
    Column("ordering_blocks", Boolean, nullable=False, server_default=text("true")),
    Column("held_reason", Text),
    _timestamp("held_since"),
    # Times an object-store outage gave the job back without spending an attempt
    # (jobcore.execution.outcomes.GiveBack): past JOBCORE_MAX_STORE_GIVE_BACKS an outage counts.
    Column("store_give_backs", Integer, nullable=False, server_default=text("0")),
    # Times its handler snoozed it (jobcore.execution.outcomes.Snooze): pending again later
    # without spending an attempt, up to its type's cap.
    Column("snoozes", Integer, nullable=False, server_default=text("0")),
    # The earliest its next claim may happen, set by a snooze and by an edit of its run_at
    # (jobcore.usecases.job_edits): a message of its attempt that arrives before claims
    # nothing (a copy published earlier, a message an edit superseded). Cleared by the claim.
    _timestamp("not_before"),
    # Debounce and throttle by key (jobcore.kernel.keyed): the key the job was written for,
    # how many enqueues a debounced job coalesced (1 when it was written), and, for a type
    # debounced with payloads="all", each of their payloads in enqueue order.
    Column("debounce_key", Text),
    Column("debounce_count", Integer),
    Column("debounce_payloads", JSONB),
    # The batch the job is a member of (batches.id), NULL for most jobs. No foreign key:
    # a key would lock the batch row for every member's insert and outcome; the pruner
    # removes a batch with its members (jobcore.database.sql.batches).
    Column("batch_id", UUID(as_uuid=True)),
    # The workflow the job is a step of (jobcore.usecases.workflows), NULL for a job on its
    # own. A step whose dependencies are not settled yet is pending and held for
    # 'dependencies', with no outbox message, until the settle of its last dependency
    # publishes it (migration 0031's trigger).
    Column("workflow_id", UUID(as_uuid=True)),
    # The claim of the job's current attempt, which the timeline lists as its `claimed`
    # event (jobcore.kernel.jobevents.with_claims) instead of an event row per attempt: the
    # lease it took, and when, for every claim but the first (whose time is started_at;
    # NULL then, so the happy path's row is no wider for it). Kept once the job ends; the
    # event that moves the job on to another attempt carries it (detail.claim).
    _timestamp("claimed_at"),
    _timestamp("claim_lease_until"),
    # The publish of the job's first attempt's message, which the timeline lists as its
    # `published` event (jobcore.kernel.jobevents.with_job_row) instead of an event row
    # (migration 0041): when its relay took the outbox row (the start of its claiming
    # transaction), which relay, and the message. The relay says them in the message's
    # headers (PUBLISHED_HEADER) and the worker's claim, which writes this row anyway,
    # keeps the first it is handed; every other publish is still an event row.
    _timestamp("published_at"),
    Column("published_by", Text),
    Column("published_message_id", UUID(as_uuid=True)),
    # A job of a batch enqueue: true, else NULL. Its `accepted` event says `batch` from
    # this, not from accepted_detail's JSON (migration 0045).
    Column("accepted_in_batch", Boolean),
    CheckConstraint(f"status IN ({_STATUSES})", name="status"),
    CheckConstraint(
        "held_reason IN ('concurrency', 'rate_limit', 'ordering', 'dependencies')",
        name="held_reason",
    ),
    CheckConstraint("attempts >= 0 AND max_attempts >= 1", name="attempts"),
    CheckConstraint(_PRIORITY_RANGE, name="priority"),
    CheckConstraint("progress_fraction >= 0 AND progress_fraction <= 1", name="progress_fraction"),
    CheckConstraint(
        f"char_length(progress_message) <= {PROGRESS_MESSAGE_MAX_CHARS}", name="progress_message"
    ),
    Index(
        "jobs_idempotency_uidx",
        "tenant",
        "type",
        "idempotency_key",
        unique=True,
        postgresql_where=text("idempotency_key IS NOT NULL"),
    ),
    # The unique-jobs rule, enforced by the enqueue statement's ON CONFLICT: race-free
    # across API processes, and released by whatever write makes the job terminal.
    Index(
        "jobs_unique_uidx",
        "tenant",
        "type",
        "unique_key",
        unique=True,
        postgresql_where=text(f"unique_key IS NOT NULL AND status IN ({_LIVE_STATUSES})"),
    ),
    # Jobs of a status across tenants, oldest or newest first (the console's lists, the
    # sweeper's old pending jobs). Not the running ones (migration 0042): a claim's new row
    # version, which matches no other predicate of this index, writes it no entry; running
    # jobs are found through jobs_lease_expiry_idx, and there are as many as the workers run.
    Index(
        "jobs_status_created_not_running_idx",
        "status",
        "created_at",
        postgresql_where=text("status <> 'running'"),
    ),
    # An entity's jobs, newest first. Partial (migration 0028): most jobs name no entity,
    # and each status change of a job writes a new entry to every index that holds it.
    Index(
        "jobs_entity_created_idx",
        "tenant",
        "entity_id",
        text("created_at DESC"),
        postgresql_where=text("entity_id IS NOT NULL"),
    ),
    # Keyset pagination of a tenant's jobs, newest first: read backwards. Ascending, so a
    # tenant's new jobs go to the right end of its range and fill its pages (migration
    # 0043).
    Index("jobs_tenant_created_idx", "tenant", "created_at", "id"),
    Index(
        "jobs_lease_expiry_idx",
        "lease_expires_at",
        postgresql_where=text("status = 'running'"),
    ),
    # The pruner's: each (status, type) retention rule is one range scan of it, and its
    # (status, type) pairs are found by a loose scan (jobcore.database.sql.jobs.prune). Partial, so
    # a job enters it once, when it finishes; the pending/running churn never touches it.
    Index(
        "jobs_finished_idx",
        "status",
        "type",
        "finished_at",
        postgresql_where=text(f"status IN ({_TERMINAL_STATUSES})"),
    ),
    # The claim's gate checks: the jobs before one in its ordering key, the running jobs
    # of a concurrency key; and the gate releaser's scan of held jobs.
    Index(
        "jobs_ordering_idx",
        "tenant",
        "ordering_key",
        "ordering_seq",
        postgresql_where=text("ordering_key IS NOT NULL"),
    ),
    Index(
        "jobs_concurrency_running_idx",
        "concurrency_key",
        postgresql_where=text("status = 'running' AND concurrency_key IS NOT NULL"),
    ),
    Index(
        "jobs_held_idx",
        "held_since",
        postgresql_where=text("status = 'pending' AND held_reason IS NOT NULL"),
    ),
    # The overdue gauge's (migration 0025): pending jobs no gate holds, by queue and due
    # time, so each queue's longest-waiting job is its first entry. Partial: a job is in it
    # while it waits, not for its whole life.
    Index(
        "jobs_due_idx",
        "queue",
        text("greatest(created_at, next_attempt_at)"),
        postgresql_where=text("status = 'pending' AND held_reason IS NULL"),
    ),
    # The gate releaser's (migration 0022): the keys that have held jobs, and each key's
    # held jobs oldest first, so a round reads what it can release, not all that is held;
    # and an ordering key's blocking jobs, whose first entry says whether its next may go.
    Index(
        "jobs_held_concurrency_idx",
        "concurrency_key",
        "created_at",
        "id",
        postgresql_where=text("status = 'pending' AND held_reason = 'concurrency'"),
    ),
    Index(
        "jobs_held_rate_idx",
        "rate_key",
        "created_at",
        "id",
        postgresql_where=text("status = 'pending' AND held_reason = 'rate_limit'"),
    ),
    Index(
        "jobs_held_ordering_idx",
        "tenant",
        "ordering_key",
        "ordering_seq",
        postgresql_where=text("status = 'pending' AND held_reason = 'ordering'"),
    ),
    # A batch's members by status (migration 0032): its failed members for the callbacks
    # and GET /batches/{id}, its unsettled ones for a cancel, all of them for the pruner.
    # Partial: most jobs are in no batch.
    Index(
        "jobs_batch_idx",
        "batch_id",
        "status",
        postgresql_where=text("batch_id IS NOT NULL"),
    ),
    # A workflow's steps (its reads, cancel, retention). Partial: a job on its own is not in it.
    Index(
        "jobs_workflow_idx",
        "workflow_id",
        postgresql_where=text("workflow_id IS NOT NULL"),
    ),
    Index(
        "jobs_ordering_blocking_idx",
        "tenant",
        "ordering_key",
        "ordering_seq",
        postgresql_where=text(
            "ordering_key IS NOT NULL AND (status IN ('pending', 'running') "
            "OR (status = 'failed' AND ordering_blocks))"
        ),
    ),
)

# Batches (jobcore.usecases.batches): a group of jobs, and of child batches, with callbacks
# that fire once when the group's outcome is known. The counters are of direct members
# (a child batch counts as one), kept by the batch_* trigger on jobs (migrations 0032,
# 0037) in the transaction of each member's outcome, under this row's lock: the row is
# updated once per outcome statement that settles members of it, so it is kept narrow
# (every update writes a whole new version, and a held xmin horizon keeps them all); what
# is written once lives in batch_callbacks.
batches = Table(
    "batches",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("parent_id", UUID(as_uuid=True), ForeignKey("batches.id", ondelete="CASCADE")),
    Column("total", Integer, nullable=False, server_default=text("0")),
    Column("succeeded", Integer, nullable=False, server_default=text("0")),
    Column("failed", Integer, nullable=False, server_default=text("0")),
    Column("cancelled", Integer, nullable=False, server_default=text("0")),
    # The first member that failed for good (a job of a child batch included): what
    # on_death names, kept once recorded even if that member is retried.
    Column("first_death_job_id", UUID(as_uuid=True)),
    # Whether each event has happened (its callback, if any, fired then): each once.
    Column("success_fired", Boolean, nullable=False, server_default=text("false")),
    Column("complete_fired", Boolean, nullable=False, server_default=text("false")),
    Column("death_fired", Boolean, nullable=False, server_default=text("false")),
    _timestamp("created_at", nullable=False, default_now=True),
    # Sealed: no member may join; callbacks may fire.
    _timestamp("closed_at"),
    _timestamp("cancelled_at"),
    # Closed with every member settled; NULL again while a retried member runs.
    _timestamp("settled_at"),
    Column("description", Text),
    # When a member last joined it while open (NULL: none since its creation, or written
    # by code before migration 0037): the pruner closes an open batch idle for
    # JOBCORE_BATCH_OPEN_TIMEOUT.
    _timestamp("grown_at"),
    CheckConstraint(
        "total >= 0 AND succeeded >= 0 AND failed >= 0 AND cancelled >= 0 "
        "AND succeeded + failed + cancelled <= total",
        name="counts",
    ),
    Index("batches_tenant_created_idx", "tenant", text("created_at DESC"), text("id DESC")),
    Index("batches_created_idx", text("created_at DESC"), text("id DESC")),
    Index("batches_parent_idx", "parent_id", postgresql_where=text("parent_id IS NOT NULL")),
    # The pruner's: settled top-level batches, oldest first.
    Index(
        "batches_settled_idx",
        "settled_at",
        postgresql_where=text("settled_at IS NOT NULL AND parent_id IS NULL"),
    ),
    # The pruner's: open batches, oldest first (few: most are closed at creation). Not
    # matched by the grow's `closed_at IS NULL` (migration 0037 says why).
    Index(
        "batches_open_idx",
        "created_at",
        postgresql_where=text("closed_at IS NULL AND cancelled_at IS NULL"),
    ),
    # Room on the page for the counters' updates to stay HOT (no index entry written).
    postgresql_with={"fillfactor": "50"},
)

# A batch's callbacks: per event (success, complete, death), the callback job as the
# enqueue statement writes it, prepared at the batch's creation; and the job it fired.
batch_callbacks = Table(
    "batch_callbacks",
    metadata,
    Column(
        "batch_id",
        UUID(as_uuid=True),
        ForeignKey("batches.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("event", Text, nullable=False),
    Column("spec", JSONB, nullable=False),
    Column("job_id", UUID(as_uuid=True)),
    _timestamp("fired_at"),
    PrimaryKeyConstraint("batch_id", "event"),
    CheckConstraint("event IN ('success', 'complete', 'death')", name="event"),
)

WORKFLOW_STATUSES = ("running", "succeeded", "failed", "cancelled")
EDGE_POLICIES = ("on_success", "on_complete", "on_failure")
EDGE_STATES = ("waiting", "satisfied", "unsatisfiable")

# A workflow (jobcore.usecases.workflows): named jobs and the edges between them, written
# by one statement. Its counters are kept by the trigger on jobs (migration 0031), in the
# transaction of each settle: ``unsettled``, its steps that are not `finally` and not
# terminal (at 0 its finally steps are published); ``open_jobs``, all its steps not
# terminal (at 0 it is finished); ``failed_jobs``, its steps that failed.
workflows = Table(
    "workflows",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("name", Text),
    Column("status", Text, nullable=False, server_default=text("'running'")),
    Column("jobs_total", Integer, nullable=False),
    Column("unsettled", Integer, nullable=False),
    Column("open_jobs", Integer, nullable=False),
    Column("failed_jobs", Integer, nullable=False, server_default=text("0")),
    # Where its steps' messages go (the deployment's jobs exchange when it was created).
    Column("exchange", Text, nullable=False),
    _timestamp("cancel_requested_at"),
    _timestamp("created_at", nullable=False, default_now=True),
    _timestamp("finished_at"),
    # The request's Idempotency-Key (POST /workflows) and a hash of the request it came
    # with (migration 0036): a retry with the same key and request answers this workflow.
    Column("idempotency_key", Text),
    Column("request_fingerprint", Text),
    CheckConstraint(
        "status IN (" + ", ".join(f"'{s}'" for s in WORKFLOW_STATUSES) + ")", name="status"
    ),
    CheckConstraint("unsettled >= 0 AND open_jobs >= 0 AND failed_jobs >= 0", name="counters"),
    # A tenant's workflows, newest first; the pruner's range of finished ones.
    Index("workflows_tenant_created_idx", "tenant", text("created_at DESC"), text("id DESC")),
    Index("workflows_created_idx", text("created_at DESC"), text("id DESC")),
    Index(
        "workflows_finished_idx", "finished_at", postgresql_where=text("finished_at IS NOT NULL")
    ),
    # One workflow per tenant and idempotency key: the insert's ON CONFLICT DO NOTHING.
    Index(
        "workflows_idempotency_uidx",
        "tenant",
        "idempotency_key",
        unique=True,
        postgresql_where=text("idempotency_key IS NOT NULL"),
    ),
)

# A workflow's step: its name in the workflow, whether it is a `finally` step, and what its
# release needs: ``waiting``, its incoming edges not satisfied (0: it may run); the
# routing key of its message; ``blocked_by``, the dependency whose outcome made it
# unreachable (it was cancelled for it, and a retry of that dependency revives it).
workflow_jobs = Table(
    "workflow_jobs",
    metadata,
    Column("job_id", UUID(as_uuid=True), primary_key=True),
    Column(
        "workflow_id",
        UUID(as_uuid=True),
        ForeignKey("workflows.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("name", Text, nullable=False),
    Column("is_finally", Boolean, nullable=False, server_default=text("false")),
    Column("waiting", Integer, nullable=False),
    Column("routing_key", Text, nullable=False),
    Column("blocked_by", UUID(as_uuid=True)),
    CheckConstraint("waiting >= 0", name="waiting"),
    Index("workflow_jobs_workflow_id_name_idx", "workflow_id", "name", unique=True),
)

# An edge: ``downstream`` runs when ``upstream``'s outcome satisfies ``policy``. ``state``
# is resolved once per settle of the upstream (waiting → satisfied or unsatisfiable) and
# reset by its retry: the counters move only on that change, so a settle replayed moves
# nothing.
workflow_edges = Table(
    "workflow_edges",
    metadata,
    Column(
        "workflow_id",
        UUID(as_uuid=True),
        ForeignKey("workflows.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("upstream", UUID(as_uuid=True), nullable=False),
    Column("downstream", UUID(as_uuid=True), nullable=False),
    Column("policy", Text, nullable=False, server_default=text("'on_success'")),
    Column("state", Text, nullable=False, server_default=text("'waiting'")),
    PrimaryKeyConstraint("upstream", "downstream"),
    CheckConstraint(
        "policy IN (" + ", ".join(f"'{p}'" for p in EDGE_POLICIES) + ")", name="policy"
    ),
    CheckConstraint("state IN (" + ", ".join(f"'{s}'" for s in EDGE_STATES) + ")", name="state"),
    Index("workflow_edges_downstream_idx", "downstream"),
    Index("workflow_edges_workflow_id_idx", "workflow_id"),
)

# One row per gate key (jobcore.kernel.gates): the row the claims of a concurrency or rate key
# lock, in key order, before they count; a rate key's GCRA state (its theoretical arrival
# time); an ordering key's counter of enqueued jobs.
job_gates = Table(
    "job_gates",
    metadata,
    Column("key", Text, primary_key=True),
    _timestamp("tat"),
    Column("counter", BigInteger, nullable=False, server_default=text("0")),
    # A rate key's next free start time as far as the gate releaser has handed out (its
    # releases are due at spaced times up to here), so a round does not hand out again
    # the starts an earlier round's releases have not claimed yet.
    _timestamp("released_until"),
    _timestamp("updated_at", nullable=False, default_now=True),
)

# One row per debounce or throttle key (jobcore.kernel.keyed): the row every enqueue of the key
# locks first, so the enqueues of a key take turns; the job open to them (a debounce's
# trailing job, by its first message, or the throttle's job of the period), when the first
# enqueue it took came, and until when the row is needed (a debounce: its job's due time;
# a throttle: the period's end). The pruner deletes the rows past it.
job_keys = Table(
    "job_keys",
    metadata,
    Column("key", Text, primary_key=True),
    Column("kind", Text, nullable=False),
    Column("tenant", Text, nullable=False),
    Column("job_id", UUID(as_uuid=True), nullable=False),
    Column("message_id", UUID(as_uuid=True), nullable=False),
    _timestamp("first_at", nullable=False),
    _timestamp("last_at", nullable=False),
    _timestamp("expires_at", nullable=False),
    # Enqueues answered with the job (the first included).
    Column("enqueues", BigInteger, nullable=False, server_default=text("1")),
    CheckConstraint("kind IN ('debounce', 'throttle')", name="kind"),
    Index("job_keys_expires_at_idx", "expires_at"),
)

# The idempotency key of each request that joined a debounce or throttle key's job
# (jobcore.kernel.keyed): a retry of that request is answered with the same job instead of
# joining it again. Its rows go with their job.
job_key_joins = Table(
    "job_key_joins",
    metadata,
    Column("tenant", Text, nullable=False),
    Column("type", Text, nullable=False),
    Column("idempotency_key", Text, nullable=False),
    Column("job_id", UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("payload_fingerprint", Text, nullable=False),
    _timestamp("created_at", nullable=False, default_now=True),
    PrimaryKeyConstraint("tenant", "type", "idempotency_key"),
    Index("job_key_joins_job_id_idx", "job_id"),
)

outbox = Table(
    "outbox",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    # Unique by construction (a fresh uuid per row). No index of its own (migration 0042):
    # a job's messages are found by job_id, with outbox_job_idx, and operators name a
    # quarantined row's message with outbox_quarantined_message_idx.
    Column("message_id", UUID(as_uuid=True), nullable=False),
    Column("exchange", Text, nullable=False),
    Column("routing_key", Text, nullable=False),
    Column("message_type", Text, nullable=False),
    Column("headers", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("body", LargeBinary, nullable=False),
    Column("ordering_key", Text),
    Column("job_id", UUID(as_uuid=True)),
    # Whose message this is: the relay shares publishing round-robin across (routing key,
    # tenant). '' for rows written by a release that did not name it.
    Column("tenant", Text, nullable=False, server_default=text("''")),
    # Its job's priority (webhook messages: normal); the fair claim's lanes include it.
    Column(
        "priority", SmallInteger, nullable=False, server_default=text(str(int(DEFAULT_PRIORITY)))
    ),
    _timestamp("available_at", nullable=False, default_now=True),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("last_error", Text),
    # When the broker first refused this row's message (NULL: never): how long a row has
    # kept failing, for operators (`jobcore outbox status`) and their alerts.
    _timestamp("failing_since"),
    # A row whose message can never be published stops being retried; an operator
    # requeues or discards it (`jobcore outbox ...`).
    _timestamp("quarantined_at"),
    _timestamp("created_at", nullable=False, default_now=True),
    Index(
        "outbox_due_idx",
        "available_at",
        "id",
        postgresql_where=text("quarantined_at IS NULL"),
    ),
    # The fair claim (jobcore.database.sql.outbox.OUTBOX_CLAIM_FAIR): each lane's due rows are a
    # range scan of this index, oldest first, however large another lane's backlog is.
    Index(
        "outbox_fair_due_idx",
        "routing_key",
        "tenant",
        "priority",
        "available_at",
        "id",
        postgresql_where=text("quarantined_at IS NULL"),
    ),
    # Which lanes the fair claim shares a queue's room between: those with a row that was
    # due when it was written (a skip scan of this index, one probe per such lane, from
    # its newest row back to the relay's low-water mark: no heap fetch for the rows a
    # pinned horizon keeps below it)...
    Index(
        "outbox_ready_lanes_due_idx",
        "routing_key",
        "tenant",
        "priority",
        "available_at",
        postgresql_where=text("quarantined_at IS NULL AND available_at <= created_at"),
    ),
    # ... and those of the oldest rows written for later that are due now (a range of
    # this one from its start, read as far as the batch size). Lanes holding only rows
    # for later are in neither, so they cost a claim nothing.
    Index(
        "outbox_later_due_idx",
        "available_at",
        "id",
        postgresql_include=["routing_key", "tenant", "priority"],
        postgresql_where=text("quarantined_at IS NULL AND available_at > created_at"),
    ),
    # The rescuer's scan (every worker_rescuer_interval) reads only quarantined rows, so a
    # backlog of due rows does not make it a full scan; quarantined rows are rare, so the
    # index costs the enqueue path nothing.
    Index(
        "outbox_quarantined_job_idx",
        "job_id",
        postgresql_where=text("quarantined_at IS NOT NULL"),
    ),
    # `jobcore outbox requeue|discard <message id>`: the rows operators name are quarantined.
    Index(
        "outbox_quarantined_message_idx",
        "message_id",
        postgresql_where=text("quarantined_at IS NOT NULL"),
    ),
    # The sweeper asks, for each old pending job, whether it still has an outbox row. The
    # outbox is largest (a long broker outage) exactly when many old pending jobs must be
    # checked: without this index, each batch hashes the whole outbox. It costs each outbox
    # insert a small fraction of an enqueue (docs/bench/measurements.md, "The outbox's
    # indexes"). The statements that look for one message of a job (an outcome's retry,
    # the key pruner) name its job too, and probe this index.
    Index("outbox_job_idx", "job_id"),
)

inbox = Table(
    "inbox",
    metadata,
    Column("consumer", Text, nullable=False),
    Column("message_id", UUID(as_uuid=True), nullable=False),
    _timestamp("received_at", nullable=False, default_now=True),
    PrimaryKeyConstraint("consumer", "message_id"),
    Index("inbox_received_idx", "received_at"),
)

# Leases for singleton maintenance work (reaper, pruners). Rows, not advisory locks, so
# they work behind PgBouncer in transaction mode.
maintenance_leases = Table(
    "maintenance_leases",
    metadata,
    Column("name", Text, primary_key=True),
    Column("owner", Text, nullable=False),
    Column("token", UUID(as_uuid=True), nullable=False),
    _timestamp("expires_at", nullable=False),
    _timestamp("acquired_at", nullable=False, default_now=True),
)

# Periodic jobs (jobcore.maintenance.periodic): what the scheduler has done per schedule. The
# declarations live in configuration; this is the state that must survive restarts and
# clock steps. ``last_tick`` only moves forward: a tick at or before it is never enqueued.
schedules = Table(
    "schedules",
    metadata,
    Column("name", Text, primary_key=True),
    _timestamp("last_tick", nullable=False),
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    _timestamp("paused_at"),
    # The job of the latest tick enqueued (no foreign key: the pruner deletes jobs).
    Column("last_job_id", UUID(as_uuid=True)),
    _timestamp("last_enqueued_at"),
    _timestamp("created_at", nullable=False, default_now=True),
    _timestamp("updated_at", nullable=False, default_now=True),
    # The latest tick refused (a unique key held, a quota): when, which tick, and why
    # (jobcore.maintenance.schedule_ticks.Refusal). The schedule moved on past it (migration 0020).
    _timestamp("last_refusal_at"),
    _timestamp("last_refused_tick"),
    Column("last_refusal_reason", Text),
)

PAUSE_KINDS = ("queue", "type")

# Queues and job types an operator paused (jobcore.usecases.pauses): the relay's claim
# leaves their outbox rows where they are, and the worker's claim parks a message of
# theirs back in the outbox instead of starting its job. A row is a pause; resuming
# deletes it. Read by every claim, so it stays tiny.
flow_pauses = Table(
    "flow_pauses",
    metadata,
    Column("kind", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("paused_by", Text, nullable=False),
    _timestamp("paused_at", nullable=False, default_now=True),
    PrimaryKeyConstraint("kind", "name"),
    CheckConstraint("kind IN (" + ", ".join(f"'{k}'" for k in PAUSE_KINDS) + ")", name="kind"),
)

# What handlers did, written by the worker in the same transaction as a successful
# outcome (``ctx.record_effect``). No unique constraint on purpose: a duplicate here is
# evidence that a job's effects were committed twice, and the fault tests look for it.
job_effects = Table(
    "job_effects",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("job_id", UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("kind", Text, nullable=False),
    Column("detail", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    _timestamp("recorded_at", nullable=False, default_now=True),
    Index("job_effects_job_id_idx", "job_id"),
)

# A job's timeline (jobcore.usecases.whereabouts): one row per state change or hop, written by the
# statement that makes the change, never updated. Progress is not an event (too frequent).
# ``detail`` stays small (no payloads, no secrets): who (worker, relay), when next, why.
# The primary key (job_id, id) is the table's only index: it serves reading a timeline and
# the pruner's delete of a job's events, and each event (four or more per job, on the hot
# path) costs one index entry, not two. ``id`` alone is unique too (an identity); nothing
# looks it up. No foreign key to jobs (migration 0019): its check locked the job's row for
# every event; the pruner deletes a job's events with it (JOB_PRUNE_BATCH), and every
# statement that writes one has just written, locked or read its job.
job_events = Table(
    "job_events",
    metadata,
    Column("job_id", UUID(as_uuid=True), primary_key=True),
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    _timestamp_clock("at"),
    Column("kind", Text, nullable=False),
    Column("attempt", Integer),
    Column("detail", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
)

# The example job type ``credit_account`` (jobcore.examples.jobtypes): a handler's own tables,
# written in its transaction (``ctx.transaction()``), which also records the job's success,
# so an account is credited exactly once per job. An entry goes with its job when the
# pruner deletes the job (the balance stays). No unique constraint on job_id on purpose:
# like job_effects, a duplicate would be evidence of a credit committed twice.
ledger_accounts = Table(
    "ledger_accounts",
    metadata,
    Column("tenant", Text, nullable=False),
    Column("account", Text, nullable=False),
    Column("balance_cents", BigInteger, nullable=False, server_default=text("0")),
    _timestamp("updated_at", nullable=False, default_now=True),
    PrimaryKeyConstraint("tenant", "account"),
)

ledger_entries = Table(
    "ledger_entries",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    Column("tenant", Text, nullable=False),
    Column("account", Text, nullable=False),
    Column("amount_cents", BigInteger, nullable=False),
    Column("job_id", UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer, nullable=False),
    _timestamp("created_at", nullable=False, default_now=True),
    Index("ledger_entries_job_id_idx", "job_id"),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("tenant", Text, nullable=False),
    # Only a hash is stored; the key itself is shown once, at creation.
    Column("key_hash", Text, nullable=False, unique=True),
    Column("prefix", Text, nullable=False),
    Column("label", Text),
    _timestamp("created_at", nullable=False, default_now=True),
    _timestamp("revoked_at"),
    Column(
        "scopes",
        ARRAY(Text),
        nullable=False,
        server_default=text("'{" + ",".join(DEFAULT_SCOPES) + "}'::text[]"),
    ),
    # Refused from this time on (NULL: never expires); a rotation sets it on the old key.
    _timestamp("expires_at"),
    # Touched by the per-request lookup at most once a minute (jobcore.database.sql.api_keys).
    _timestamp("last_used_at"),
    # The first key of a rotation chain; every key rotated from it shares it. At most
    # two keys of one lineage are usable at a time (the old one until it expires). NULL
    # (a key created by a release before 0008 during a rollout) means the key's own id.
    Column("lineage", UUID(as_uuid=True)),
    Column("rotated_from", UUID(as_uuid=True), ForeignKey("api_keys.id")),
    CheckConstraint(
        "cardinality(scopes) >= 1 AND scopes <@ ARRAY["
        + ", ".join(f"'{scope}'" for scope in Scope)
        + "]::text[]",
        name="scopes",
    ),
    Index("api_keys_tenant_idx", "tenant"),
)

WEBHOOK_DELIVERY_STATUSES = ("pending", "delivered", "failed")

# One row per completion webhook. Its id is the delivery id receivers see in
# ``Webhook-Id``: the same on every attempt, so they can dedupe. Written in the same
# statement as the job's terminal status; each attempt is an outbox message.
webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("job_id", UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("tenant", Text, nullable=False),
    Column("url", Text, nullable=False),
    Column("event", Text, nullable=False),
    Column("status", Text, nullable=False, server_default="pending"),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("max_attempts", Integer, nullable=False, server_default=text("8")),
    Column("last_status_code", Integer),
    Column("last_error", Text),
    _timestamp("next_attempt_at"),
    _timestamp("created_at", nullable=False, default_now=True),
    _timestamp("delivered_at"),
    _timestamp("updated_at", nullable=False, default_now=True),
    CheckConstraint(
        "status IN (" + ", ".join(f"'{v}'" for v in WEBHOOK_DELIVERY_STATUSES) + ")",
        name="status",
    ),
    CheckConstraint("attempts >= 0 AND max_attempts >= 1", name="attempts"),
    Index("webhook_deliveries_job_created_idx", "job_id", "created_at"),
    Index("webhook_deliveries_status_created_idx", "status", "created_at"),
)

# The key each tenant's webhooks are signed with (HMAC-SHA256). Kept in clear: signing
# needs it. Created on first need or by `jobcore webhooks secret`. After a rotation the
# secret it replaced signs too, until previous_expires_at (Standard Webhooks' zero
# downtime rotation: receivers still holding it keep verifying).
tenant_webhook_secrets = Table(
    "tenant_webhook_secrets",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("secret", Text, nullable=False),
    _timestamp("created_at", nullable=False, default_now=True),
    _timestamp("rotated_at"),
    Column("previous_secret", Text),
    _timestamp("previous_expires_at"),
    CheckConstraint("(previous_secret IS NULL) = (previous_expires_at IS NULL)", name="previous"),
)

# A tenant's default webhook endpoint per job type ('*': any type), copied into a job's
# callback_url at enqueue when the request names none.
webhook_endpoints = Table(
    "webhook_endpoints",
    metadata,
    Column("tenant", Text, nullable=False),
    Column("job_type", Text, nullable=False),
    Column("url", Text, nullable=False),
    _timestamp("created_at", nullable=False, default_now=True),
    _timestamp("updated_at", nullable=False, default_now=True),
    PrimaryKeyConstraint("tenant", "job_type"),
)

AUDIT_OUTCOMES = ("succeeded", "refused")

# Every admin action (jobcore.access.audit): who, when, on what, with what outcome. Append-only:
# only inserted, deleted past JOBCORE_AUDIT_RETENTION by the pruner; a trigger (migration
# 0009) refuses UPDATE. ``details`` never holds a secret, a key or a payload.
audit_log = Table(
    "audit_log",
    metadata,
    Column("id", BigInteger, Identity(always=False), primary_key=True),
    _timestamp("at", nullable=False, default_now=True),
    Column("actor", Text, nullable=False),
    Column("action", Text, nullable=False),
    Column("target_type", Text, nullable=False),
    # NULL for an action on no single row (a prune, a DLQ replay).
    Column("target_id", Text),
    Column("tenant", Text),
    Column("outcome", Text, nullable=False),
    Column("details", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    CheckConstraint(
        "outcome IN (" + ", ".join(f"'{v}'" for v in AUDIT_OUTCOMES) + ")", name="outcome"
    ),
    # `jobcore audit` reads newest first and the pruner deletes oldest first: both by time.
    Index("audit_log_at_idx", "at"),
)

# A tenant's quotas where they differ from the deployment's defaults (JOBCORE_QUOTA_*):
# NULL takes the default, 0 means unlimited (jobcore.kernel.quotas).
tenant_quotas = Table(
    "tenant_quotas",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("enqueue_rate", Float),
    Column("enqueue_burst", Integer),
    Column("max_unfinished", BigInteger),
    Column("max_long_polls", Integer),
    _timestamp("updated_at", nullable=False, default_now=True),
    CheckConstraint("enqueue_rate >= 0", name="enqueue_rate"),
    CheckConstraint("enqueue_burst >= 1", name="enqueue_burst"),
    CheckConstraint("max_unfinished >= 0", name="max_unfinished"),
    CheckConstraint("max_long_polls >= 0", name="max_long_polls"),
)

# What the quotas are checked against, one row per tenant that ever had a job: the
# enqueue rate limit's theoretical arrival time (GCRA), and the tenant's jobs that are
# not terminal, less the tenant's tenant_usage_deltas not yet folded in (migration 0023).
tenant_usage = Table(
    "tenant_usage",
    metadata,
    Column("tenant", Text, primary_key=True),
    Column("unfinished", BigInteger, nullable=False, server_default=text("0")),
    _timestamp("rate_tat"),
    Column("last_refusal", Text),
    _timestamp("last_refused_at"),
)

# Jobs of a tenant added less those ended, one row per statement that changed them
# (statement-level triggers, migration 0027), and not yet folded into
# tenant_usage.unfinished by the maintenance leader's usage folder: adding or ending a job
# appends here instead of updating the tenant's row, so no statement that makes or ends
# jobs locks or writes those rows (migrations 0010, 0023).
tenant_usage_deltas = Table(
    "tenant_usage_deltas",
    metadata,
    Column("tenant", Text, nullable=False),
    Column("id", BigInteger, Identity(always=False), nullable=False),
    Column("delta", Integer, nullable=False),
    PrimaryKeyConstraint("tenant", "id"),
)

# What the workers' registries declare of each job type, and what their deployment says
# about its jobs (the jobs exchange, the inline payload limit, the tenant quota
# defaults): what jobcore.enqueue() (migration 0026) checks and writes a job with. Each
# worker upserts its types' rows when its pool first connects (jobcore.execution.job_type_records).
job_type_registry = Table(
    "job_type_registry",
    metadata,
    Column("type", Text, primary_key=True),
    Column("queue", Text, nullable=False),
    Column("exchange", Text, nullable=False),
    Column("routing_key", Text, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("priority", SmallInteger, nullable=False),
    Column("unique_field", Text),
    Column("concurrency_per", Text),
    Column("concurrency_limit", Integer),
    Column("rate_per", Text),
    Column("rate_per_second", Float),
    Column("rate_burst", Integer),
    Column("ordering_blocks", Boolean, nullable=False),
    Column("max_payload_bytes", BigInteger, nullable=False),
    Column("quota_enqueue_rate", Float, nullable=False),
    Column("quota_enqueue_burst", Integer, nullable=False),
    Column("quota_max_unfinished", BigInteger, nullable=False),
    # sha256 of the payload model's JSON schema: which workers agree on a type's payload.
    Column("schema_hash", Text, nullable=False),
    Column("worker_version", Text, nullable=False),
    Column("registered_by", Text, nullable=False),
    _timestamp("registered_at", nullable=False, default_now=True),
)
