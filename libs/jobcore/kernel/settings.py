"""Typed settings, read from ``JOBCORE_*`` environment variables and validated at start-up."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import timedelta
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from jobcore.kernel.errors import ConfigurationError
from jobcore.kernel.quotas import MAX_RATE, MIN_RATE, Quotas

# RabbitMQ takes any signed 32-bit x-priority; this bound keeps random ones well inside it.
MAX_CONSUMER_PRIORITY = 1_000_000

ENV_PREFIX = "JOBCORE_"
# An audit log actor (jobcore.access.audit) is 1 to this many printable characters.
MAX_ACTOR_LENGTH = 200
# RabbitMQ's `max_message_size` default (128 MiB since 3.8); its hard ceiling is 512 MiB.
DEFAULT_MAX_MESSAGE_SIZE = 128 * 1024 * 1024
MAX_WEBHOOK_SECRET_OVERLAP = timedelta(days=30)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# jobcore's own PostgreSQL schema unless JOBCORE_DATABASE_SCHEMA names another. Runtime SQL
# is written qualified with this name (jobcore.database.sql).
DEFAULT_SCHEMA = "jobcore"
# Unquoted, so it can be written into statements as it is.
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_NOT_OURS = frozenset({"public", "information_schema"})

_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def parse_store_url(value: str) -> str | None:
    """The bucket of an ``s3://BUCKET`` store setting; None for a local directory.
    ValueError (naming no credential: the URL holds none) when it is malformed."""
    if not value.startswith("s3://"):
        return None
    parts = urlsplit(value)
    if parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(
            "must be s3://BUCKET (put a key prefix in JOBCORE_S3_PREFIX, credentials in "
            "JOBCORE_S3_ACCESS_KEY_ID / JOBCORE_S3_SECRET_ACCESS_KEY)"
        )
    if not _BUCKET_RE.match(parts.netloc):
        raise ValueError("names no valid bucket (3-63 lower-case letters, digits, '.' or '-')")
    return parts.netloc


# --- retention (the pruner) ---------------------------------------------------------------

# The statuses a retention is set for: the terminal ones (jobcore.kernel.states.TERMINAL).
RETENTION_STATUSES = ("succeeded", "failed", "cancelled")
_SECONDS_RE = re.compile(r"^\d+(\.\d*)?$")


def _seconds_or_duration(value: object) -> object:
    """Let a duration be written as plain seconds in the environment too.

    pydantic parses ``timedelta`` from ISO 8601 (``P7D``, ``PT12H``), from ``7d`` /
    ``7 days`` / ``1d,12:00:00`` and from numbers, but not from a string of digits, which
    is what ``JOBCORE_RETENTION_SUCCEEDED=604800`` gives it.
    """
    if isinstance(value, str):
        value = value.strip()
        if _SECONDS_RE.match(value):
            return float(value)
    return value


def _upper_case(value: object) -> object:
    return value.upper() if isinstance(value, str) else value


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be a positive duration")
    return value


def _secret_overlap(value: timedelta) -> timedelta:
    if not timedelta(0) <= value <= MAX_WEBHOOK_SECRET_OVERLAP:
        raise ValueError(f"must be from 0 to {MAX_WEBHOOK_SECRET_OVERLAP.days} days")
    return value


def _postgres_url(value: str) -> str:
    parts = urlsplit(value.strip())
    scheme = parts.scheme.split("+", 1)[0]
    if scheme not in {"postgresql", "postgres"}:
        raise ValueError("must be a postgresql:// URL")
    hosts = database_hosts(parts.netloc)  # raises for a bad host or port, value unsaid
    if not hosts and "host=" not in parts.query:
        raise ValueError("must name a host")
    if not parts.path.strip("/"):
        raise ValueError("must name a database")
    return urlunsplit(("postgresql", parts.netloc, parts.path, parts.query, ""))


# A positive duration: seconds, ISO 8601 (P7D, PT1H) or 7d / 7 days / 1d,12:00:00.
Duration = Annotated[timedelta, BeforeValidator(_seconds_or_duration), AfterValidator(_positive)]


def split_amqp_urls(value: str) -> list[str]:
    """The amqp:// URLs of a comma-separated list (one URL is a list of one), each checked.

    An error names the bad item by its position and host, never its password."""
    items = [item.strip() for item in value.split(",")]
    if not any(items):
        raise ValueError("must be an amqp:// or amqps:// URL")
    for n, item in enumerate(items, start=1):
        parts = urlsplit(item)
        # Several brokers: say which one is wrong, by position and host (no password).
        where = f"item {n} of the list ({parts.hostname or '?'}): " if len(items) > 1 else ""
        if not item:
            raise ValueError(f"item {n} of the list is empty (a stray comma?)")
        if parts.scheme not in {"amqp", "amqps"}:
            raise ValueError(f"{where}must be an amqp:// or amqps:// URL")
        if not parts.hostname:
            raise ValueError(f"{where}must name a host")
        try:
            _ = parts.port  # urlsplit checks the port only when asked
        except ValueError as exc:
            raise ValueError(f"{where}has a bad port: {exc}") from None
    return items


class Settings(BaseSettings):
    """Every setting has a default that reaches PostgreSQL and RabbitMQ on localhost."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    environment: Literal["development", "test", "production"] = "development"
    # The services' log level (JSON lines on stderr). DEBUG never logs an API key or its
    # hash either (tests/security/test_keys_in_logs.py).
    log_level: Annotated[
        Literal["DEBUG", "INFO", "WARNING", "ERROR"], BeforeValidator(_upper_case)
    ] = "INFO"

    # PostgreSQL. Runtime code uses psycopg with this URL; Alembic gets the SQLAlchemy form.
    database_url: str = "postgresql://postgres@127.0.0.1:5432/jobcore"
    db_pool_min: int = Field(default=1, ge=0, le=100)
    db_pool_max: int = Field(default=12, ge=1, le=200)
    db_connect_timeout: float = Field(default=5.0, gt=0, le=120)
    # How long one database operation (a statement, a commit) may wait for the server
    # before its connection counts as dead and is dropped: across a silently cut network
    # (no FIN, no RST) it would otherwise wait forever. The server ends a transaction left
    # idle twice as long, so one whose client vanished does not keep its locks.
    db_operation_timeout: float = Field(default=30.0, gt=0, le=3600)
    # What sits between jobcore and PostgreSQL. "pgbouncer" (in transaction mode, where a
    # server connection serves one client for one transaction only): no server-side
    # prepared statements and no session state (SET, LISTEN) on database_url connections,
    # since the next transaction of the same client may run on another server connection
    # and the next client on this one. docs/operations.md, "PgBouncer".
    database_pooler: Literal["none", "pgbouncer"] = "none"
    # The PostgreSQL schema that holds every jobcore object (tables, functions, Alembic's
    # version table), apart from the application's own in ``public``. Runtime statements
    # name it (jobcore.database.gateway), so no search_path is needed, behind PgBouncer
    # neither. Set it before the first `jobcore migrate`; every process of an installation
    # uses the same one.
    database_schema: str = DEFAULT_SCHEMA
    # A direct (not pooled) URL for LISTEN connections only: one per API, relay and
    # worker process, held for its life. Empty: database_url, unless the pooler is
    # pgbouncer, where LISTEN hears nothing, so every listener polls instead.
    listen_database_url: str = ""
    # How often, with no LISTEN connection, a worker looks for cancel requests for the
    # jobs it runs and an API process re-reads the jobs its long-polls wait for: the
    # latency those gain, for one query per interval per process (none while idle).
    notify_poll_interval: float = Field(default=1.0, gt=0, le=60)

    # RabbitMQ: one URL, or a comma-separated list of the nodes of one cluster, tried in
    # turn when a connection fails or drops (see amqp_urls).
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    amqp_heartbeat: int = Field(default=15, ge=0, le=600)
    # Prefix of every exchange and queue name, so test runs and tenants of one broker
    # never see each other's topology.
    amqp_prefix: str = "jobcore"
    amqp_delivery_limit: int = Field(default=20, ge=1, le=1000)
    # The broker's `consumer_timeout` (RabbitMQ's default: 30 minutes): how long a delivery
    # may stay unacknowledged before the broker closes its channel and requeues it. jobcore
    # cannot read it from the broker, so operators who change it there say so here; the
    # longest a message can take to be redelivered is delivery_limit times this.
    amqp_consumer_timeout: float = Field(default=1800.0, gt=0, le=7 * 86_400)

    # Modules imported at start-up so that their job types are registered
    # (comma-separated in the environment).
    job_modules: Annotated[tuple[str, ...], NoDecode] = ("jobcore.examples.jobtypes",)

    # API.
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=0, le=65535)
    max_body_bytes: int = Field(default=256 * 1024, ge=1024, le=64 * 1024 * 1024)
    # The body of POST /jobs/{type}/batch (up to 1,000 items; each item's payload is still
    # held to max_body_bytes).
    max_batch_body_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    # Long-polls (GET /jobs/{id}?wait=) parked at once in one API process, all tenants
    # together; 0: no limit. Each holds a socket and a task, never a database connection.
    api_max_long_polls: int = Field(default=1000, ge=0, le=1_000_000)
    # The most single enqueues of one tenant (and job type and API key) an API process
    # writes in one transaction, when they arrive while one of theirs is being written
    # (services.api.coalescing); 1: each its own statement.
    api_enqueue_coalesce_max: int = Field(default=64, ge=1, le=1000)
    # Seconds an API process may answer from its memory of a verified API key (0: look
    # the key up on every request, the default). A revoked or expired key keeps reading
    # on that process for up to this long (an expiry is still checked on every request;
    # enqueues stop at once, the enqueue statement checks the key); an unknown key is
    # always looked up. Saves one statement per request.
    api_key_cache_seconds: float = Field(default=0.0, ge=0, le=60)
    # The longest long-poll: longer waits asked for are shortened to this many seconds
    # (clients and proxies time out idle requests).
    api_max_wait: float = Field(default=60.0, gt=0, le=3600)

    # Tenant quotas: the defaults of tenants without an override (`jobcore tenants
    # set-quota`); 0 means unlimited. docs/operations.md, "Tenant quotas", sizes them.
    quota_enqueue_rate: float = Field(default=100.0, ge=0, le=MAX_RATE)
    quota_enqueue_burst: int = Field(default=200, ge=1, le=1_000_000)
    quota_max_unfinished: int = Field(default=100_000, ge=0, le=1_000_000_000)
    quota_max_long_polls: int = Field(default=100, ge=0, le=1_000_000)

    # Where the relay's and the worker's health servers listen (0.0.0.0 in containers).
    health_host: str = "127.0.0.1"

    # The relay's settings (JOBCORE_RELAY_*) are RelayOptions, below.

    # Worker.
    worker_concurrency: int = Field(default=16, ge=1, le=10_000)
    # Unacknowledged job deliveries per worker (default: its concurrency, and never more).
    # A delivery is acknowledged when its claim commits, so prefetch counts deliveries
    # waiting for a handler slot, not running jobs. More waiting than there are slots to
    # free gains nothing, and costs: when a worker stops or dies the broker requeues them,
    # and each requeue counts toward the quorum queue's delivery limit
    # (amqp_delivery_limit), so restarts alone could dead-letter a healthy job.
    worker_prefetch: int | None = Field(default=None, ge=1, le=10_000)
    # The worker's consumer priority on its job queues (RabbitMQ's x-priority): a queue's
    # messages go to the highest-priority worker with a free slot, so a trickle is batched
    # by one worker rather than split over all (services/worker/intake.py). Empty: a random
    # one per process. Set it to prefer some workers (a bigger machine) to others.
    worker_consumer_priority: int | None = Field(default=None, ge=0, le=MAX_CONSUMER_PRIORITY)
    # Direct pickup (services/worker/direct.py): a worker whose handlers are idle takes a
    # new job's outbox row itself when it hears the enqueue's NOTIFY, one hop instead of
    # relay, broker and consumer; relays leave new rows to idle workers for a moment. The
    # same value on every worker and relay. A worker that cannot LISTEN (behind PgBouncer
    # with no listen URL) hears no NOTIFY and takes nothing: the relays publish it all.
    direct_pickup: bool = True
    worker_health_port: int = Field(default=8002, ge=0, le=65535)
    result_dir: Path = Path("var/results")
    # Results whose JSON is larger than this go to the result store, not the job row.
    inline_result_max_bytes: int = Field(default=16 * 1024, ge=0, le=1024 * 1024)
    # The result store (jobcore.storage.objectstore): empty, the directory result_dir; a path, that
    # directory; s3://BUCKET, an S3-compatible bucket, with the s3_* settings below. Checked
    # at start-up (parse_store_url).
    result_store: str = ""
    s3_endpoint_url: str = ""  # empty: AWS's own endpoint for s3_region
    s3_region: str = "us-east-1"
    s3_access_key_id: str = ""  # empty: the AWS_* environment / instance credentials
    s3_secret_access_key: SecretStr = SecretStr("")
    s3_prefix: str = ""  # prepended to every object key, e.g. "jobcore/"
    # A presigned result URL (GET /jobs/{id}/result answers 302 to it) lasts this long.
    s3_presign_expiry: int = Field(default=300, ge=1, le=7 * 86_400)
    # Multipart upload part size: S3's minimum is 5 MiB (all parts but the last).
    s3_part_size: int = Field(default=8 * 1024 * 1024, ge=5 * 1024 * 1024, le=5 * 1024**3)
    # Seconds one store request may take, its retries included: then the attempt fails
    # (retried later) or the enqueue answers 503.
    s3_timeout: float = Field(default=30.0, gt=0, le=600)
    # Payloads whose JSON is larger than this go to the result store before the job row
    # commits (payload_ref); the default equals max_body_bytes' default, so nothing goes by
    # reference until the body limit is raised above it.
    inline_payload_max_bytes: int = Field(default=256 * 1024, ge=0, le=1024**3)
    # An object-store outage gives a job back without spending an attempt this many times
    # in the job's life; after that, an outage fails the attempt like any error (retried
    # after the backoff, or the job fails on its last). 0: every outage costs an attempt.
    max_store_give_backs: int = Field(default=10, ge=0, le=10_000)
    # A handler's snoozes (jobcore.kernel.errors.Snooze) a job may have in its life unless
    # its type says otherwise (max_snoozes); the one past it fails the job.
    max_snoozes: int = Field(default=100, ge=0, le=100_000)
    # A failed attempt waits a random time in [0, min(cap, base * 2**(attempt-1))] seconds.
    retry_backoff_base: float = Field(default=2.0, gt=0, le=3600)
    retry_backoff_cap: float = Field(default=600.0, gt=0, le=86_400)
    # How often the reaper looks for expired leases; its own lease lasts three intervals.
    worker_reaper_interval: float = Field(default=5.0, gt=0, le=3600)
    # How often the rescuer fails pending jobs whose message was quarantined: rare, and no
    # index serves quarantined rows (its query scans the outbox), so less often than the
    # reaper.
    worker_rescuer_interval: float = Field(default=30.0, gt=0, le=3600)
    # How often the gate releaser publishes again the held jobs (jobcore.kernel.gates) whose
    # concurrency slot, rate token or turn in their ordering key has come: the longest a
    # freed slot waits to be reused. A round with nothing held is one index probe.
    gate_release_interval: float = Field(default=0.2, gt=0, le=60)
    # How often the maintenance leader looks for jobcore tables whose planner statistics
    # are stale where autovacuum will not refresh them soon (jobcore.maintenance.analyzer):
    # one catalog read a round, an ANALYZE only when one is due.
    worker_analyze_interval: float = Field(default=2.0, gt=0, le=3600)
    # How often the maintenance leader folds the tenants' usage deltas (per statement, the
    # jobs added less those ended) into their rows (jobcore.maintenance.usage_folder). A cap's check
    # reads the tenant's row plus its deltas not yet folded, which pile up with the jobs
    # added and ended per tenant in this time; a round with none is one index probe.
    usage_fold_interval: float = Field(default=2.0, gt=0, le=600)
    # The compactor (jobcore.maintenance.compactor): once a hot table's files are well above
    # what its live rows need (a pinned xmin horizon let them grow) and nothing pins the
    # horizon any more, the maintenance leader rewrites the table to give the space back,
    # at most once per table this many seconds. 0 turns it off (the space stays allocated
    # to the tables and is reused). The rewrite locks the table out (ACCESS EXCLUSIVE):
    # it waits for that lock at most compact_lock_timeout (every enqueue, claim and outcome
    # on the table waits behind it meanwhile), and holds it at most compact_max_seconds,
    # else it is rolled back and the table left as it was.
    compact_every: float = Field(default=1800.0, ge=0, le=7 * 86_400)
    compact_lock_timeout: float = Field(default=0.1, gt=0, le=10)
    compact_max_seconds: float = Field(default=2.0, gt=0, le=600)

    # Anti-entropy: the sweeper publishes again (through the outbox) the message of a
    # pending job that has been due, with no outbox row of its own, for sweeper_stale_after
    # seconds: its message may be gone (dead-lettered at the delivery limit, a purged or
    # re-declared queue, lost broker data). A copy of a message that still exists is
    # harmless (the inbox and the claim's attempt fence ignore it) but costs a delivery, so
    # the staleness must stay well above the longest healthy wait in a queue: one hour is
    # above the broker's consumer_timeout (a worker may hold a delivery that long while the
    # database is away) and above the minutes a large backlog takes to drain. Each further
    # republish of the same job waits twice as long as the one before (at most 32x), so
    # even a backlog older than this costs a handful of copies per job, not one per round.
    # A round every minute is noise against an hour and one indexed scan of old pending
    # jobs.
    sweeper_interval: float = Field(default=60.0, gt=0, le=3600)
    sweeper_stale_after: float = Field(default=3600.0, ge=1, le=30 * 86_400)
    # How long deliveries may wait for the database (a job's claim; a webhook's read or
    # record) with none served before the worker's /readyz turns red; it turns green
    # again by itself. Twice the default db_operation_timeout: a claim that hangs until
    # that timeout and then succeeds on a fresh connection is slow, not stuck.
    worker_stall_after: float = Field(default=60.0, gt=0, le=3600)

    # Shared by every long-running loop: how long SIGTERM waits for in-flight work.
    shutdown_grace: float = Field(default=10.0, ge=0, le=3600)

    # Webhooks (completion notifications). Callback URLs that resolve to loopback,
    # private, link-local or other non-public addresses are refused unless their host
    # (or host:port) is listed here (comma-separated in the environment).
    webhook_allowed_hosts: Annotated[tuple[str, ...], NoDecode] = ()
    webhook_max_attempts: int = Field(default=8, ge=1, le=100)
    # Failed attempt n waits a random time in [0.6c, c], c = min(cap, base * 2**(n-1)) s.
    webhook_backoff_base: float = Field(default=5.0, gt=0, le=3600)
    webhook_backoff_cap: float = Field(default=3600.0, gt=0, le=86_400)
    # Deliveries sent at once per worker (the webhooks queue's prefetch).
    webhook_concurrency: int = Field(default=16, ge=1, le=1000)
    # After `jobcore webhooks secret --rotate`, webhooks carry the replaced secret's
    # signature too for this long, so receivers can switch without refusing one: a day,
    # like an API key's rotation overlap. 0: the old secret stops at once.
    webhook_secret_overlap: Annotated[
        timedelta, BeforeValidator(_seconds_or_duration), AfterValidator(_secret_overlap)
    ] = timedelta(hours=24)

    # The job timeline (job_events, `GET /jobs/{id}/timeline`): on, every state change and
    # hop of a job is recorded in the statement that makes it. Off, none is, and timelines
    # say so: for throughput at the cost of the history (`jobcore bench timeline` measures
    # what it costs). Set it alike on every process: it is each connection's to write.
    job_events: bool = True

    # Retention: the workers' pruner deletes finished jobs (with their webhook deliveries,
    # effects, quarantined outbox rows and result files) this long after they finished.
    # Succeeded: 7 days. Clients read a result within minutes or hours of the job ending;
    # a week also covers a long weekend before someone asks "what happened on Friday",
    # and keeps idempotency keys (which live in the job row) for far longer than the hours
    # clients retry within. Failed and cancelled: 30 days. They wait for a person (to read
    # last_error, to `jobcore jobs retry` one, which needs its payload), often only at a
    # weekly or monthly review, and there are few of them, so keeping them costs little.
    retention_succeeded: Duration = timedelta(days=7)
    retention_failed: Duration = timedelta(days=30)
    retention_cancelled: Duration = timedelta(days=30)
    # Per job type overrides, JSON: {"export_csv": {"succeeded": "P1D"}}; the statuses a
    # type does not name keep the defaults above.
    retention_types: Annotated[Mapping[str, Mapping[str, Duration]], NoDecode] = Field(
        default_factory=dict
    )
    # Inbox rows (the dedupe of received messages), 3 days: they must outlive the broker's
    # longest redelivery (amqp_delivery_limit × amqp_consumer_timeout, 10 hours by
    # default; shorter is refused) and do with a wide margin, so that raising
    # consumer_timeout to a few hours needs no change here. A row is ~100 bytes with its
    # indexes, so three days of them are small next to a week of jobs.
    inbox_retention: Duration = timedelta(days=3)
    # Audit log entries (every admin action, jobcore.access.audit), 400 days: a year of history
    # plus a month, the window a yearly review or a payments audit looks back over. Kept
    # by the pruner; an entry is ~300 bytes, and admin actions are few.
    audit_retention: Duration = timedelta(days=400)
    # Gate rows (job_gates, jobcore.kernel.gates): one per ordering, concurrency and rate key seen.
    # The pruner deletes a row idle this long with nothing waiting on it (an ordering key's
    # once its jobs are all gone): a key used again gets a fresh row, at the cost of an insert.
    gate_retention: Duration = timedelta(days=1)
    # Batches (jobcore.usecases.batches): the pruner deletes a top-level batch settled this
    # long ago, with its child batches and whatever of their jobs is left (each job also
    # goes by its own status's retention, its batch's counts staying as they were).
    batch_retention: Duration = timedelta(days=30)
    # An open batch that took no member for this long is closed by the pruner, as
    # POST /batches/{id}/close would close it (its callbacks fire once its members have
    # settled), so a batch a client forgot to close still completes and is pruned.
    batch_open_timeout: Duration = timedelta(days=7)
    # Who the audit log names for a command's admin action (`jobcore --actor` wins; unset:
    # cli:<os user>@<host>). Only the command line reads it; a service's actions are
    # audited under the caller's identity (an API key's id).
    actor: str | None = Field(default=None, min_length=1, max_length=MAX_ACTOR_LENGTH)
    # Seconds between pruner rounds (one pruner at a time across the workers, by lease).
    # A round deletes everything due, so the interval only decides how long past its
    # retention a row may live: a minute is nothing next to days of retention.
    pruner_interval: float = Field(default=60.0, gt=0, le=86_400)
    # Rows deleted per transaction: larger batches were hardly faster per job but held
    # each transaction longer and made enqueue's worst stall worse
    # (docs/bench/measurements.md, "The pruner's batch"; docs/operations.md, "Retention").
    pruner_batch_size: int = Field(default=1000, ge=1, le=100_000)

    # Periodic jobs (jobcore.maintenance.periodic): JSON, a declaration per schedule name, e.g.
    # {"nightly_export": {"job_type": "export_csv", "cron": "0 3 * * *",
    #  "timezone": "Europe/Paris", "jitter": 300, "missed": "skip"}}; checked against the
    # registry when a worker or a command loads them (jobcore.maintenance.periodic.load_schedules).
    schedules: Annotated[Mapping[str, Mapping[str, object]], NoDecode] = Field(default_factory=dict)
    # Seconds between the scheduler's looks for due ticks (one scheduler at a time across
    # the workers, by lease; it lasts three intervals): how late a tick's job may be
    # enqueued, and how long a dead scheduler's successor may take.
    scheduler_interval: float = Field(default=1.0, gt=0, le=60)

    # The benchmark's own routes on the API (POST /bench/noop: an enqueue without
    # authentication or database, services/api/routes/bench.py). Only `jobcore bench` turns
    # them on, for the API processes it starts; refused in production.
    bench_routes: bool = False

    @field_validator("bench_routes")
    @classmethod
    def _refuse_bench_routes_in_production(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("environment") == "production":
            raise ValueError("the bench's unauthenticated routes are refused in production")
        return value

    @field_validator("schedules", mode="before")
    @classmethod
    def _parse_schedules(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except ValueError:
                raise ValueError(
                    'must be a JSON object, e.g. {"nightly": {"job_type": "export_csv", '
                    '"cron": "0 3 * * *"}}'
                ) from None
        if not isinstance(value, Mapping) or not all(
            isinstance(v, Mapping) for v in value.values()
        ):
            raise ValueError("must map schedule names to JSON objects")
        return value

    @field_validator("result_store")
    @classmethod
    def _check_result_store(cls, value: str) -> str:
        parse_store_url(value.strip())
        return value.strip()

    @field_validator("actor")
    @classmethod
    def _check_actor(cls, value: str | None) -> str | None:
        if value is not None and not value.isprintable():
            raise ValueError("must be printable characters (no newline or control character)")
        return value

    @field_validator("database_url")
    @classmethod
    def _normalise_database_url(cls, value: str) -> str:
        return _postgres_url(value)

    @field_validator("listen_database_url")
    @classmethod
    def _normalise_listen_url(cls, value: str) -> str:
        return _postgres_url(value) if value.strip() else ""

    @field_validator("amqp_url")
    @classmethod
    def _check_amqp_url(cls, value: str) -> str:
        return ",".join(split_amqp_urls(value))

    @field_validator("job_modules", mode="before")
    @classmethod
    def _split_modules(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(m.strip() for m in value.split(",") if m.strip())
        return value

    @field_validator("webhook_allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, list | tuple):
            return tuple(str(h).strip().lower() for h in value if str(h).strip())
        return value

    @field_validator("retention_types", mode="before")
    @classmethod
    def _parse_retention_types(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except ValueError:
                raise ValueError(
                    'must be a JSON object, e.g. {"export_csv": {"succeeded": "P1D"}}'
                ) from None
        if not isinstance(value, Mapping) or not all(
            isinstance(v, Mapping) for v in value.values()
        ):
            raise ValueError('must map job types to {"status": duration} objects')
        return value

    @field_validator("retention_types")
    @classmethod
    def _check_retention_types(
        cls, value: Mapping[str, Mapping[str, timedelta]]
    ) -> Mapping[str, Mapping[str, timedelta]]:
        for job_type, statuses in value.items():
            for status in statuses:
                if status not in RETENTION_STATUSES:
                    raise ValueError(
                        f"unknown status {status!r} for job type {job_type!r} "
                        f"(use {', '.join(RETENTION_STATUSES)})"
                    )
        return {job_type: dict(statuses) for job_type, statuses in value.items()}

    @field_validator("inbox_retention")
    @classmethod
    def _check_inbox_window(cls, value: timedelta, info: ValidationInfo) -> timedelta:
        # A redelivery later than the window would find no inbox row: the claim's fence
        # still stops it, but it would no longer be recognised (and counted) as a duplicate.
        limit, timeout = (
            info.data.get("amqp_delivery_limit"),
            info.data.get("amqp_consumer_timeout"),
        )
        if limit is None or timeout is None:
            return value  # reported on their own
        if value.total_seconds() < limit * timeout:
            raise ValueError(
                f"{value} is shorter than the broker's longest redelivery, "
                f"JOBCORE_AMQP_DELIVERY_LIMIT × JOBCORE_AMQP_CONSUMER_TIMEOUT = "
                f"{limit} × {timeout:g} s = {timedelta(seconds=limit * timeout)}"
            )
        return value

    @field_validator("quota_enqueue_rate")
    @classmethod
    def _check_quota_rate(cls, value: float) -> float:
        if 0 < value < MIN_RATE:
            raise ValueError("must be 0 (unlimited) or at least one a day (1/86400)")
        return value

    @field_validator("database_schema")
    @classmethod
    def _check_schema(cls, value: str) -> str:
        if not _SCHEMA_RE.match(value) or value.startswith("pg_") or value in _NOT_OURS:
            raise ValueError(
                "must be a lower-case SQL identifier of 1-63 letters, digits and '_' "
                "(not public, information_schema or pg_*)"
            )
        return value

    @field_validator("amqp_prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError("must be 1-64 letters, digits, '.', '_' or '-'")
        return value

    @model_validator(mode="after")
    def _refuse_default_credentials_in_production(self) -> Settings:
        if self.environment == "production" and "guest:guest@" in self.amqp_url:
            raise ValueError("amqp_url uses the guest/guest placeholder in production")
        if self.db_pool_min > self.db_pool_max:
            raise ValueError("db_pool_min is larger than db_pool_max")
        return self

    @model_validator(mode="after")
    def _check_worker_prefetch(self) -> Settings:
        if self.worker_prefetch is not None and self.worker_prefetch > self.worker_concurrency:
            raise ValueError(
                "worker_prefetch is larger than worker_concurrency: the extra deliveries "
                "would only wait, and every worker restart counts toward their delivery limit"
            )
        return self

    @model_validator(mode="after")
    def _check_events_switch(self) -> Settings:
        if not self.job_events and self.database_pooler == "pgbouncer":
            # The switch is a session setting, which a transaction-mode pool does not keep:
            # some statements would write events and others not, and the timeline would
            # say none were recorded.
            raise ValueError(
                "JOBCORE_JOB_EVENTS=false needs a session setting, which PgBouncer in "
                "transaction mode does not keep: keep the timeline on behind PgBouncer"
            )
        return self

    @property
    def longest_redelivery(self) -> float:
        """Seconds within which the broker has redelivered (or dead-lettered) a message
        for the last time after it first delivered it: each of up to ``amqp_delivery_limit``
        deliveries can stay unacknowledged for at most ``amqp_consumer_timeout``."""
        return self.amqp_delivery_limit * self.amqp_consumer_timeout

    @property
    def quota_defaults(self) -> Quotas:
        return Quotas(
            enqueue_rate=self.quota_enqueue_rate,
            enqueue_burst=self.quota_enqueue_burst,
            max_unfinished=self.quota_max_unfinished,
            max_long_polls=self.quota_max_long_polls,
        )

    def retention(self, status: str, job_type: str) -> timedelta:
        """How long a finished job of this status and type is kept."""
        override = self.retention_types.get(job_type, {}).get(status)
        if override is not None:
            return override
        return {
            "succeeded": self.retention_succeeded,
            "failed": self.retention_failed,
            "cancelled": self.retention_cancelled,
        }[status]

    def job_prefetch(self, concurrency: int | None = None) -> int:
        """The prefetch of a worker running ``concurrency`` handlers at once (default: the
        setting): ``worker_prefetch`` if set, but never more than the handler slots."""
        slots = concurrency or self.worker_concurrency
        return min(self.worker_prefetch or slots, slots)

    @property
    def prepared_statements(self) -> bool:
        """Whether connections to ``database_url`` may prepare statements on the server
        (psycopg prepares a query it ran five times): not behind PgBouncer in transaction
        mode, which 1.21 and later only support with ``max_prepared_statements``."""
        return self.database_pooler == "none"

    @property
    def listen_url(self) -> str | None:
        """Where LISTEN connections go; None: nowhere, listeners poll instead."""
        if self.listen_database_url:
            return self.listen_database_url
        return self.database_url if self.database_pooler == "none" else None

    @cached_property
    def sqlalchemy_url(self) -> str:
        """The URL for SQLAlchemy (Alembic). Several hosts (a failover pair) move to the
        query string, ``?host=a:5432&host=b:5432``, the only form SQLAlchemy parses: its URL
        takes one port, and libpq's ``a:5432,b:5432`` is not one."""
        parts = urlsplit(self.database_url)
        hosts = database_hosts(parts.netloc)
        if len(hosts) < 2:
            return self.database_url.replace("postgresql://", "postgresql+psycopg://", 1)
        userinfo = parts.netloc.rpartition("@")[0]
        query = "&".join(
            [f"host={host}" + (f":{port}" if port else "") for host, port in hosts]
            + ([parts.query] if parts.query else [])
        )
        netloc = f"{userinfo}@" if userinfo else ""
        return urlunsplit(("postgresql+psycopg", netloc, parts.path, query, ""))

    @property
    def amqp_urls(self) -> tuple[str, ...]:
        """The brokers of ``amqp_url``, in the order given: the nodes of one cluster."""
        return tuple(self.amqp_url.split(","))

    @cached_property
    def database_name(self) -> str:
        return urlsplit(self.database_url).path.lstrip("/")

    def maintenance_database_url(self) -> str:
        """The same server's ``postgres`` database, used to create a missing database."""
        parts = urlsplit(self.database_url)
        return urlunsplit((parts.scheme, parts.netloc, "/postgres", parts.query, ""))


def database_hosts(netloc: str) -> list[tuple[str, int | None]]:
    """The hosts of a PostgreSQL URL's network location, in order, with their ports: one,
    or several for failover (``user@a:5432,b:5432``, libpq's form, which ``urlsplit``
    cannot take apart: its ``.port`` raises). Empty when the URL names none (a socket
    directory or ``?host=`` in the query). A ValueError never quotes the URL, which may
    hold a password."""
    hostlist = netloc.rpartition("@")[2]
    if not hostlist:
        return []
    hosts: list[tuple[str, int | None]] = []
    for number, entry in enumerate(hostlist.split(","), start=1):
        if entry.startswith("["):  # [IPv6]:port
            host, _, rest = entry[1:].partition("]")
            port = rest.removeprefix(":") if rest.startswith(":") else rest
        else:
            host, _, port = entry.partition(":")
        if not host:
            raise ValueError(f"names no host in its host number {number}")
        if port and not (port.isdigit() and 0 < int(port) <= 65535):
            raise ValueError(f"has a bad port in its host number {number}")
        hosts.append((f"[{host}]" if entry.startswith("[") else host, int(port) if port else None))
    return hosts


def load_settings(**overrides: object) -> Settings:
    """Build settings from the environment, turning a validation error into one line.

    The line names the environment variable, never the value (which may hold a password).
    """
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        name = f"{ENV_PREFIX}{field.upper()}" if field else "settings"
        message = str(first["msg"]).removeprefix("Value error, ")
        raise ConfigurationError(f"{name}: {message}") from None


# --- the relay's tuning -------------------------------------------------------------------

RELAY_ENV_PREFIX = "JOBCORE_RELAY_"


class RelayOptions(BaseSettings):
    """Relay tuning that :class:`Settings` does not carry (``JOBCORE_RELAY_*`` as well).

    Knobs for operators and tests (small backoffs make fault tests fast); the defaults are
    what production wants. Validated at start-up like :class:`Settings`.
    """

    model_config = SettingsConfigDict(env_prefix=RELAY_ENV_PREFIX, extra="ignore", frozen=True)

    # Outbox rows claimed per batch (JOBCORE_RELAY_BATCH_SIZE).
    batch_size: int = Field(default=500, ge=1, le=10_000)
    # Seconds between polls when no NOTIFY arrives (JOBCORE_RELAY_POLL_INTERVAL).
    poll_interval: float = Field(default=1.0, gt=0, le=60)
    # Only for a publish that fails in a way nothing classifies (an error the AMQP client
    # raises for one message: neither the broker's refusal nor a broken connection): a
    # row failing so this many times is quarantined. A nack, a return or a missing
    # exchange is retried until the broker takes it; a malformed or too large message is
    # quarantined at once (jobcore.amqp.publisher.Failure).
    max_publish_attempts: int = Field(default=10, ge=1, le=1000)
    # The relay's health and metrics server (JOBCORE_RELAY_HEALTH_PORT; 0: any free port).
    health_port: int = Field(default=8001, ge=0, le=65535)
    # LISTEN on the outbox channel; with it off the relay finds work by polling alone
    # (as behind PgBouncer in transaction mode, where NOTIFY does not arrive).
    listen: bool = True
    # Batches claimed and published at once, each in its own transaction: one lane's
    # database round trips overlap the other's wait for confirms.
    lanes: int = Field(default=2, ge=1, le=16)
    # While not saturated (the last claim left nothing due), a NOTIFY that arrives while a
    # batch waits for its confirms starts the next batch at once, up to `lanes` in flight
    # (JOBCORE_RELAY_OVERLAP). Off by default until a quiet machine shows it shortens the
    # pickup (docs/bench/paced); off, a trickle's rows wait for the batch before theirs.
    overlap: bool = False
    # A batch whose confirms do not all arrive in this time counts as a broken connection.
    publish_timeout: float = Field(default=10.0, gt=0, le=600)
    connect_timeout: float = Field(default=5.0, gt=0, le=120)
    reconnect_base_delay: float = Field(default=0.2, gt=0, le=60)
    reconnect_max_delay: float = Field(default=30.0, gt=0, le=600)
    # Backoff of a row whose message the broker refused (nacked, returned, no exchange):
    # retried until the broker takes it. The cap bounds how long a restored queue waits to
    # be used: its rows retry within a minute (30 s on average, full jitter), and a row
    # that keeps failing costs one publish a minute (10,000 of them: ~170 publishes/s, a
    # few percent of one relay). 300 s made a deploy's missing queue cost jobs 5 minutes.
    retry_base_delay: float = Field(default=1.0, gt=0, le=3600)
    retry_max_delay: float = Field(default=60.0, gt=0, le=86_400)
    # A return for a route this relay declares (or a missing exchange of its own) means a
    # queue, binding or exchange was deleted under it: it declares its topology again, at
    # most once per this many seconds however many messages come back (a declaration is a
    # few round trips per queue; per message it would flood the broker).
    redeclare_interval: float = Field(default=10.0, gt=0, le=3600)
    # Bodies over this are quarantined without being sent: RabbitMQ closes the channel of a
    # message over its `max_message_size` (default 128 MiB, at most 512 MiB), which would
    # fail the whole batch each time. Set it to the broker's value; a lower broker limit is
    # also learned from the broker's refusal.
    max_message_bytes: int = Field(default=DEFAULT_MAX_MESSAGE_SIZE, ge=1024, le=512 * 1024 * 1024)
    # The backlog query scans the outbox; probes within this many seconds share one answer.
    backlog_cache_seconds: float = Field(default=1.0, ge=0, le=60)
    # Claim the outbox round-robin between the tenants with due rows, per routing key
    # (jobcore.database.sql.outbox.OUTBOX_CLAIM_FAIR), so one tenant's backlog does not hold up
    # another's new job. Off: oldest first whoever's it is (the claim before fairness,
    # kept as the bench's baseline), which needs queue_depth_limit 0.
    fair_claim: bool = True
    # Ready messages a broker queue may hold before this relay stops publishing to it: the
    # backlog waits in PostgreSQL, where the fair claim orders it, and a new job waits
    # behind at most this many messages in the queue. Large enough that workers never
    # starve between two refills, small enough that a quiet tenant's job starts soon
    # (docs/bench/measurements.md, "The relay's queue depth limit"). 0: no limit.
    queue_depth_limit: int = Field(default=1000, ge=0, le=1_000_000)
    # VACUUM the outbox after this relay deleted this many rows since its last one
    # (jobcore.maintenance.table_vacuum): without it, the dead index entries a drain
    # leaves slow every later claim until autovacuum comes by. A small outbox is vacuumed
    # every 1,000 rows too (VACUUM_SMALL_EVERY, services/relay/relay.py). 0: neither, leave
    # it to autovacuum.
    vacuum_every: int = Field(default=100_000, ge=0, le=100_000_000)

    @model_validator(mode="after")
    def _depth_limit_needs_fair_claim(self) -> RelayOptions:
        if self.queue_depth_limit and not self.fair_claim:
            raise ValueError(
                "queue_depth_limit needs fair_claim (the FIFO claim has no per-queue budget); "
                "set JOBCORE_RELAY_QUEUE_DEPTH_LIMIT=0 with JOBCORE_RELAY_FAIR_CLAIM=false"
            )
        return self


def load_relay_options(**overrides: object) -> RelayOptions:
    try:
        return RelayOptions(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        name = f"{RELAY_ENV_PREFIX}{field.upper()}" if field else "relay options"
        raise ConfigurationError(f"{name}: {first['msg']}") from None
