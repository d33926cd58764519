"""Workflows (jobcore.usecases.workflows): ``workflows``, ``workflow_jobs``,
``workflow_edges``, and the workflow's steps in ``jobs``.

A workflow and all its steps are written by one statement; a step whose dependencies are
not settled is pending and held for ``'dependencies'``, with no outbox row. What happens
when a step settles is not here: migration 0031's trigger on ``jobs`` does it, in the
transaction of whatever statement settled it.
"""

from __future__ import annotations

import uuid
from typing import TypedDict

from psycopg.types.json import Jsonb

from jobcore.database.sql import TERMINAL_SQL, Query, status_is
from jobcore.database.sql.job_events import (
    CLAIM_COLUMNS,
    EVENTS_ON,
    carried_claim,
    carried_finish,
)
from jobcore.database.sql.tenant_quotas import QuotaDefaultParams, batch_admission_ctes
from jobcore.kernel.jobevents import JobEventKind
from jobcore.kernel.states import JobStatus


class WorkflowInsertParams(QuotaDefaultParams):
    """The workflow, and its steps as parallel arrays (one element per step, in the
    request's order), and its edges as parallel arrays of step ids."""

    id: uuid.UUID
    tenant: str
    name: str | None
    exchange: str
    # The API key the request came with (checked usable in the statement), or None.
    key_id: uuid.UUID | None
    channel: str
    ids: list[uuid.UUID]
    names: list[str]
    types: list[str]
    queues: list[str]
    routing_keys: list[str]
    payloads: list[Jsonb]
    fingerprints: list[str]
    entity_ids: list[str | None]
    max_attempts: list[int]
    priorities: list[int]
    finals: list[bool]
    # Each step's incoming edges (all must be satisfied before it runs).
    waiting: list[int]
    message_ids: list[uuid.UUID]
    bodies: list[bytes]
    concurrency_keys: list[str | None]
    concurrency_limits: list[int | None]
    rate_keys: list[str | None]
    rate_per_seconds: list[float | None]
    rate_bursts: list[int | None]
    traceparent: str | None
    tracestate: str | None
    headers: Jsonb
    edge_upstreams: list[uuid.UUID]
    edge_downstreams: list[uuid.UUID]
    edge_policies: list[str]
    # The request's Idempotency-Key (None: none) and the hash of the whole request.
    idempotency_key: str | None
    request_fingerprint: str


