"""The pruner's statements on ``job_keys`` (jobcore.maintenance.retention): spent keys go.

A debounce or throttle key's row (jobcore.kernel.keyed) is needed while the job it names is
open to the key's enqueues: a throttle's until its period ends, a debounce's until its
trailing job is claimed. It is *spent*, and deleted, once ``expires_at`` (the period's
end, or the trailing job's due time) is more than ``keep`` seconds past and the job's
first message is no longer in the outbox (a debounced job held by its gates that long
is left to run as it is: the key's next enqueue opens a new job). A key whose row was
deleted starts afresh at its next enqueue, as a key never seen would.

No race with an enqueue of the key: the prune locks the rows it deletes (FOR UPDATE SKIP
LOCKED, skipping those an enqueue holds), and an enqueue's INSERT ... ON CONFLICT waits for
that lock and then writes a fresh row. A row an enqueue changed since the prune's
snapshot is checked again in its new version when locked.
"""

from __future__ import annotations

from typing import TypedDict

from jobcore.database.sql import Query


class JobKeysPruneCountParams(TypedDict):
    keep: float


class JobKeysPruneBatchParams(JobKeysPruneCountParams):
    limit: int


# The key's message is its job's: found by job (outbox_job_idx), as message ids have no
# index of their own (migration 0042).
_SPENT = """
    k.expires_at < now() - make_interval(secs => %(keep)s)
    AND NOT EXISTS (
        SELECT 1 FROM jobcore.outbox
        WHERE outbox.job_id = k.job_id AND outbox.message_id = k.message_id
    )
"""

JOB_KEYS_PRUNE_COUNT = Query[JobKeysPruneCountParams](
    "job_keys_prune_count",
    "Count the spent debounce and throttle keys the pruner would delete.",
    f"""
    SELECT count(*) AS job_keys FROM jobcore.job_keys AS k WHERE {_SPENT}
    """,
)

JOB_KEYS_PRUNE_BATCH = Query[JobKeysPruneBatchParams](
    "job_keys_prune_batch",
    "Delete a batch of spent debounce and throttle keys, skipping any an enqueue holds.",
    f"""
    WITH spent AS (
        SELECT k.key FROM jobcore.job_keys AS k
        WHERE {_SPENT}
        ORDER BY k.expires_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM jobcore.job_keys USING spent WHERE job_keys.key = spent.key
    """,
)


class JobKeysDueNowParams(TypedDict):
    # None: every tenant's.
    tenant: str | None


# The testing kit's stand-in for a debounce period passing (jobcore.testing.draining): the
# trailing jobs still open to their keys become due now, their messages with them, as they
# would once their keys had been quiet for the period.
JOB_KEYS_DUE_NOW = Query[JobKeysDueNowParams](
    "job_keys_due_now",
    "Make the debounced jobs still open to their keys due now (the testing kit's clock).",
    """
    WITH open AS (
        SELECT k.job_id, k.message_id FROM jobcore.job_keys AS k
        WHERE k.kind = 'debounce' AND (%(tenant)s::text IS NULL OR k.tenant = %(tenant)s)
    ), moved AS (
        UPDATE jobcore.outbox SET available_at = now()
        FROM open
        WHERE outbox.job_id = open.job_id AND outbox.message_id = open.message_id
          AND outbox.available_at > now()
        RETURNING outbox.job_id
    )
    UPDATE jobcore.jobs SET next_attempt_at = now(), updated_at = now()
    FROM moved
    WHERE jobs.id = moved.job_id AND jobs.status = 'pending'
    RETURNING jobs.id
    """,
)
