"""Statements on ``job_type_registry``: what the workers' registries declare of each job
type, which ``jobcore.enqueue()`` (migration 0026) checks an enqueue from SQL against.
"""

from __future__ import annotations

from typing import TypedDict

from jobcore.database.sql import Query


class JobTypeRegisterParams(TypedDict):
    """A worker's job types, as parallel arrays (one element per type), and what its
    deployment says of all of them."""

    types: list[str]
    queues: list[str]
    routing_keys: list[str]
    max_attempts: list[int]
    priorities: list[int]
    unique_fields: list[str | None]
    concurrency_pers: list[str | None]
    concurrency_limits: list[int | None]
    rate_pers: list[str | None]
    rate_per_seconds: list[float | None]
    rate_bursts: list[int | None]
    ordering_blocks: list[bool]
    schema_hashes: list[str]
    exchange: str
    max_payload_bytes: int
    quota_enqueue_rate: float
    quota_enqueue_burst: int
    quota_max_unfinished: int
    worker_version: str
    registered_by: str


# Every worker runs it when it starts: a row whose declaration did not change is left
# as it is (no row version, and registered_at says since when the declaration holds).
# Types no longer registered stay: another worker may still run them.
JOB_TYPE_REGISTER = Query[JobTypeRegisterParams](
    "job_type_register",
    "Record a worker's job types and its deployment's limits for them; how many changed.",
    """
    INSERT INTO jobcore.job_type_registry AS r (
        type, queue, exchange, routing_key, max_attempts, priority, unique_field,
        concurrency_per, concurrency_limit, rate_per, rate_per_second, rate_burst,
        ordering_blocks, max_payload_bytes, quota_enqueue_rate, quota_enqueue_burst,
        quota_max_unfinished, schema_hash, worker_version, registered_by
    )
    SELECT t.type, t.queue, %(exchange)s, t.routing_key, t.max_attempts, t.priority,
           t.unique_field, t.concurrency_per, t.concurrency_limit, t.rate_per,
           t.rate_per_second, t.rate_burst, t.ordering_blocks, %(max_payload_bytes)s,
           %(quota_enqueue_rate)s, %(quota_enqueue_burst)s, %(quota_max_unfinished)s,
           t.schema_hash, %(worker_version)s, %(registered_by)s
    FROM unnest(
        %(types)s::text[], %(queues)s::text[], %(routing_keys)s::text[],
        %(max_attempts)s::int[], %(priorities)s::smallint[], %(unique_fields)s::text[],
        %(concurrency_pers)s::text[], %(concurrency_limits)s::int[], %(rate_pers)s::text[],
        %(rate_per_seconds)s::float8[], %(rate_bursts)s::int[], %(ordering_blocks)s::bool[],
        %(schema_hashes)s::text[]
    ) AS t(type, queue, routing_key, max_attempts, priority, unique_field, concurrency_per,
           concurrency_limit, rate_per, rate_per_second, rate_burst, ordering_blocks,
           schema_hash)
    ORDER BY t.type
    ON CONFLICT (type) DO UPDATE SET
        (queue, exchange, routing_key, max_attempts, priority, unique_field,
         concurrency_per, concurrency_limit, rate_per, rate_per_second, rate_burst,
         ordering_blocks, max_payload_bytes, quota_enqueue_rate, quota_enqueue_burst,
         quota_max_unfinished, schema_hash, worker_version, registered_by, registered_at)
        = (excluded.queue, excluded.exchange, excluded.routing_key, excluded.max_attempts,
           excluded.priority, excluded.unique_field, excluded.concurrency_per,
           excluded.concurrency_limit, excluded.rate_per, excluded.rate_per_second,
           excluded.rate_burst, excluded.ordering_blocks, excluded.max_payload_bytes,
           excluded.quota_enqueue_rate, excluded.quota_enqueue_burst,
           excluded.quota_max_unfinished, excluded.schema_hash, excluded.worker_version,
           excluded.registered_by, now())
    WHERE (r.queue, r.exchange, r.routing_key, r.max_attempts, r.priority, r.unique_field,
           r.concurrency_per, r.concurrency_limit, r.rate_per, r.rate_per_second,
           r.rate_burst, r.ordering_blocks, r.max_payload_bytes, r.quota_enqueue_rate,
           r.quota_enqueue_burst, r.quota_max_unfinished, r.schema_hash, r.worker_version)
          IS DISTINCT FROM
          (excluded.queue, excluded.exchange, excluded.routing_key, excluded.max_attempts,
           excluded.priority, excluded.unique_field, excluded.concurrency_per,
           excluded.concurrency_limit, excluded.rate_per, excluded.rate_per_second,
           excluded.rate_burst, excluded.ordering_blocks, excluded.max_payload_bytes,
           excluded.quota_enqueue_rate, excluded.quota_enqueue_burst,
           excluded.quota_max_unfinished, excluded.schema_hash, excluded.worker_version)
    """,
)
