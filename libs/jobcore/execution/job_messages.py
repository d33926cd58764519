"""A job message's outbox row: what enqueue, a retry, the reaper, the gate releaser and the
anti-entropy sweeper write for the relay to publish (the envelope of
:mod:`jobcore.kernel.envelope`, routed by the topology, with the job's trace context as
headers).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from psycopg.types.json import Jsonb

from jobcore.amqp.topology import Topology
from jobcore.database.store import OutboxMessageParams, OutboxMessagesParams
from jobcore.execution.registry import JobType
from jobcore.kernel.envelope import JobMessage


def job_message_row(
    topology: Topology,
    *,
    job_id: uuid.UUID,
    job_type: JobType[Any],
    attempt: int,
    trace_headers: dict[str, str],
    message_id: uuid.UUID | None = None,
) -> OutboxMessageParams:
    """The outbox columns for one job message (used by enqueue, retries and the reaper);
    ``message_id``: a fresh one when None. An enqueue gives its job's first message the
    job's id, which the claim then need not keep on the job row
    (jobcore.database.sql.jobs.run, ``_KEEP_PUBLISH``)."""
    return message_row(
        topology,
        job_id=job_id,
        type_name=job_type.name,
        queue=job_type.queue,
        attempt=attempt,
        trace_headers=trace_headers,
        message_id=message_id,
    )


def trace_headers_of(row: Mapping[str, Any]) -> dict[str, str]:
    """The trace context a job row keeps, as message headers."""
    return {k: row[k] for k in ("traceparent", "tracestate") if row[k] is not None}


def next_attempt_message(topology: Topology, row: Mapping[str, Any]) -> OutboxMessageParams:
    """The message for the next attempt of a locked job row (id, type, queue, attempts and
    its trace context): what the gate releaser and the anti-entropy sweeper publish."""
    return message_row(
        topology,
        job_id=row["id"],
        type_name=row["type"],
        queue=row["queue"],
        attempt=row["attempts"] + 1,
        trace_headers=trace_headers_of(row),
    )


def message_columns(messages: Sequence[OutboxMessageParams]) -> OutboxMessagesParams:
    """Messages as the parallel arrays a many-row statement unnests."""
    return {
        "message_ids": [m["message_id"] for m in messages],
        "exchanges": [m["exchange"] for m in messages],
        "routing_keys": [m["routing_key"] for m in messages],
        "message_types": [m["message_type"] for m in messages],
        "headers": [m["headers"] for m in messages],
        "bodies": [m["body"] for m in messages],
    }


def message_row(
    topology: Topology,
    *,
    job_id: uuid.UUID,
    type_name: str,
    queue: str,
    attempt: int,
    trace_headers: dict[str, str],
    message_id: uuid.UUID | None = None,
) -> OutboxMessageParams:
    """The same from a job row's type and queue, for callers that may not have the job
    type registered (the sweeper publishes whatever is stranded)."""
    return {
        "message_id": uuid.uuid4() if message_id is None else message_id,
        "exchange": topology.jobs_exchange,
        "routing_key": topology.routing_key(queue),
        "message_type": type_name,
        "headers": Jsonb(trace_headers),
        "body": JobMessage(job_id=job_id, attempt=attempt, type=type_name).encode(),
    }
