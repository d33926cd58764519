"""The kinds of event on a job's timeline (``job_events``), shared by the statements that
write them and the code that reads them. Imports nothing of ours."""

from __future__ import annotations

from enum import StrEnum

# What an event keeps of a text (an error, a reason): enough to say why, small enough that
# a timeline of many attempts stays small. The job row keeps the longer last_error.
DETAIL_TEXT_CHARS = 300


class JobEventKind(StrEnum):
    """What happened. ``attempt`` is the job's attempt it happened to, when there is one."""

    # Written (detail: run_at, schedule, batch). Not a job_events row: the job row itself
    # (created_at, accepted_detail), which the timeline's read lists as its first event.
    ACCEPTED = "accepted"
    # The broker confirmed its message; dated when its relay took the row to publish it
    # (detail: relay, message_id, confirmed_at).
    PUBLISHED = "published"
    CLAIMED = "claimed"  # a worker took it (detail: worker, lease_until)
    RETRY_SCHEDULED = "retry_scheduled"  # an attempt failed (detail: until, error)
    # Its worker shut down mid-attempt, or met an object store outage (detail: worker; for
    # an outage also error, until): the attempt does not count.
    RELEASED = "released"
    # Its handler asked to run it again later (detail: until, snoozes): the attempt does
    # not count.
    SNOOZED = "snoozed"
    # Changed in place while pending (detail: fields, run_at, priority, by): PATCH /jobs/{id}.
    EDITED = "edited"
    LEASE_LOST = "lease_lost"  # the reaper found its lease expired (detail: worker, then)
    CANCEL_REQUESTED = "cancel_requested"  # while running (the worker is told)
    QUARANTINED = "quarantined"  # the relay gave up on its message (detail: outbox_id, error)
    DEAD_LETTERED = "dead_lettered"  # its message went to the DLQ (detail: by, reason)
    REPUBLISHED = "republished"  # the sweeper wrote its message again (detail: reason)
    CANCELLED = "cancelled"  # ended cancelled
    # A workflow step's dependencies allowed it to run: its message was written (detail:
    # workflow). Written by the settle of its last dependency, in that transaction.
    DEPENDENCIES_MET = "dependencies_met"
    # A workflow step cancelled as unreachable waits again, because the dependency that
    # made it unreachable was retried (detail: workflow, dependency).
    REVIVED = "revived"
    FINISHED = "finished"  # ended succeeded or failed (detail: status, error)
    WEBHOOK_ATTEMPT = "webhook_attempt"  # a completion webhook was sent (detail: outcome)
