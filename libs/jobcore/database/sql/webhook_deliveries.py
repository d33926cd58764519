"""Statements that change ``webhook_deliveries``, and the pieces every terminal-status
statement shares.

A job reaches a terminal status in one of a few fenced statements (the worker's success,
failure and cancellation, the reaper's, the API's cancel of a pending job). Each names the
rows it changed ``done`` and adds :data:`COMPLETION_WEBHOOKS` and :data:`NOTIFY_JOB_DONE`:
in the same statement, so in the same transaction, a job with a ``callback_url`` gets its
delivery row and the outbox message of the first attempt, and the API's long-poll waiters
hear about it. A job without a callback costs the two empty CTEs and one NOTIFY.

``done`` must return ``id, tenant, status, callback_url, traceparent, tracestate``.
Parameters: :class:`jobcore.database.sql.CompletionParams`
(:func:`jobcore.execution.completion_webhooks.completion_params`).
"""

from __future__ import annotations

import uuid
from typing import TypedDict

from psycopg.types.json import Jsonb

from jobcore.database.sql import TERMINAL_SQL, CompletionParams, Query
from jobcore.database.sql.job_events import EVENTS_ON, short_error
from jobcore.kernel.jobevents import JobEventKind

# Where jobs become terminal; the payload is the job id. The API's waiters LISTEN here.
JOB_DONE_CHANNEL = "jobcore_job_done"


WEBHOOK_MESSAGE_TYPE = "webhook"


# The envelope is the same as WebhookMessage.encode() writes: {"v", "delivery_id", "attempt"}.
COMPLETION_WEBHOOKS = f"""
    hooks AS (
        INSERT INTO jobcore.webhook_deliveries (
            id, job_id, tenant, url, event, max_attempts, next_attempt_at
        )
        SELECT gen_random_uuid(), done.id, done.tenant, done.callback_url,
               'job.' || done.status, %(webhook_max_attempts)s, now()
        FROM done
        WHERE done.callback_url IS NOT NULL
          AND done.status IN {TERMINAL_SQL}
        RETURNING id, job_id
    ), hook_messages AS (
        INSERT INTO jobcore.outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id, tenant
        )
        SELECT gen_random_uuid(), %(webhook_exchange)s, %(webhook_routing_key)s,
               '{WEBHOOK_MESSAGE_TYPE}',
               jsonb_strip_nulls(jsonb_build_object(
                   'traceparent', done.traceparent, 'tracestate', done.tracestate)),
               convert_to(
                   jsonb_build_object('v', 1, 'delivery_id', hooks.id, 'attempt', 1)::text,
                   'UTF8'),
               hooks.job_id, done.tenant
        FROM hooks JOIN done ON done.id = hooks.job_id
        RETURNING id
    )"""


# Select-list items: wake the relay if a webhook message was written, and the waiters of
# each job that became terminal.
NOTIFY_JOB_DONE = f"""
    (SELECT pg_notify(%(webhook_outbox_channel)s, '') FROM hook_messages LIMIT 1) IS NULL
        AS webhook_notified,
    CASE WHEN done.status IN {TERMINAL_SQL}
         THEN pg_notify('{JOB_DONE_CHANNEL}', done.id::text) END IS NULL AS done_notified"""


# --- the API: a job's deliveries, the long-poll reads -----------------------------------


class WebhookDeliveryListForJobParams(TypedDict):
    job_id: uuid.UUID
    tenant: str


# The job row decides tenancy: another tenant's job answers no row at all (a 404), a job
# of this tenant without deliveries one row of NULL delivery columns.
WEBHOOK_DELIVERY_LIST_FOR_JOB = Query[WebhookDeliveryListForJobParams](
    "webhook_delivery_list_for_job",
    "A tenant's job and its webhook deliveries, oldest first.",
    """
    SELECT j.id AS job_id, d.id, d.url, d.event, d.status, d.attempts, d.max_attempts,
           d.last_status_code, d.last_error, d.next_attempt_at, d.created_at,
           d.delivered_at, d.updated_at
    FROM jobcore.jobs AS j
    LEFT JOIN jobcore.webhook_deliveries AS d ON d.job_id = j.id
    WHERE j.id = %(job_id)s AND j.tenant = %(tenant)s
    ORDER BY d.created_at, d.id
    """,
)


