"""Statements on ``schedules``: the state of each periodic job schedule
(jobcore.maintenance.schedule_ticks).

``last_tick`` only moves forward (``greatest``), so a clock that steps back never makes a
tick again; the scheduler changes a row only under its lock (``SCHEDULE_LOCK``), in the
transaction that enqueues the tick's job.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import TypedDict

from jobcore.database.sql import NoParams, Query


class ScheduleEnsureManyParams(TypedDict):
    names: list[str]
    now: datetime


SCHEDULE_ENSURE_MANY = Query[ScheduleEnsureManyParams](
    "schedule_ensure_many",
    "Create the state of schedules seen for the first time: their first tick is after now.",
    """
    INSERT INTO jobcore.schedules (name, last_tick)
    SELECT name, %(now)s FROM unnest(%(names)s::text[]) AS name
    ON CONFLICT (name) DO NOTHING
    """,
)


SCHEDULE_LIST = Query[NoParams](
    "schedule_list",
    "Every schedule's state, by name.",
    """
    SELECT name, last_tick, paused, paused_at, last_job_id, last_enqueued_at, created_at,
           updated_at, last_refusal_at, last_refused_tick, last_refusal_reason
    FROM jobcore.schedules ORDER BY name
    """,
)


class ScheduleLockParams(TypedDict):
    name: str


SCHEDULE_LOCK = Query[ScheduleLockParams](
    "schedule_lock",
    "Lock one schedule's state and read it, before enqueueing its ticks or changing it.",
    """
    SELECT name, last_tick, paused, paused_at, last_job_id, last_enqueued_at, created_at,
           updated_at, last_refusal_at, last_refused_tick, last_refusal_reason
    FROM jobcore.schedules WHERE name = %(name)s FOR UPDATE
    """,
)


class ScheduleAdvanceParams(TypedDict):
    name: str
    tick: datetime
    job_id: uuid.UUID | None
    # The round's latest refused tick and why (None: none was refused).
    refused_tick: datetime | None
    refusal_reason: str | None


# A refused tick is handled too: last_tick moves past it, and the refusal is kept until a
# later one replaces it.
SCHEDULE_ADVANCE = Query[ScheduleAdvanceParams](
    "schedule_advance",
    "Record the latest tick handled (never backwards), the job enqueued for it and the "
    "latest tick refused.",
    """
    UPDATE jobcore.schedules
    SET last_tick = greatest(last_tick, %(tick)s),
        last_job_id = coalesce(%(job_id)s, last_job_id),
        last_enqueued_at = CASE WHEN %(job_id)s::uuid IS NULL THEN last_enqueued_at
                                ELSE now() END,
        last_refusal_at = CASE WHEN %(refused_tick)s::timestamptz IS NULL THEN last_refusal_at
                               ELSE now() END,
        last_refused_tick = coalesce(%(refused_tick)s, last_refused_tick),
        last_refusal_reason = CASE WHEN %(refused_tick)s::timestamptz IS NULL
                                   THEN last_refusal_reason ELSE %(refusal_reason)s END,
        updated_at = now()
    WHERE name = %(name)s
    """,
)


class ScheduleSetPausedParams(TypedDict):
    name: str
    paused: bool
    now: datetime


# Resuming moves last_tick to now: the ticks that passed while paused are not made up.
SCHEDULE_SET_PAUSED = Query[ScheduleSetPausedParams](
    "schedule_set_paused",
    "Pause or resume a schedule (resuming skips the ticks that passed while it was paused).",
    """
    UPDATE jobcore.schedules
    SET paused = %(paused)s,
        paused_at = CASE WHEN %(paused)s THEN coalesce(paused_at, now()) END,
        last_tick = CASE WHEN paused AND NOT %(paused)s THEN greatest(last_tick, %(now)s)
                         ELSE last_tick END,
        updated_at = now()
    WHERE name = %(name)s
    RETURNING name, last_tick, paused, paused_at, last_job_id, last_enqueued_at, created_at,
              updated_at, last_refusal_at, last_refused_tick, last_refusal_reason
    """,
)
