"""Statements that read ``job_events`` (a job's timeline), and the pieces of the statements
that write them.

Events are never written on their own: each is a data-modifying CTE of the statement that
makes the change it records (the relay's delete of a confirmed row, each outcome, the
reaper's, a quarantine, a dead-letter note, a webhook attempt), so an event commits exactly
when its change does and costs no round trip. The kinds are
:class:`jobcore.kernel.jobevents.JobEventKind`. Some are not rows of their own, so that a
job published once that succeeds on its first claim writes no event row at all: `accepted`
is the job row (created_at, accepted_detail); `claimed` is the claim kept on the job row
(started_at, claimed_at, claim_lease_until, worker_id) while the job is on that attempt,
then in ``detail.claim`` of the event that moves it on to another; the first `published`
of the first attempt is kept on the job row by the claim (published_at, published_by,
published_message_id); and the end (`finished`, `cancelled`) is the ended job row. The
readers list them all (:func:`jobcore.kernel.jobevents.with_job_row`).
"""

from __future__ import annotations

import uuid
from typing import TypedDict

from jobcore.database.sql import Query
from jobcore.kernel.jobevents import DETAIL_TEXT_CHARS, JobEventKind

# Whether this session records events. JOBCORE_JOB_EVENTS=false sets `jobcore.job_events` to
# off on each pooled connection (jobcore.database.gateway); unset, it is on. Every event CTE inserts
# only WHERE this holds: it names no column, so the planner makes it a one-time filter,
# evaluated once per statement, and a statement with events off writes none at all.
EVENTS_ON = "current_setting('jobcore.job_events', true) IS DISTINCT FROM 'off'"

# What an event keeps of an error (the job row keeps up to 2,000 characters).
_ERROR = f"left(%s, {DETAIL_TEXT_CHARS})"


def short_error(expression: str) -> str:
    """SQL for the first :data:`DETAIL_TEXT_CHARS` characters of an error."""
    return _ERROR % expression


# What an outcome that moves a job on to another attempt returns of the job row (RETURNING):
# the claim it ends, which the job row is about to lose to the next claim.
CLAIM_COLUMNS = "coalesce(claimed_at, started_at) AS claim_at, claim_lease_until"


def carried_claim(row: str) -> str:
    """SQL for the jsonb ``{"claim": {"at", "worker", "lease_until"}}`` that the event of an
    outcome adds to its detail, from ``row`` (which returned :data:`CLAIM_COLUMNS` and
    worker_id); ``{}`` for a claim a worker of the previous revision made (no
    claim_lease_until: it wrote its own `claimed` row)."""
    return f"""CASE WHEN {row}.claim_lease_until IS NULL THEN '{{}}'::jsonb
                    ELSE jsonb_build_object('claim', jsonb_build_object(
                        'at', {row}.claim_at, 'worker', {row}.worker_id,
                        'lease_until', {row}.claim_lease_until)) END"""


# The end of a job (`finished` with its status and error, or `cancelled`) is no event row
# since migration 0041: the job row says it once ended (status, finished_at, attempts,
# last_error), and the readers list it (jobcore.kernel.jobevents.with_job_row). A workflow
# step retried in place leaves its end, which its `revived` event carries (carried_finish).


def carried_finish(row: str) -> str:
    """SQL for the jsonb ``{"finish": {"at", "status", "attempt", "error"}}`` that a
    `revived` event adds to its detail: the end the job leaves, from ``row`` (the job row
    before the change: finished_at, status, attempts, last_error); ``{}`` for none."""
    return f"""CASE WHEN {row}.finished_at IS NULL THEN '{{}}'::jsonb
                    ELSE jsonb_build_object('finish', jsonb_strip_nulls(jsonb_build_object(
                        'at', {row}.finished_at, 'status', {row}.status,
                        'attempt', {row}.attempts,
                        'error', CASE WHEN {row}.status <> 'succeeded'
                                      THEN {short_error(f"{row}.last_error")} END))) END"""


# --- reads ----------------------------------------------------------------------------------


