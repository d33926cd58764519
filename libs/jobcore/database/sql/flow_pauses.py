"""Statements on ``flow_pauses``: the queues and job types operators paused.

The claims read this table in their own statement (:func:`paused`), so a pause takes
effect at the next claim of every relay and worker, with no cache to go stale; the table
holds a row per pause (a handful), so the probe is a primary-key lookup.
"""

from __future__ import annotations

from typing import Literal, TypedDict

from jobcore.database.sql import NoParams, Query

PauseKind = Literal["queue", "type"]


def paused(queue: str, job_type: str) -> str:
    """SQL that is true when the queue or the job type given as SQL expressions is paused."""
    return f"""EXISTS (
        SELECT 1 FROM jobcore.flow_pauses AS p
        WHERE (p.kind = 'queue' AND p.name = {queue}) OR (p.kind = 'type' AND p.name = {job_type})
    )"""


def pause_kind(queue: str, job_type: str) -> str:
    """SQL for what is paused of the queue and job type given as SQL expressions: 'queue'
    (whether or not the type is too), 'type', or NULL."""
    return f"""(
        SELECT min(p.kind) FROM jobcore.flow_pauses AS p
        WHERE (p.kind = 'queue' AND p.name = {queue}) OR (p.kind = 'type' AND p.name = {job_type})
    )"""


class FlowPauseParams(TypedDict):
    kind: PauseKind
    name: str


class FlowPauseSetParams(FlowPauseParams):
    paused_by: str


FLOW_PAUSE_SET = Query[FlowPauseSetParams](
    "flow_pause_set",
    "Pause a queue or a job type (pausing twice keeps the first pause); was_paused says so.",
    """
    WITH before AS (
        SELECT paused_at FROM jobcore.flow_pauses WHERE kind = %(kind)s AND name = %(name)s
    ), inserted AS (
        INSERT INTO jobcore.flow_pauses (kind, name, paused_by)
        VALUES (%(kind)s, %(name)s, %(paused_by)s)
        ON CONFLICT (kind, name) DO NOTHING
        RETURNING paused_at
    )
    SELECT EXISTS (SELECT 1 FROM before) AS was_paused,
           coalesce((SELECT paused_at FROM inserted), (SELECT paused_at FROM before))
               AS paused_at
    """,
)


class FlowPauseClearParams(FlowPauseParams):
    channel: str


# Resuming wakes the relays (the outbox channel): the rows they left alone are due.
FLOW_PAUSE_CLEAR = Query[FlowPauseClearParams](
    "flow_pause_clear",
    "Resume a queue or a job type and wake the relays; was_paused says whether it was.",
    """
    WITH deleted AS (
        DELETE FROM jobcore.flow_pauses WHERE kind = %(kind)s AND name = %(name)s
        RETURNING paused_at, paused_by
    )
    SELECT EXISTS (SELECT 1 FROM deleted) AS was_paused,
           (SELECT paused_at FROM deleted) AS paused_at,
           (SELECT paused_by FROM deleted) AS paused_by,
           pg_notify(%(channel)s, '') IS NULL AS notified
    """,
)


FLOW_PAUSE_LIST = Query[NoParams](
    "flow_pause_list",
    "Every pause, queues first, by name.",
    """
    SELECT kind, name, paused_by, paused_at FROM jobcore.flow_pauses ORDER BY kind, name
    """,
)


# `jobcore queues list`: the queues that have jobs waiting or running, or are paused, with
# their counts (the open jobs, like the /metrics backlog: each status from its own index,
# jobcore.database.sql.jobs.reads.JOB_COUNT_OPEN_BY_QUEUE).
FLOW_QUEUE_OVERVIEW = Query[NoParams](
    "flow_queue_overview",
    "Per queue: pending and running jobs, and whether (since when, by whom) it is paused.",
    """
    WITH pending AS (
        SELECT queue, count(*) AS n FROM jobcore.jobs WHERE status = 'pending' GROUP BY queue
    ), running AS (
        SELECT queue, count(*) AS n FROM jobcore.jobs WHERE status = 'running' GROUP BY queue
    ), open AS (
        SELECT queue, coalesce(pending.n, 0) AS pending, coalesce(running.n, 0) AS running
        FROM pending FULL JOIN running USING (queue)
    ), names AS (
        SELECT queue AS name FROM open
        UNION SELECT name FROM jobcore.flow_pauses WHERE kind = 'queue'
    )
    SELECT names.name AS queue,
           coalesce(open.pending, 0) AS pending, coalesce(open.running, 0) AS running,
           p.paused_at IS NOT NULL AS paused, p.paused_at, p.paused_by
    FROM names
    LEFT JOIN open ON open.queue = names.name
    LEFT JOIN jobcore.flow_pauses AS p ON p.kind = 'queue' AND p.name = names.name
    ORDER BY names.name
    """,
)
