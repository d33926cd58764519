"""Typed settings, read from ``JOBCORE_*`` environment variables and validated at start-up."""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from jobcore.errors import ConfigurationError

ENV_PREFIX = "JOBCORE_"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Settings(BaseSettings):
    """Every setting has a default that reaches PostgreSQL and RabbitMQ on localhost."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    environment: Literal["development", "test", "production"] = "development"

    # PostgreSQL. Runtime code uses psycopg with this URL; Alembic gets the SQLAlchemy form.
    database_url: str = "postgresql://postgres@127.0.0.1:5432/jobcore"
    db_pool_min: int = Field(default=1, ge=0, le=100)
    db_pool_max: int = Field(default=8, ge=1, le=200)
    db_connect_timeout: float = Field(default=5.0, gt=0, le=120)
    # How long one database operation (a statement, a commit) may wait for the server
    # before its connection counts as dead and is dropped: across a silently cut network
    # (no FIN, no RST) it would otherwise wait forever. The server ends a transaction left
    # idle twice as long, so one whose client vanished does not keep its locks.
    db_operation_timeout: float = Field(default=30.0, gt=0, le=3600)

    # RabbitMQ.
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
    job_modules: Annotated[tuple[str, ...], NoDecode] = ("jobcore.jobtypes",)

    # API.
    api_host: str = "127.0.0.1"
    api_port: int = Field(default=8000, ge=0, le=65535)
    max_body_bytes: int = Field(default=256 * 1024, ge=1024, le=64 * 1024 * 1024)

    # Where the relay's and the worker's health servers listen (0.0.0.0 in containers).
    health_host: str = "127.0.0.1"

    # Relay.
    relay_batch_size: int = Field(default=500, ge=1, le=10_000)
    relay_poll_interval: float = Field(default=1.0, gt=0, le=60)
    relay_max_publish_attempts: int = Field(default=10, ge=1, le=1000)
    relay_health_port: int = Field(default=8001, ge=0, le=65535)

    # Worker.
    worker_concurrency: int = Field(default=16, ge=1, le=10_000)
    # Unacknowledged job deliveries per worker (default: its concurrency, and never more).
    # A delivery is acknowledged when its claim commits, so prefetch counts deliveries
    # waiting for a handler slot, not running jobs. More waiting than there are slots to
    # free gains nothing, and costs: when a worker stops or dies the broker requeues them,
    # and each requeue counts toward the quorum queue's delivery limit
    # (amqp_delivery_limit), so restarts alone could dead-letter a healthy job.
    worker_prefetch: int | None = Field(default=None, ge=1, le=10_000)
    worker_health_port: int = Field(default=8002, ge=0, le=65535)
    result_dir: Path = Path("var/results")
    # Results whose JSON is larger than this go to the result store, not the job row.
    inline_result_max_bytes: int = Field(default=16 * 1024, ge=0, le=1024 * 1024)
    # A failed attempt waits a random time in [0, min(cap, base * 2**(attempt-1))] seconds.
    retry_backoff_base: float = Field(default=2.0, gt=0, le=3600)
    retry_backoff_cap: float = Field(default=600.0, gt=0, le=86_400)
    # How often the reaper looks for expired leases; its own lease lasts three intervals.
    worker_reaper_interval: float = Field(default=5.0, gt=0, le=3600)
    # How often the rescuer fails pending jobs whose message was quarantined: rare, and no
    # index serves quarantined rows (its query scans the outbox), so less often than the
    # reaper.
    worker_rescuer_interval: float = Field(default=30.0, gt=0, le=3600)

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

    @field_validator("database_url")
    @classmethod
    def _normalise_database_url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        scheme = parts.scheme.split("+", 1)[0]
        if scheme not in {"postgresql", "postgres"}:
            raise ValueError("must be a postgresql:// URL")
        if not parts.hostname and "host=" not in parts.query:
            raise ValueError("must name a host")
        if not parts.path.strip("/"):
            raise ValueError("must name a database")
        return urlunsplit(("postgresql", parts.netloc, parts.path, parts.query, ""))

    @field_validator("amqp_url")
    @classmethod
    def _check_amqp_url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in {"amqp", "amqps"}:
            raise ValueError("must be an amqp:// or amqps:// URL")
        if not parts.hostname:
            raise ValueError("must name a host")
        try:
            _ = parts.port  # urlsplit checks the port only when asked
        except ValueError as exc:
            raise ValueError(f"has a bad port: {exc}") from None
        return value.strip()

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

    @property
    def longest_redelivery(self) -> float:
        """Seconds within which the broker has redelivered (or dead-lettered) a message
        for the last time after it first delivered it: each of up to ``amqp_delivery_limit``
        deliveries can stay unacknowledged for at most ``amqp_consumer_timeout``."""
        return self.amqp_delivery_limit * self.amqp_consumer_timeout

    def job_prefetch(self, concurrency: int | None = None) -> int:
        """The prefetch of a worker running ``concurrency`` handlers at once (default: the
        setting): ``worker_prefetch`` if set, but never more than the handler slots."""
        slots = concurrency or self.worker_concurrency
        return min(self.worker_prefetch or slots, slots)

    @cached_property
    def sqlalchemy_url(self) -> str:
        return self.database_url.replace("postgresql://", "postgresql+psycopg://", 1)

    @cached_property
    def database_name(self) -> str:
        return urlsplit(self.database_url).path.lstrip("/")

    def maintenance_database_url(self) -> str:
        """The same server's ``postgres`` database, used to create a missing database."""
        parts = urlsplit(self.database_url)
        return urlunsplit((parts.scheme, parts.netloc, "/postgres", parts.query, ""))


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