# The caller holds the tenant's usage row (TENANT_USAGE_LOCK). The quotas count each step
# and admit all of them or none. A step runs now when nothing waits for it to be settled
# (no incoming edge; a `finally` step only when the workflow has no other step): it gets
# its outbox row here, the others are held until the trigger publishes them. Each step
# is its own `accepted` event (jobs.accepted_detail names its workflow).
#
# An idempotency key already held by a workflow of the tenant (`existing`, read under the
# usage row's lock, so a request that waited for the lock behind its twin sees the twin's
# commit) writes nothing and uses no quota: the caller compares the fingerprints (a replay
# or a reused key). The unique index backs it: an insert that meets a key committed after
# this statement's snapshot does nothing (ON CONFLICT), and with it every step, edge and
# message (they are inserted only with the workflow's row).
WORKFLOW_INSERT = Query[WorkflowInsertParams](
    "workflow_insert",
    "Insert a workflow, its steps (held until their dependencies settle, else with their "
    "outbox message) and its edges, if the tenant's quotas admit every step, in one "
    "statement.",
    f"""
    WITH input AS (
        SELECT *
        FROM unnest(
            %(ids)s::uuid[], %(names)s::text[], %(types)s::text[], %(queues)s::text[],
            %(routing_keys)s::text[], %(payloads)s::jsonb[], %(fingerprints)s::text[],
            %(entity_ids)s::text[], %(max_attempts)s::int[], %(priorities)s::int[],
            %(finals)s::bool[], %(waiting)s::int[], %(message_ids)s::uuid[],
            %(bodies)s::bytea[], %(concurrency_keys)s::text[], %(concurrency_limits)s::int[],
            %(rate_keys)s::text[], %(rate_per_seconds)s::float8[], %(rate_bursts)s::int[]
        ) WITH ORDINALITY AS i(id, name, type, queue, routing_key, payload, fingerprint,
               entity_id, max_attempts, priority, is_finally, waiting, message_id, body,
               concurrency_key, concurrency_limit, rate_key, rate_per_second, rate_burst, n)
    ), existing AS (
        SELECT id, request_fingerprint, created_at FROM jobcore.workflows
        WHERE tenant = %(tenant)s::text AND idempotency_key = %(idempotency_key)s::text
    ), wanted AS (
        SELECT CASE WHEN EXISTS (SELECT 1 FROM existing) THEN 0 ELSE count(*) END AS n,
               count(*) FILTER (WHERE NOT is_finally) AS steps
        FROM input
    ), {batch_admission_ctes(all_or_nothing=True)}, go AS (
        SELECT wanted.n, wanted.steps FROM wanted, room
        WHERE room.admitted = wanted.n AND NOT EXISTS (SELECT 1 FROM existing)
    ), workflow AS (
        INSERT INTO jobcore.workflows (
            id, tenant, name, jobs_total, unsettled, open_jobs, exchange, idempotency_key,
            request_fingerprint
        )
        SELECT %(id)s, %(tenant)s::text, %(name)s, go.n, go.steps, go.n, %(exchange)s,
               %(idempotency_key)s::text, %(request_fingerprint)s::text
        FROM go
        ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
        RETURNING id, created_at
    ), ready AS (
        SELECT input.*,
               input.waiting = 0 AND (NOT input.is_finally OR go.steps = 0) AS runs_now
        FROM input, go
    ), job AS (
        INSERT INTO jobcore.jobs (
            id, tenant, type, queue, status, payload_fingerprint, payload, entity_id,
            max_attempts, traceparent, tracestate, priority, concurrency_key,
            concurrency_limit, rate_key, rate_per_second, rate_burst, held_reason,
            held_since, workflow_id, accepted_detail
        )
        SELECT ready.id, %(tenant)s::text, ready.type, ready.queue, 'pending',
               ready.fingerprint, ready.payload, ready.entity_id, ready.max_attempts,
               %(traceparent)s, %(tracestate)s, ready.priority, ready.concurrency_key,
               ready.concurrency_limit, ready.rate_key, ready.rate_per_second,
               ready.rate_burst,
               CASE WHEN NOT ready.runs_now THEN 'dependencies' END,
               CASE WHEN NOT ready.runs_now THEN workflow.created_at END,
               workflow.id,
               jsonb_build_object('workflow', workflow.id, 'step', ready.name)
        FROM ready, workflow
        ORDER BY ready.n
        RETURNING id
    ), step AS (
        INSERT INTO jobcore.workflow_jobs (
            job_id, workflow_id, name, is_finally, waiting, routing_key
        )
        SELECT input.id, workflow.id, input.name, input.is_finally, input.waiting,
               input.routing_key
        FROM input, workflow
        ORDER BY input.n
        RETURNING job_id
    ), edge AS (
        INSERT INTO jobcore.workflow_edges (workflow_id, upstream, downstream, policy)
        SELECT workflow.id, e.upstream, e.downstream, e.policy
        FROM unnest(%(edge_upstreams)s::uuid[], %(edge_downstreams)s::uuid[],
                    %(edge_policies)s::text[]) AS e(upstream, downstream, policy),
             workflow
        RETURNING upstream
    ), message AS (
        INSERT INTO jobcore.outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id,
            tenant, priority
        )
        SELECT ready.message_id, %(exchange)s, ready.routing_key, ready.type, %(headers)s,
               ready.body, job.id, %(tenant)s::text, ready.priority
        FROM job JOIN ready ON ready.id = job.id
        WHERE ready.runs_now
        RETURNING id
    )
    SELECT workflow.id, workflow.created_at,
           (SELECT count(*) FROM job) AS jobs,
           (SELECT count(*) FROM step) AS steps,
           (SELECT count(*) FROM edge) AS edges,
           (SELECT count(*) FROM message) AS published,
           (SELECT pg_notify(%(channel)s, '') FROM message LIMIT 1) IS NULL AS notified,
           room.refusal, limits.rate, limits.burst, limits.max_unfinished,
           coalesce((SELECT rate_tat FROM charged), (SELECT rate_tat FROM usage)) AS rate_tat,
           clock_timestamp() AS now,
           existing.id AS existing_id, existing.request_fingerprint AS existing_fingerprint,
           existing.created_at AS existing_created_at
    FROM limits CROSS JOIN room LEFT JOIN workflow ON true LEFT JOIN existing ON true
    """,
)