# --- the worker: one attempt --------------------------------------------------------------


class WebhookDeliveryGetForAttemptParams(TypedDict):
    consumer: str
    id: uuid.UUID
    message_id: uuid.UUID


WEBHOOK_DELIVERY_GET_FOR_ATTEMPT = Query[WebhookDeliveryGetForAttemptParams](
    "webhook_delivery_get_for_attempt",
    "A delivery, its job's view, the tenant's secrets and whether this message was handled.",
    """
    SELECT d.id, d.job_id, d.tenant, d.url, d.event, d.status, d.attempts, d.max_attempts,
           s.secret,
           CASE WHEN s.previous_expires_at > now() THEN s.previous_secret END
               AS previous_secret,
           j.type, j.status AS job_status, j.attempts AS job_attempts,
           j.max_attempts AS job_max_attempts, j.entity_id, j.last_error, j.result_ref,
           j.created_at, j.updated_at, j.started_at, j.finished_at,
           EXISTS (
               SELECT 1 FROM jobcore.inbox
               WHERE consumer = %(consumer)s AND message_id = %(message_id)s
           ) AS seen
    FROM jobcore.webhook_deliveries AS d
    JOIN jobcore.jobs AS j ON j.id = d.job_id
    LEFT JOIN jobcore.tenant_webhook_secrets AS s ON s.tenant = d.tenant
    WHERE d.id = %(id)s
    """,
)


class WebhookDeliveryRecordAttemptParams(CompletionParams):
    attempt: int
    consumer: str
    delay: float
    error: str | None
    headers: Jsonb
    id: uuid.UUID
    message_id: uuid.UUID
    message_type: str
    next_body: bytes | None
    next_message_id: uuid.UUID | None
    outcome: str
    status_code: int | None


# One statement per attempt's outcome: the inbox row (so a redelivered message is not
# sent again), the delivery's new state, and for a retry the next attempt's outbox
# message, due when the backoff ends. The fence `attempts = <this attempt> - 1 AND status
# = 'pending'` drops a stale message (a second copy, or one a redelivery overtook).
# Whether a retry is left is decided here, on the row as it is now.
WEBHOOK_DELIVERY_RECORD_ATTEMPT = Query[WebhookDeliveryRecordAttemptParams](
    "webhook_delivery_record_attempt",
    "Record one delivery attempt's outcome (and its job's `webhook_attempt` event) and, for a "
    "retry, write the next attempt's message.",
    f"""
    WITH received AS (
        INSERT INTO jobcore.inbox (consumer, message_id)
        VALUES (%(consumer)s, %(message_id)s)
        ON CONFLICT DO NOTHING
        RETURNING message_id
    ), recorded AS (
        UPDATE jobcore.webhook_deliveries AS d
        SET attempts = %(attempt)s,
            status = CASE
                WHEN %(outcome)s = 'delivered' THEN 'delivered'
                WHEN %(outcome)s = 'retry' AND %(attempt)s < d.max_attempts THEN 'pending'
                ELSE 'failed'
            END,
            last_status_code = %(status_code)s,
            last_error = %(error)s,
            next_attempt_at = CASE
                WHEN %(outcome)s = 'retry' AND %(attempt)s < d.max_attempts
                THEN now() + make_interval(secs => %(delay)s)
            END,
            delivered_at = CASE WHEN %(outcome)s = 'delivered' THEN now() ELSE d.delivered_at END,
            updated_at = now()
        FROM received
        WHERE d.id = %(id)s AND d.status = 'pending' AND d.attempts = %(attempt)s - 1
        RETURNING d.id, d.job_id, d.tenant, d.status, d.attempts, d.next_attempt_at
    ), message AS (
        INSERT INTO jobcore.outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id,
            tenant, available_at
        )
        SELECT %(next_message_id)s, %(webhook_exchange)s, %(webhook_routing_key)s,
               %(message_type)s, %(headers)s, %(next_body)s, recorded.job_id,
               recorded.tenant, recorded.next_attempt_at
        FROM recorded
        WHERE recorded.status = 'pending'
        RETURNING id
    ), its_job AS (
        -- locked as job_events' foreign key did before migration 0019: the pruner, which
        -- deletes a job with its events, cannot delete it under this attempt's event
        SELECT id FROM jobcore.jobs WHERE id = (SELECT job_id FROM recorded) AND {EVENTS_ON}
        FOR KEY SHARE
    ), attempt_event AS (
        INSERT INTO jobcore.job_events (job_id, kind, detail)
        SELECT recorded.job_id, '{JobEventKind.WEBHOOK_ATTEMPT}',
               jsonb_strip_nulls(jsonb_build_object(
                   'delivery_id', recorded.id,
                   'attempt', recorded.attempts,
                   'outcome', %(outcome)s::text,
                   'status', recorded.status,
                   'status_code', %(status_code)s::int,
                   'error', {short_error("%(error)s::text")},
                   'next_attempt_at', recorded.next_attempt_at))
        FROM recorded JOIN its_job ON its_job.id = recorded.job_id
        WHERE {EVENTS_ON}
    )
    SELECT recorded.id, recorded.status, recorded.attempts, recorded.next_attempt_at,
           (SELECT pg_notify(%(webhook_outbox_channel)s, '') FROM message) IS NULL AS notified
    FROM recorded
    """,
)


