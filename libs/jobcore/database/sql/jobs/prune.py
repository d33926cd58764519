"""The pruner (jobcore.maintenance.retention): finished jobs past their retention, counted and
deleted in batches with what belongs to them.

The pruner's *rules* are parallel arrays ``statuses``, ``types``, ``keep`` (seconds), one
per (status, type) pair that has finished jobs (:data:`JOB_TERMINAL_KINDS` lists them), so
every rule is one range scan of ``jobs_finished_idx`` (status, type, finished_at).
"""

from __future__ import annotations

import uuid
from typing import TypedDict

from jobcore.database.sql import (
    TERMINAL_SQL,
    NoParams,
    Query,
    status_is,
)
from jobcore.kernel.states import JobStatus

# --- the pruner (jobcore.maintenance.retention) -----------------------------------------


_RULES = """
    rules AS (
        SELECT *
        FROM unnest(%(statuses)s::text[], %(types)s::text[], %(keep)s::float8[])
            AS r(status, type, keep)
    )"""


# The distinct (status, type) pairs of finished jobs by a loose index scan: one index
# probe per pair, however many jobs there are, then the oldest finished_at of each.
JOB_TERMINAL_KINDS = Query[NoParams](
    "job_terminal_kinds",
    "Each (status, type) of finished jobs, with how long ago its oldest one finished.",
    f"""
    WITH RECURSIVE kinds AS (
        (
            SELECT status, type FROM jobcore.jobs
            WHERE status IN {TERMINAL_SQL}
            ORDER BY status, type
            LIMIT 1
        )
        UNION ALL
        SELECT next.status, next.type
        FROM kinds
        CROSS JOIN LATERAL (
            SELECT status, type FROM jobcore.jobs
            WHERE status IN {TERMINAL_SQL} AND (status, type) > (kinds.status, kinds.type)
            ORDER BY status, type
            LIMIT 1
        ) AS next
    )
    SELECT kinds.status, kinds.type,
           extract(epoch FROM now() - oldest.finished_at)::float8 AS oldest_age
    FROM kinds
    CROSS JOIN LATERAL (
        SELECT finished_at FROM jobcore.jobs
        WHERE jobs.status = kinds.status AND jobs.type = kinds.type
          AND jobs.status IN {TERMINAL_SQL} AND finished_at IS NOT NULL
        ORDER BY finished_at
        LIMIT 1
    ) AS oldest
    ORDER BY kinds.status, kinds.type
    """,
)


class JobPruneCountParams(TypedDict):
    keep: list[float]
    statuses: list[str]
    types: list[str]


# What JOB_PRUNE_BATCH would delete now, per rule, and what would go with those jobs.
JOB_PRUNE_COUNT = Query[JobPruneCountParams](
    "job_prune_count",
    "Count, per (status, type), the finished jobs past their retention and what goes with them.",
    f"""
    WITH {_RULES}
    SELECT rules.status, rules.type,
           count(doomed.id) AS jobs,
           coalesce(sum(doomed.job_effects), 0)::bigint AS job_effects,
           coalesce(sum(doomed.webhook_deliveries), 0)::bigint AS webhook_deliveries,
           coalesce(sum(doomed.outbox), 0)::bigint AS outbox,
           count(doomed.result_ref) AS result_files
    FROM rules
    LEFT JOIN LATERAL (
        SELECT jobs.id, jobs.result_ref,
               (SELECT count(*) FROM jobcore.job_effects WHERE job_id = jobs.id) AS job_effects,
               (SELECT count(*) FROM jobcore.webhook_deliveries WHERE job_id = jobs.id)
                   AS webhook_deliveries,
               (SELECT count(*) FROM jobcore.outbox
                WHERE job_id = jobs.id AND quarantined_at IS NOT NULL) AS outbox
        FROM jobcore.jobs
        WHERE jobs.status = rules.status AND jobs.type = rules.type
          AND jobs.status IN {TERMINAL_SQL}
          AND jobs.finished_at < now() - make_interval(secs => rules.keep)
    ) AS doomed ON true
    GROUP BY rules.status, rules.type
    ORDER BY rules.status, rules.type
    """,
)


class JobPruneBatchParams(TypedDict):
    keep: list[float]
    limit: int
    statuses: list[str]
    types: list[str]