class WorkflowByKeyParams(TypedDict):
    tenant: str
    idempotency_key: str


# After an insert that met a key committed since its snapshot (ON CONFLICT DO NOTHING): the
# workflow holding it, read by a statement of its own (a snapshot that sees it), by
# workflows_idempotency_uidx.
WORKFLOW_GET_BY_IDEMPOTENCY_KEY = Query[WorkflowByKeyParams](
    "workflow_get_by_idempotency_key",
    "The tenant's workflow that holds an idempotency key.",
    """
    SELECT id, request_fingerprint, created_at FROM jobcore.workflows
    WHERE tenant = %(tenant)s AND idempotency_key = %(idempotency_key)s
    """,
)


class WorkflowGetParams(TypedDict):
    id: uuid.UUID
    # None: any tenant's (an operator's read).
    tenant: str | None


WORKFLOW_GET = Query[WorkflowGetParams](
    "workflow_get",
    "A workflow (of the tenant, when one is given).",
    """
    SELECT id, tenant, name, status, jobs_total, unsettled, open_jobs, failed_jobs,
           cancel_requested_at, created_at, finished_at
    FROM jobcore.workflows
    WHERE id = %(id)s AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
    """,
)


class WorkflowIdParams(TypedDict):
    id: uuid.UUID


# Its steps through jobs_workflow_idx, each with its step row and its incoming edges (by
# the upstream's name), in creation order.
WORKFLOW_STEPS = Query[WorkflowIdParams](
    "workflow_steps",
    "A workflow's steps: each job's state, its name, whether it is `finally`, what it "
    "waits for and its incoming edges.",
    """
    SELECT j.id, n.name, j.type, j.status, j.held_reason, j.attempts, j.max_attempts,
           j.last_error, j.created_at, j.started_at, j.finished_at, n.is_finally,
           n.waiting, n.blocked_by,
           coalesce((
               SELECT jsonb_agg(jsonb_build_object(
                          'name', up.name, 'job_id', e.upstream, 'policy', e.policy,
                          'state', e.state) ORDER BY up.name)
               FROM jobcore.workflow_edges AS e
               JOIN jobcore.workflow_jobs AS up ON up.job_id = e.upstream
               WHERE e.downstream = j.id
           ), '[]'::jsonb) AS depends_on
    FROM jobcore.jobs AS j
    JOIN jobcore.workflow_jobs AS n ON n.job_id = j.id
    WHERE j.workflow_id = %(id)s
    ORDER BY j.created_at, n.name
    """,
)


class WorkflowListParams(TypedDict):
    status: str | None
    limit: int


class WorkflowListForTenantParams(WorkflowListParams):
    tenant: str


# Newest first from workflows_created_idx; a status is a filter on that range.
WORKFLOW_LIST = Query[WorkflowListParams](
    "workflow_list",
    "The newest workflows of every tenant (of a status, when given).",
    """
    SELECT id, tenant, name, status, jobs_total, open_jobs, failed_jobs, created_at,
           finished_at
    FROM jobcore.workflows
    WHERE %(status)s::text IS NULL OR status = %(status)s::text
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
    """,
)

