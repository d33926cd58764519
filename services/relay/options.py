"""Relay tuning that the shared settings do not carry (``JOBCORE_RELAY_*`` as well).

These are knobs for operators and tests (small backoffs make fault tests fast); the
defaults are what production wants. Validated at start-up like the shared settings.
"""

from __future__ import annotations

from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from jobcore.amqp.publisher import DEFAULT_MAX_MESSAGE_SIZE
from jobcore.errors import ConfigurationError

ENV_PREFIX = "JOBCORE_RELAY_"


class RelayOptions(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    # LISTEN on the outbox channel; with it off the relay finds work by polling alone
    # (as behind PgBouncer in transaction mode, where NOTIFY does not arrive).
    listen: bool = True
    # Batches claimed and published at once, each in its own transaction: one lane's
    # database round trips overlap the other's wait for confirms.
    lanes: int = Field(default=2, ge=1, le=16)
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


def load_relay_options(**overrides: object) -> RelayOptions:
    try:
        return RelayOptions(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        name = f"{ENV_PREFIX}{field.upper()}" if field else "relay options"
        raise ConfigurationError(f"{name}: {first['msg']}") from None