# --- operators: list and redeliver ---------------------------------------------------------


class WebhookDeliveryListParams(TypedDict):
    job_id: uuid.UUID | None
    limit: int
    status: str | None


WEBHOOK_DELIVERY_LIST = Query[WebhookDeliveryListParams](
    "webhook_delivery_list",
    "Deliveries, newest first, optionally of one job and/or in one status.",
    """
    SELECT id, job_id, tenant, url, event, status, attempts, max_attempts, last_status_code,
           last_error, next_attempt_at, created_at, delivered_at, updated_at
    FROM jobcore.webhook_deliveries
    WHERE (%(job_id)s::uuid IS NULL OR job_id = %(job_id)s)
      AND (%(status)s::text IS NULL OR status = %(status)s)
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
    """,
)


class WebhookDeliveryRedeliverParams(CompletionParams):
    id: uuid.UUID


# A new attempt now, whatever the delivery's state: pending again, and one more attempt
# allowed if they were used up. The message carries the next attempt number, so a retry
# still waiting in the outbox for that number loses the fence to whichever comes first.
WEBHOOK_DELIVERY_REDELIVER = Query[WebhookDeliveryRedeliverParams](
    "webhook_delivery_redeliver",
    "Make a delivery pending again and write an outbox message for a new attempt now.",
    f"""
    WITH delivery AS (
        UPDATE jobcore.webhook_deliveries
        SET status = 'pending',
            max_attempts = greatest(max_attempts, attempts + 1),
            next_attempt_at = now(),
            updated_at = now()
        WHERE id = %(id)s
        RETURNING id, job_id, tenant, attempts
    ), message AS (
        INSERT INTO jobcore.outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id, tenant
        )
        SELECT gen_random_uuid(), %(webhook_exchange)s, %(webhook_routing_key)s,
               '{WEBHOOK_MESSAGE_TYPE}', '{{}}'::jsonb,
               convert_to(
                   jsonb_build_object(
                       'v', 1, 'delivery_id', delivery.id, 'attempt', delivery.attempts + 1
                   )::text,
                   'UTF8'),
               delivery.job_id, delivery.tenant
        FROM delivery
        RETURNING id
    )
    SELECT delivery.id, delivery.job_id, delivery.tenant, delivery.attempts + 1 AS attempt,
           (SELECT pg_notify(%(webhook_outbox_channel)s, '') FROM message) IS NULL AS notified
    FROM delivery
    """,
)
