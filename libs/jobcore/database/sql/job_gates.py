"""The pruner's statements on ``job_gates`` (jobcore.maintenance.retention): idle gate rows go.

A gate row (jobcore.kernel.gates) is one per ordering key, per concurrency key and per rate key
ever seen. It is *idle*, and deleted, when it has not been written for ``keep`` seconds,
holds no state that is still ahead (a rate key's ``tat`` and ``released_until`` more than
``keep`` in the past, so a fresh row reads the same), and nothing waits on it: no running
or held job of its concurrency key, no held job of its rate key, and, for an ordering key
(the only kind whose row counts something: the places handed out), no job of the key left
at all, so a place is never handed out twice while a job holds it.

No race with a claim or an enqueue about to use the row: the prune locks the rows it
deletes (FOR UPDATE SKIP LOCKED, skipping those a claim holds); the claims' lock
(jobcore.database.sql.jobs.run.JOB_GATES_LOCK) and the enqueue's place (an INSERT ... ON CONFLICT DO
UPDATE) wait for that lock and then write a fresh row. A row written since the prune's
snapshot (an enqueue's place, a claim's rate token, a claim's lock, which touches
``updated_at`` at most once a minute) is checked again in its new version when locked,
and is no longer idle. A concurrency key's row holds no state: a row deleted just before a
claim locks it costs only its insert again.
"""

from __future__ import annotations

from typing import TypedDict

from jobcore.database.sql import Query


class JobGatesPruneCountParams(TypedDict):
    keep: float


class JobGatesPruneBatchParams(JobGatesPruneCountParams):
    limit: int


# An ordering key's row is 'ordering:<tenant>:<key>' (jobcore.database.sql.jobs.enqueue), and a
# tenant has no ':' (jobcore.access.apikeys): its jobs are found by jobs_ordering_idx.
_IDLE = """
    gate.updated_at < now() - make_interval(secs => %(keep)s)
    AND (gate.tat IS NULL OR gate.tat < now() - make_interval(secs => %(keep)s))
    AND (gate.released_until IS NULL
         OR gate.released_until < now() - make_interval(secs => %(keep)s))
    AND NOT EXISTS (
        SELECT 1 FROM jobcore.jobs
        WHERE jobs.concurrency_key = gate.key AND jobs.status = 'running'
    )
    AND NOT EXISTS (
        SELECT 1 FROM jobcore.jobs
        WHERE jobs.concurrency_key = gate.key
          AND jobs.status = 'pending' AND jobs.held_reason = 'concurrency'
    )
    AND NOT EXISTS (
        SELECT 1 FROM jobcore.jobs
        WHERE jobs.rate_key = gate.key
          AND jobs.status = 'pending' AND jobs.held_reason = 'rate_limit'
    )
    AND (gate.counter = 0 OR NOT EXISTS (
        SELECT 1 FROM jobcore.jobs
        WHERE gate.key LIKE 'ordering:%%'
          AND jobs.tenant = split_part(gate.key, ':', 2)
          AND jobs.ordering_key
              = substr(gate.key, length('ordering:') + length(split_part(gate.key, ':', 2)) + 2)
    ))
"""

JOB_GATES_PRUNE_COUNT = Query[JobGatesPruneCountParams](
    "job_gates_prune_count",
    "Count the idle gate rows the pruner would delete.",
    f"""
    SELECT count(*) AS job_gates FROM jobcore.job_gates AS gate WHERE {_IDLE}
    """,
)

JOB_GATES_PRUNE_BATCH = Query[JobGatesPruneBatchParams](
    "job_gates_prune_batch",
    "Delete a batch of idle gate rows, skipping any a claim holds.",
    f"""
    WITH idle AS (
        SELECT gate.key FROM jobcore.job_gates AS gate
        WHERE {_IDLE}
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    )
    DELETE FROM jobcore.job_gates USING idle WHERE job_gates.key = idle.key
    """,
)
