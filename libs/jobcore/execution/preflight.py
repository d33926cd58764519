"""Start-up checks of settings that are each valid alone but together could deadlock.

Each check raises :class:`~jobcore.kernel.errors.ConfigurationError` with one line naming the
variables involved, so a process refuses to start instead of hanging or looping later:

- a worker's pool too small for what it holds at once (:func:`held_connections`);
- a relay whose claim transaction could outlive the server's idle-in-transaction limit
  while it waits for confirms (:func:`check_relay_timeouts`);
- a job type that could keep deliveries waiting past the broker's ``consumer_timeout``
  (:func:`check_job_types`). A job type on a reserved queue is refused by the registry.
"""

from __future__ import annotations

from collections.abc import Mapping

from jobcore.execution.registry import Registry
from jobcore.kernel.errors import ConfigurationError
from jobcore.kernel.settings import Settings

# The worker's hot path keeps this many connections at least: one for the claim batch and
# one for the outcome batch, so neither waits behind the other; heartbeats share them.
MIN_HELD_CONNECTIONS = 2

# Of the server's idle-in-transaction limit, the share a relay's wait for confirms may use;
# the rest is left for the event loop's own delays under load.
RELAY_IDLE_SHARE = 0.75


def held_connections(settings: Settings, pool_users: Mapping[str, int]) -> int:
    """How many pool connections a worker's hot path (claims, outcomes, heartbeats) keeps.

    ``pool_users`` counts everything else that takes connections from the same pool at
    once: the cancel listener's LISTEN connection (held for the process's life), one per
    maintenance service (each takes one per round), the webhook deliverer. Each gets its
    own, so none waits for another past the pool's checkout timeout; the hot path keeps
    the rest, and at least :data:`MIN_HELD_CONNECTIONS`.
    """
    reserved = sum(pool_users.values())
    held = settings.db_pool_max - reserved
    if held < MIN_HELD_CONNECTIONS:
        users = ", ".join(f"{count} for the {name}" for name, count in pool_users.items())
        raise ConfigurationError(
            f"JOBCORE_DB_POOL_MAX: {settings.db_pool_max} connections are too few for this "
            f"worker, which needs {reserved + MIN_HELD_CONNECTIONS} at once "
            f"({MIN_HELD_CONNECTIONS} for claims and outcomes, {users})"
        )
    return held


def check_relay_timeouts(
    settings: Settings, *, publish_timeout: float, connect_timeout: float
) -> None:
    """Refuse a relay whose claim transaction may sit idle too long.

    A batch is claimed in a transaction that stays open while its confirms are awaited:
    up to ``publish_timeout``, then, when they never came, the broker connection's close
    (up to ``connect_timeout``). The server ends a transaction idle for twice
    ``db_operation_timeout`` (:class:`~jobcore.database.gateway.Database`); a batch cut off that way
    is published again every time, duplicating its messages instead of progressing.
    """
    idle = publish_timeout + connect_timeout
    limit = 2 * settings.db_operation_timeout
    if idle > RELAY_IDLE_SHARE * limit:
        raise ConfigurationError(
            "JOBCORE_RELAY_PUBLISH_TIMEOUT: with JOBCORE_RELAY_CONNECT_TIMEOUT it keeps a "
            f"claim transaction idle up to {idle:g}s, too close to the {limit:g}s after "
            "which the server ends it (twice JOBCORE_DB_OPERATION_TIMEOUT): keep it within "
            f"{RELAY_IDLE_SHARE * limit - connect_timeout:g}s or raise "
            "JOBCORE_DB_OPERATION_TIMEOUT"
        )


def check_job_types(registry: Registry, settings: Settings) -> None:
    """Refuse a job type that could keep deliveries unacknowledged past the broker's
    ``consumer_timeout``.

    A delivery waits, unacknowledged, for a handler slot; a slot frees when its job ends:
    after at most the job type's timeout, plus up to a lease length to write the outcome.
    A wait past ``consumer_timeout`` makes the broker close the channel and requeue every
    delivery on it, each requeue counting toward the delivery limit.
    """
    for job_type in registry:
        held_for = job_type.timeout + job_type.lease
        if held_for >= settings.amqp_consumer_timeout:
            raise ConfigurationError(
                f"JOBCORE_AMQP_CONSUMER_TIMEOUT: job type {job_type.name!r} "
                f"({job_type.handler.__module__}) may hold a handler slot for "
                f"{held_for:g}s (timeout {job_type.timeout:g}s + lease {job_type.lease:g}s), "
                f"not less than the broker's consumer_timeout of "
                f"{settings.amqp_consumer_timeout:g}s: deliveries waiting for that slot "
                "would be requeued; shorten the job type's timeout or raise consumer_timeout "
                "on the broker and here"
            )