# A tenant's, newest first from workflows_tenant_created_idx.
WORKFLOW_LIST_FOR_TENANT = Query[WorkflowListForTenantParams](
    "workflow_list_for_tenant",
    "A tenant's newest workflows (of a status, when given).",
    """
    SELECT id, tenant, name, status, jobs_total, open_jobs, failed_jobs, created_at,
           finished_at
    FROM jobcore.workflows
    WHERE tenant = %(tenant)s AND (%(status)s::text IS NULL OR status = %(status)s::text)
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
    """,
)


class WorkflowRequestCancelParams(TypedDict):
    id: uuid.UUID
    tenant: str | None


# The first step of a cancel: the workflow is marked, in a transaction of its own, so
# that from its commit on no settle publishes another of its steps (jobcore_workflow_release
# reads the mark under the workflow's lock).
WORKFLOW_REQUEST_CANCEL = Query[WorkflowRequestCancelParams](
    "workflow_request_cancel",
    "Mark a workflow as being cancelled: no step of it is published from now on.",
    """
    UPDATE jobcore.workflows
    SET cancel_requested_at = coalesce(cancel_requested_at, now())
    WHERE id = %(id)s AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
    RETURNING id, tenant, status, cancel_requested_at
    """,
)


class WorkflowCancelStepsParams(TypedDict):
    id: uuid.UUID
    cancel_channel: str


# One pass of a cancel: the workflow's pending steps are cancelled, its running ones asked
# to stop (as a single job's cancel does, jobcore.database.sql.jobs.cancel). Rows another
# transaction holds are skipped, not waited for: a step being settled holds its job and
# waits for the workflow's lock, which the trigger of this statement takes too; the
# caller runs passes until `left` is 0. Steps cancelled here write no completion webhook
# (workflow steps carry no callback URL).
WORKFLOW_CANCEL_STEPS = Query[WorkflowCancelStepsParams](
    "workflow_cancel_steps",
    "Cancel a workflow's pending steps and ask its running ones to stop, skipping rows "
    "another transaction holds; how many are left unhandled.",
    f"""
    WITH pending AS (
        SELECT id FROM jobcore.jobs
        WHERE workflow_id = %(id)s AND {status_is("status", JobStatus.PENDING)}
        ORDER BY id
        FOR UPDATE SKIP LOCKED
    ), running AS (
        SELECT id FROM jobcore.jobs
        WHERE workflow_id = %(id)s AND {status_is("status", JobStatus.RUNNING)}
          AND cancel_requested_at IS NULL
        ORDER BY id
        FOR UPDATE SKIP LOCKED
    ), done AS (
        UPDATE jobcore.jobs
        SET status = 'cancelled', cancel_requested_at = now(), finished_at = now(),
            held_reason = NULL, held_since = NULL, updated_at = now(),
            last_error = 'its workflow was cancelled'
        FROM pending
        WHERE jobs.id = pending.id AND {status_is("jobs.status", JobStatus.PENDING)}
        RETURNING jobs.id, jobs.attempts
    ), asked AS (
        UPDATE jobcore.jobs
        SET cancel_requested_at = coalesce(jobs.cancel_requested_at, now()), updated_at = now()
        FROM running
        WHERE jobs.id = running.id AND {status_is("jobs.status", JobStatus.RUNNING)}
        RETURNING jobs.id, jobs.attempts
    ), events AS (
        INSERT INTO jobcore.job_events (job_id, kind, attempt, detail)
        SELECT id, '{JobEventKind.CANCELLED}', attempts,
               jsonb_build_object('status', 'cancelled', 'error', 'its workflow was cancelled')
        FROM done WHERE {EVENTS_ON}
        UNION ALL
        SELECT id, '{JobEventKind.CANCEL_REQUESTED}', attempts, '{{}}'::jsonb
        FROM asked WHERE {EVENTS_ON}
    )
    SELECT (SELECT count(*) FROM done) AS cancelled,
           (SELECT count(*) FROM asked) AS asked,
           (SELECT count(pg_notify('jobcore_job_done', id::text)) FROM done) AS done_notified,
           (SELECT count(pg_notify(%(cancel_channel)s, id::text)) FROM asked) AS cancel_notified,
           (SELECT count(*) FROM jobcore.jobs
            WHERE workflow_id = %(id)s
              AND ((status = 'pending' OR (status = 'running' AND cancel_requested_at IS NULL))
                   IS TRUE)
              AND id NOT IN (SELECT id FROM done UNION ALL SELECT id FROM asked)) AS left
    """,
)


