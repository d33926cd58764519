"""What a worker records of its job types in ``job_type_registry`` when it starts, for
``jobcore.enqueue()``, the enqueue from SQL (docs/how-to/enqueue-in-transaction.md): each
type's queue, limits, flow control and a hash of its payload's JSON schema, and what the
worker's deployment says of its jobs (the jobs exchange, the inline payload limit, the
tenant quota defaults).

Recorded on the worker's first connection (:func:`recording_first_check`), so a worker
that starts while the database is down records them once it answers. A schema from
before the table (the previous release's, during an upgrade) is skipped with a log line:
the SQL function does not exist there either.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import psycopg

import jobcore
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import AsyncConn
from jobcore.database.store.job_types import JobTypeRegisterParams, job_type_store
from jobcore.execution.registry import JobType, Registry
from jobcore.kernel.settings import Settings

log = logging.getLogger(__name__)


def schema_hash(job_type: JobType[Any]) -> str:
    """sha256 of the payload model's JSON schema (keys sorted): equal on workers whose
    models take the same payloads."""
    schema = job_type.payload_model.model_json_schema()
    return hashlib.sha256(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)).hexdigest()


def register_params(
    registry: Registry, settings: Settings, *, registered_by: str
) -> JobTypeRegisterParams:
    """The rows of ``registry``'s job types, as ``settings``' deployment enqueues them."""
    topology = Topology.from_settings(settings)
    types = sorted(registry, key=lambda t: t.name)
    quotas = settings.quota_defaults
    return {
        "types": [t.name for t in types],
        "queues": [t.queue for t in types],
        "routing_keys": [topology.routing_key(t.queue) for t in types],
        "max_attempts": [t.max_attempts for t in types],
        "priorities": [int(t.priority) for t in types],
        "unique_fields": [t.unique_field for t in types],
        "concurrency_pers": [None if t.concurrency is None else t.concurrency.per for t in types],
        "concurrency_limits": [None if t.concurrency is None else t.concurrency.n for t in types],
        "rate_pers": [None if t.rate is None else t.rate.per for t in types],
        "rate_per_seconds": [None if t.rate is None else t.rate.per_second for t in types],
        "rate_bursts": [None if t.rate is None else t.rate.burst for t in types],
        "ordering_blocks": [t.ordering == "block" for t in types],
        "schema_hashes": [schema_hash(t) for t in types],
        "exchange": topology.jobs_exchange,
        "max_payload_bytes": settings.inline_payload_max_bytes,
        "quota_enqueue_rate": quotas.enqueue_rate,
        "quota_enqueue_burst": quotas.enqueue_burst,
        "quota_max_unfinished": quotas.max_unfinished,
        "worker_version": jobcore.__version__,
        "registered_by": registered_by,
    }


async def record_job_types(
    conn: AsyncConn, registry: Registry, settings: Settings, *, registered_by: str
) -> int:
    """Upsert ``registry``'s job types on ``conn`` (autocommit: the one statement commits
    alone); how many rows changed. None recorded on a schema without the table."""
    params = register_params(registry, settings, registered_by=registered_by)
    if not params["types"]:
        return 0
    try:
        return await job_type_store.register(conn, params)
    except psycopg.errors.UndefinedTable:
        log.info("the schema has no job_type_registry yet; job types not recorded")
        return 0


def recording_first_check(
    check: Callable[[AsyncConn], Awaitable[None]],
    registry: Registry,
    settings: Settings,
    *,
    registered_by: str,
) -> Callable[[AsyncConn], Awaitable[None]]:
    """A pool's first check (:class:`jobcore.database.gateway.Database`): ``check``, then the job
    types recorded, on the first connection that passes it."""

    async def first_check(conn: AsyncConn) -> None:
        await check(conn)
        await record_job_types(conn, registry, settings, registered_by=registered_by)

    return first_check
