"""Cancellation, both ends of it: the API's (lock, then cancel a pending job or ask the
worker running it to stop, with a NOTIFY on :data:`CANCEL_CHANNEL`) and the worker's (LISTEN
on that channel, or poll for requests where it cannot LISTEN).
"""

from __future__ import annotations

import uuid
from typing import TypedDict

from jobcore.database.sql import (
    CompletionParams,
    NoParams,
    Query,
)
from jobcore.database.sql.job_events import (
    EVENTS_ON,
)
from jobcore.database.sql.webhook_deliveries import COMPLETION_WEBHOOKS, NOTIFY_JOB_DONE
from jobcore.kernel.jobevents import JobEventKind


class JobLockForCancelParams(TypedDict):
    id: uuid.UUID
    tenant: str


# Cancelling: lock the row so the status read here is the status changed below (a worker's
# claim or outcome waits for us), then change it with a fenced UPDATE.
JOB_LOCK_FOR_CANCEL = Query[JobLockForCancelParams](
    "job_lock_for_cancel",
    "Lock a tenant's job and read its status, before cancelling it.",
    """
    SELECT id, status FROM jobcore.jobs WHERE id = %(id)s AND tenant = %(tenant)s FOR UPDATE
    """,
)


class JobCancelPendingParams(CompletionParams):
    id: uuid.UUID


# Ends the job, so it records the completion webhook and wakes waiters
# (jobcore.database.sql.webhook_deliveries).
JOB_CANCEL_PENDING = Query[JobCancelPendingParams](
    "job_cancel_pending",
    "Cancel a job that no worker runs yet (fenced on status = 'pending').",
    f"""
    WITH done AS (
        UPDATE jobcore.jobs
        SET status = 'cancelled', cancel_requested_at = now(), finished_at = now(),
            held_reason = NULL, held_since = NULL, updated_at = now()
        WHERE id = %(id)s AND status = 'pending'
        RETURNING id, tenant, status, callback_url, traceparent, tracestate,
                  cancel_requested_at, attempts, last_error
    ), {COMPLETION_WEBHOOKS}
    SELECT done.id, done.status, done.cancel_requested_at, {NOTIFY_JOB_DONE}
    FROM done
    """,
)


# Workers LISTEN on this channel; the payload is the job id. The worker running the job
# stops its handler and ends the job `cancelled` (fenced by its lease).
CANCEL_CHANNEL = "jobcore_cancel"


class JobRequestCancelParams(TypedDict):
    channel: str
    id: uuid.UUID


JOB_REQUEST_CANCEL = Query[JobRequestCancelParams](
    "job_request_cancel",
    "Ask the worker running a job to stop it (fenced on status = 'running') and NOTIFY it.",
    f"""
    WITH job AS (
        UPDATE jobcore.jobs
        SET cancel_requested_at = coalesce(cancel_requested_at, now()), updated_at = now()
        WHERE id = %(id)s AND status = 'running'
        RETURNING id, status, cancel_requested_at, attempts
    ), requested AS (
        INSERT INTO jobcore.job_events (job_id, kind, attempt)
        SELECT job.id, '{JobEventKind.CANCEL_REQUESTED}', job.attempts FROM job
        WHERE {EVENTS_ON}
    )
    SELECT id, status, cancel_requested_at,
           pg_notify(%(channel)s, id::text) IS NULL AS notified
    FROM job
    """,
)


# --- the worker: cancel requests, claim, heartbeat, fenced outcomes --------------------

JOB_CANCEL_LISTEN = Query[NoParams](
    "job_cancel_listen", "Hear cancel requests for running jobs.", f"LISTEN {CANCEL_CHANNEL}"
)


JOB_CANCEL_UNLISTEN = Query[NoParams](
    "job_cancel_unlisten",
    "Stop hearing cancel requests before a connection returns to the pool.",
    f"UNLISTEN {CANCEL_CHANNEL}",
)


class JobCancelRequestedParams(TypedDict):
    ids: list[uuid.UUID]


# The polling twin of the cancel NOTIFY, for workers with nowhere to LISTEN (PgBouncer in
# transaction mode): a primary-key probe per job this worker runs.
JOB_CANCEL_REQUESTED = Query[JobCancelRequestedParams](
    "job_cancel_requested",
    "Which of these running jobs someone asked to cancel.",
    """
    SELECT id FROM jobcore.jobs
    WHERE id = ANY(%(ids)s::uuid[]) AND status = 'running' AND cancel_requested_at IS NOT NULL
    """,
)