class WorkflowRetryStepParams(TypedDict):
    workflow_id: uuid.UUID
    name: str
    tenant: str | None
    message_id: uuid.UUID
    exchange: str
    channel: str


# A failed (or cancelled, not as unreachable) step runs again in place: the same job,
# pending with as many attempts again as it had, its message written (its `revived` event
# carries the claim of its last attempt, which the next claim replaces, and the end it
# leaves, which the job row said: jobcore.database.sql.job_events.carried_finish). The
# trigger sees the step unfinished again: the workflow reopens, and the steps this one
# made unreachable wait for its new outcome.
WORKFLOW_RETRY_STEP = Query[WorkflowRetryStepParams](
    "workflow_retry_step",
    "Make a workflow's failed or cancelled step pending again, with its message, its "
    "dependents waiting again for it.",
    f"""
    WITH target AS (
        SELECT j.id, j.status, n.blocked_by, n.routing_key, w.cancel_requested_at,
               j.finished_at, j.attempts, j.last_error
        FROM jobcore.workflows AS w
        JOIN jobcore.workflow_jobs AS n ON n.workflow_id = w.id AND n.name = %(name)s
        JOIN jobcore.jobs AS j ON j.id = n.job_id
        WHERE w.id = %(workflow_id)s
          AND (%(tenant)s::text IS NULL OR w.tenant = %(tenant)s::text)
        FOR UPDATE OF j
    ), again AS (
        UPDATE jobcore.jobs
        SET status = 'pending', max_attempts = jobs.attempts + jobs.max_attempts,
            finished_at = NULL, cancel_requested_at = NULL, lease_token = NULL,
            lease_expires_at = NULL, next_attempt_at = NULL, held_reason = NULL,
            held_since = NULL, updated_at = now()
        FROM target
        WHERE jobs.id = target.id AND (jobs.status IN ('failed', 'cancelled')) IS TRUE
          AND target.blocked_by IS NULL AND target.cancel_requested_at IS NULL
        RETURNING jobs.id, jobs.tenant, jobs.type, jobs.attempts, jobs.priority,
                  jobs.traceparent, jobs.tracestate, target.routing_key, jobs.worker_id,
                  {CLAIM_COLUMNS}
    ), message AS (
        INSERT INTO jobcore.outbox (
            message_id, exchange, routing_key, message_type, headers, body, job_id, tenant,
            priority
        )
        SELECT %(message_id)s, %(exchange)s, again.routing_key, again.type,
               jsonb_strip_nulls(jsonb_build_object(
                   'traceparent', again.traceparent, 'tracestate', again.tracestate)),
               convert_to(jsonb_build_object(
                   'v', 1, 'job_id', again.id, 'attempt', again.attempts + 1,
                   'type', again.type)::text, 'UTF8'),
               again.id, again.tenant, again.priority
        FROM again
        RETURNING id
    ), events AS (
        INSERT INTO jobcore.job_events (job_id, kind, attempt, detail)
        SELECT again.id, '{JobEventKind.REVIVED}', again.attempts,
               jsonb_build_object('workflow', %(workflow_id)s::uuid, 'retried', true)
               || {carried_claim("again")} || {carried_finish("target")}
        FROM again JOIN target ON target.id = again.id WHERE {EVENTS_ON}
    )
    SELECT target.id, target.status AS status_before, target.blocked_by,
           target.cancel_requested_at, again.id IS NOT NULL AS retried,
           (SELECT pg_notify(%(channel)s, '') FROM message LIMIT 1) IS NULL AS notified
    FROM target LEFT JOIN again ON again.id = target.id
    """,
)