# Every statement repeats `status IN (terminal)` although the rule names the status: the
# planner uses the partial index only when the query implies its predicate by itself.
#
# One batch: at most `limit` jobs past their retention, oldest first within each rule,
# locked (SKIP LOCKED: a job someone is touching waits for the next round, nobody waits
# for us), then deleted with what belongs to them: its timeline's events, by its id (they
# have no foreign key, so nothing else deletes them). Effects and deliveries would go by
# their foreign keys' ON DELETE CASCADE (index-backed: job_effects_job_id_idx,
# webhook_deliveries_job_created_idx); deleting them here first counts them. Quarantined
# outbox rows of the job (never published, so never to be) go too, on
# outbox_quarantined_job_idx; unquarantined rows are the relay's to publish, and a worker
# acknowledges a message whose job is gone with no effect. The ids go to each DELETE as one
# array (`= ANY`), which the planner serves from the index whatever it guesses the tables
# hold; `IN (SELECT ...)` was planned as a hash join over a sequential scan of the outbox.
# Returns one row per job, with its result_ref: the caller deletes those files once this
# commits.
JOB_PRUNE_BATCH = Query[JobPruneBatchParams](
    "job_prune_batch",
    "Delete a batch of finished jobs past their retention, with their effects, deliveries and "
    "quarantined outbox rows.",
    f"""
    WITH {_RULES}, doomed AS (
        SELECT job.id
        FROM rules
        CROSS JOIN LATERAL (
            SELECT id FROM jobcore.jobs
            WHERE jobs.status = rules.status AND jobs.type = rules.type
              AND jobs.status IN {TERMINAL_SQL}
              AND jobs.finished_at < now() - make_interval(secs => rules.keep)
              -- A workflow's jobs go with their workflow (WORKFLOW_PRUNE_BATCH).
              AND jobs.workflow_id IS NULL
            ORDER BY jobs.finished_at
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED
        ) AS job
        LIMIT %(limit)s
    ), effects AS (
        DELETE FROM jobcore.job_effects WHERE job_id = ANY(ARRAY(SELECT id FROM doomed)) RETURNING 1
    ), deliveries AS (
        DELETE FROM jobcore.webhook_deliveries WHERE job_id = ANY(ARRAY(SELECT id FROM doomed))
        RETURNING 1
    ), timeline AS (
        -- no foreign key cascades them (migration 0019); job_events_pkey leads with job_id
        DELETE FROM jobcore.job_events WHERE job_id = ANY(ARRAY(SELECT id FROM doomed))
    ), messages AS (
        DELETE FROM jobcore.outbox
        WHERE job_id = ANY(ARRAY(SELECT id FROM doomed)) AND quarantined_at IS NOT NULL
        RETURNING 1
    ), gone AS (
        DELETE FROM jobcore.jobs WHERE id = ANY(ARRAY(SELECT id FROM doomed))
        RETURNING id, status, type, result_ref, payload_ref
    )
    SELECT gone.id, gone.status, gone.type, gone.result_ref, gone.payload_ref,
           (SELECT count(*) FROM effects) AS job_effects,
           (SELECT count(*) FROM deliveries) AS webhook_deliveries,
           (SELECT count(*) FROM messages) AS outbox
    FROM gone
    """,
)


class JobFilesKeptParams(TypedDict):
    # Parallel arrays: each file's key and the job its key names.
    ids: list[uuid.UUID]
    keys: list[str]


# For the result-file sweep (primary key probes): a file is kept while its job may still
# need it. A pending or running job keeps every file of its own: an attempt may be writing
# one, and name it in its success. A job that ended keeps only the files its row names;
# the others are results of its attempts that failed or lost their lease (each attempt
# writes under a key of its own, jobcore.storage.results.result_key). A job gone keeps none.
JOB_FILES_KEPT = Query[JobFilesKeptParams](
    "job_files_kept",
    "Which of the given result-store files their job still needs.",
    f"""
    SELECT file.key
    FROM unnest(%(ids)s::uuid[], %(keys)s::text[]) AS file(id, key)
    JOIN jobcore.jobs ON jobs.id = file.id
    WHERE {status_is("jobs.status", JobStatus.PENDING)}
       OR {status_is("jobs.status", JobStatus.RUNNING)}
       OR file.key = jobs.result_ref
       OR file.key = jobs.payload_ref
    """,
)