# Select-list items for a `jobs` row: its latest job message still in the outbox (waiting,
# failing or quarantined) and its latest event, which jobcore.usecases.whereabouts.whereabouts turns
# into a sentence. outbox_job_idx and job_events_pkey (job_id, id) answer them with a probe each
# (the latest event by `at`, as a timeline is ordered: a job has a handful to sort).
WHEREABOUTS_COLUMNS = """
    message.id AS message_outbox_id,
    message.created_at AS message_created_at,
    message.available_at AS message_available_at,
    message.attempts AS message_attempts,
    message.last_error AS message_last_error,
    message.failing_since AS message_failing_since,
    message.quarantined_at AS message_quarantined_at,
    latest.kind AS last_event_kind,
    latest.at AS last_event_at,
    latest.attempt AS last_event_attempt,
    latest.detail AS last_event_detail,
    now() AS read_at"""

WHEREABOUTS_JOINS = """
    LEFT JOIN LATERAL (
        SELECT id, created_at, available_at, attempts, last_error, failing_since,
               quarantined_at
        FROM jobcore.outbox
        WHERE outbox.job_id = jobs.id AND outbox.message_type = jobs.type
        ORDER BY outbox.id DESC
        LIMIT 1
    ) AS message ON true
    LEFT JOIN LATERAL (
        SELECT kind, at, attempt, detail
        FROM jobcore.job_events
        WHERE job_events.job_id = jobs.id
        ORDER BY job_events.at DESC, job_events.id DESC
        LIMIT 1
    ) AS latest ON true"""


class JobTimelineParams(TypedDict):
    id: uuid.UUID
    limit: int
    tenant: str | None  # None: any tenant's job (operators)


# The `accepted` event's detail, from the job row: accepted_detail, and `batch` for a job
# of a batch enqueue, which keeps it as accepted_in_batch (migration 0045; jobs written
# before keep it in the JSON).
ACCEPTED_DETAIL = """coalesce(jobs.accepted_detail, '{}'::jsonb)
               || CASE WHEN jobs.accepted_in_batch THEN '{"batch": true}'::jsonb
                       ELSE '{}'::jsonb END"""


# One statement, so one snapshot: read apart, the job (where it is) and its events could
# disagree, say a relay's commit landing between them. The `claimed`, first `published`
# and ending events are said by jobcore.kernel.jobevents.with_job_row from the rows'
# details and the job's columns (claim_lease_until as JSON, as an event's detail has it).
# The first event, `accepted`, is the job row itself (created_at, accepted_detail; id 0),
# which enqueue writes instead of an event row; a job enqueued before migration 0019 has
# its `accepted` row, listed instead. One row per event, each with the job's columns
# whereabouts reads; no row at all for a job that is not there or is another tenant's.
# Events in order of `at`, then of writing: a `published` event is dated when its relay
# took the row, and committed after the broker's confirm, which a worker's claim can
# precede.
JOB_TIMELINE = Query[JobTimelineParams](
    "job_timeline",
    "A job's latest events, oldest first, with what says where the job is now.",
    f"""
    SELECT jobs.id, jobs.tenant, jobs.type, jobs.queue, jobs.status, jobs.attempts,
           jobs.max_attempts, jobs.last_error, jobs.worker_id, jobs.lease_expires_at,
           jobs.cancel_requested_at, jobs.finished_at, jobs.updated_at, jobs.message_note,
           jobs.started_at, jobs.claimed_at,
           to_jsonb(jobs.claim_lease_until) AS claim_lease_until,
           jobs.published_at, jobs.published_by, jobs.published_message_id,
           {WHEREABOUTS_COLUMNS},
           event.id AS event_id, event.at AS event_at, event.kind AS event_kind,
           event.attempt AS event_attempt, event.detail AS event_detail
    FROM jobcore.jobs {WHEREABOUTS_JOINS}
    LEFT JOIN LATERAL (
        (
            SELECT id, at, kind, attempt, detail FROM jobcore.job_events
            WHERE job_events.job_id = jobs.id
            ORDER BY job_events.id DESC
            LIMIT %(limit)s
        )
        UNION ALL
        SELECT 0, jobs.created_at, '{JobEventKind.ACCEPTED}', NULL,
               {ACCEPTED_DETAIL}
        WHERE NOT EXISTS (
            SELECT 1 FROM jobcore.job_events
            WHERE job_events.job_id = jobs.id AND job_events.kind = '{JobEventKind.ACCEPTED}'
        )
    ) AS event ON true
    WHERE jobs.id = %(id)s AND (%(tenant)s::text IS NULL OR jobs.tenant = %(tenant)s)
    ORDER BY event.at, event.id
    """,
)