class WorkflowDependencyResultsParams(TypedDict):
    job_id: uuid.UUID


# What a running step may read of its dependencies (ctx.dependency_results): by the
# downstream index, each upstream's name, status and result (inline, or its key in the
# result store).
WORKFLOW_DEPENDENCY_RESULTS = Query[WorkflowDependencyResultsParams](
    "workflow_dependency_results",
    "A step's dependencies: each one's name, status, and result inline or by reference.",
    """
    SELECT up.name, e.policy, j.id, j.status, j.result, j.result_ref, j.last_error
    FROM jobcore.workflow_edges AS e
    JOIN jobcore.workflow_jobs AS up ON up.job_id = e.upstream
    JOIN jobcore.jobs AS j ON j.id = e.upstream
    WHERE e.downstream = %(job_id)s
    ORDER BY up.name
    """,
)


class WorkflowPruneParams(TypedDict):
    keep: float
    limit: int


# Retention: workflows finished longer ago than `keep` seconds go with their steps (and
# what belongs to each step, as the job pruner deletes it: effects, deliveries, events,
# quarantined messages); their step and edge rows by their foreign keys. A workflow
# reopened by a retry has no finished_at, so it is not taken. Returns the steps' files.
WORKFLOW_PRUNE_BATCH = Query[WorkflowPruneParams](
    "workflow_prune_batch",
    "Delete a batch of workflows finished past their retention, with their steps and "
    "what belongs to them.",
    f"""
    WITH doomed_workflows AS (
        SELECT id FROM jobcore.workflows
        WHERE finished_at IS NOT NULL
          AND finished_at < now() - make_interval(secs => %(keep)s)
        ORDER BY finished_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ), doomed AS (
        SELECT jobs.id FROM jobcore.jobs JOIN doomed_workflows AS w ON jobs.workflow_id = w.id
        WHERE jobs.status IN {TERMINAL_SQL}
    ), effects AS (
        DELETE FROM jobcore.job_effects
        WHERE job_id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING 1
    ), deliveries AS (
        DELETE FROM jobcore.webhook_deliveries
        WHERE job_id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING 1
    ), timeline AS (
        DELETE FROM jobcore.job_events WHERE job_id = ANY(ARRAY(SELECT id FROM doomed))
    ), messages AS (
        DELETE FROM jobcore.outbox
        WHERE job_id = ANY(ARRAY(SELECT id FROM doomed)) AND quarantined_at IS NOT NULL
    ), gone AS (
        DELETE FROM jobcore.jobs WHERE id = ANY(ARRAY(SELECT id FROM doomed))
        RETURNING id, result_ref, payload_ref
    ), workflows_gone AS (
        DELETE FROM jobcore.workflows WHERE id = ANY(ARRAY(SELECT id FROM doomed_workflows))
        RETURNING id
    )
    SELECT (SELECT count(*) FROM workflows_gone) AS workflows,
           (SELECT count(*) FROM gone) AS jobs,
           (SELECT array_agg(result_ref) FILTER (WHERE result_ref IS NOT NULL) FROM gone)
               AS result_refs,
           (SELECT array_agg(payload_ref) FILTER (WHERE payload_ref IS NOT NULL) FROM gone)
               AS payload_refs
    """,
)


# A replayed request's answer: each step's job id by name (workflow_jobs_workflow_id_name_idx).
WORKFLOW_STEP_IDS = Query[WorkflowIdParams](
    "workflow_step_ids",
    "Each step's name and job id.",
    """
    SELECT name, job_id FROM jobcore.workflow_jobs WHERE workflow_id = %(id)s
    """,
)
