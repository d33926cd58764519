"""Changing a pending job in place: its run_at, priority and payload (``PATCH /jobs/{id}``,
``jobcore jobs edit``, the console's edit form; :mod:`jobcore.usecases.job_edits`).

A client edits the version of the job it read (``jobs.xmin``, the API's ETag): the use
case locks the row (JOB_LOCK_FOR_EDIT) and decides, on the row as it is now, whether the
job may still change (pending: never claimed since, or back to pending) and whether it
is the version the client read; then JOB_EDIT changes it, its event and its message in
one statement. The lock orders the edit against the worker's claim, which updates the
same row: a claim that committed first leaves the job running, and the edit is refused;
an edit that committed first is what the claim, which re-reads the row it waited for,
returns to its handler. A running attempt therefore never sees a change, and a change is
never lost to an attempt that started with the old data.

The job's message: the handler's payload comes from the row at the claim, never from the
message, so a message published before an edit runs the edited payload. What an edit
must stop is a message that claims the job earlier than its new run_at: the unpublished
message is moved (its outbox row's due time and priority), and a message already
published, or being published by a relay right now (its row locked: skipped), is
superseded by a new one due at the new time; ``not_before`` (the new run_at) makes the
claim of any earlier message of the attempt claim nothing (jobcore.database.sql.jobs.run).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TypedDict

from psycopg.types.json import Jsonb

from jobcore.database.sql import OutboxMessageParams, Query, status_is
from jobcore.database.sql.job_events import EVENTS_ON
from jobcore.kernel.jobevents import JobEventKind
from jobcore.kernel.states import JobStatus


class JobLockForEditParams(TypedDict):
    id: uuid.UUID
    # None: any tenant's (operators).
    tenant: str | None


JOB_LOCK_FOR_EDIT = Query[JobLockForEditParams](
    "job_lock_for_edit",
    "Lock a job for an edit and read what the edit is decided on: its status, its version, "
    "and the keys a new payload must keep.",
    """
    SELECT id, tenant, type, queue, status, attempts, xmin::text AS version, payload,
           unique_key, concurrency_key, rate_key, ordering_key, priority, next_attempt_at,
           traceparent, tracestate
    FROM jobcore.jobs
    WHERE id = %(id)s AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s)
    FOR UPDATE
    """,
)


class JobEditParams(OutboxMessageParams):
    id: uuid.UUID
    version: str
    # None: unchanged.
    payload: Jsonb | None
    priority: int | None
    run_at: datetime | None
    # What the event names: the fields changed, and who changed them.
    fields: list[str]
    actor: str
    channel: str


# Fenced by status and version, though the caller holds the row's lock and checked both:
# the statement is then safe to run on its own. Only the job's own messages move
# (`message_type` is its type: a webhook's row is not one), and a row a relay holds
# (publishing it now) is left to it and counted as published. The superseding message
# is written when the run_at or the priority changed and no unpublished message moved;
# a payload alone needs none (the claim reads the row). Returns the new version.
JOB_EDIT = Query[JobEditParams](
    "job_edit",
    "Change a pending job's run_at, priority or payload if it is still the version read, "
    "moving its unpublished message or superseding the published one, with its edited event.",
    f"""
    WITH edited AS (
        UPDATE jobcore.jobs
        SET payload = coalesce(%(payload)s::jsonb, payload),
            payload_ref = CASE WHEN %(payload)s::jsonb IS NULL THEN payload_ref END,
            priority = coalesce(%(priority)s::smallint, priority),
            next_attempt_at = coalesce(%(run_at)s::timestamptz, next_attempt_at),
            not_before = coalesce(%(run_at)s::timestamptz, not_before),
            updated_at = now()
        WHERE id = %(id)s AND {status_is("status", JobStatus.PENDING)}
          AND xmin::text = %(version)s
        RETURNING id, tenant, type, priority, attempts, xmin::text AS version,
                  greatest(created_at, next_attempt_at) AS due_at
    ), waiting AS (
        SELECT outbox.id
        FROM jobcore.outbox JOIN edited ON outbox.job_id = edited.id
        WHERE outbox.message_type = edited.type
        FOR UPDATE OF outbox SKIP LOCKED
    ), moved AS (
        UPDATE jobcore.outbox
        SET available_at = CASE WHEN %(run_at)s::timestamptz IS NULL THEN outbox.available_at
                                ELSE edited.due_at END,
            priority = edited.priority
        FROM edited, waiting
        WHERE outbox.id = waiting.id
        RETURNING outbox.id
    ), superseding AS (
        INSERT INTO jobcore.outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id, tenant,
            available_at, priority, created_at
        )
        SELECT %(message_id)s, %(exchange)s, %(routing_key)s, %(message_type)s,
               %(headers)s, %(body)s, edited.id, edited.tenant,
               greatest(edited.due_at, statement_timestamp()), edited.priority,
               statement_timestamp()
        FROM edited
        WHERE NOT EXISTS (SELECT 1 FROM moved)
          AND (%(run_at)s::timestamptz IS NOT NULL OR %(priority)s::smallint IS NOT NULL)
        RETURNING id
    ), edit_events AS (
        INSERT INTO jobcore.job_events (job_id, kind, attempt, detail)
        SELECT edited.id, '{JobEventKind.EDITED}', edited.attempts + 1,
               jsonb_build_object(
                   'fields', to_jsonb(%(fields)s::text[]), 'by', %(actor)s::text,
                   'run_at', edited.due_at, 'priority', edited.priority,
                   'message', CASE WHEN EXISTS (SELECT 1 FROM moved) THEN 'moved'
                                   WHEN EXISTS (SELECT 1 FROM superseding) THEN 'superseded'
                                   ELSE 'kept' END)
        FROM edited
        WHERE {EVENTS_ON}
    )
    SELECT edited.id, edited.version, edited.due_at,
           (SELECT count(*) FROM moved) AS moved,
           (SELECT count(*) FROM superseding) AS superseded,
           (SELECT pg_notify(%(channel)s, '') FROM superseding) IS NULL AS notified
    FROM edited
    """,
)
