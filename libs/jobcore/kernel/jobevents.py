"""The kinds of event on a job's timeline (``job_events``), shared by the statements that
write them and the code that reads them. Imports nothing of ours."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

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
    # A worker took it (detail: worker, lease_until). Not a job_events row since migration
    # 0040 (rows written before, or by a worker of the previous revision, stay): the claim
    # is kept on the job row, then carried by the event that ends its attempt; with_claims
    # lists it.
    CLAIMED = "claimed"
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


# --- the `claimed` events, said from where the claim is kept ---------------------------------

# The id of an entry that is not a row of its own (as `accepted`'s): the order is by time.
NO_ROW_ID = 0


def _time(value: datetime | str) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def with_claims(
    events: Iterable[Mapping[str, Any]], job: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """A job's events (each with ``id``, ``at``, ``kind``, ``attempt``, ``detail``) with a
    `claimed` event for each claim, in the order of the timeline: by ``at``, then ``id``.

    A claim is kept on the job row while the job is on its attempt (``job``: ``attempts``,
    ``worker_id``, ``started_at``, ``claimed_at``, ``claim_lease_until``), and in
    ``detail.claim`` of the event that moves the job on to another attempt, which this
    takes out of that event's detail. A worker of the previous revision, during a rolling
    upgrade, writes its claim as a `claimed` row and leaves the job row's claim as it was
    (an older claim): such a row wins over the claim the job row or a later event still
    holds for the same attempt, so no claim is listed twice.
    """
    listed = [dict(event) for event in events]
    rows = [(e["attempt"], _time(e["at"])) for e in listed if e["kind"] == JobEventKind.CLAIMED]
    said: list[dict[str, Any]] = []
    carried: set[datetime] = set()
    for event in listed:
        detail = event["detail"]
        claim = detail.get("claim") if isinstance(detail, dict) else None
        if claim is None:
            continue
        event["detail"] = {key: value for key, value in detail.items() if key != "claim"}
        at = _time(claim["at"])
        carried.add(at)
        # A `claimed` row of this attempt between the claim and its end: a previous
        # revision's worker claimed it since, and this claim is the job row's older one.
        ended = _time(event["at"])
        if not any(a == event["attempt"] and at <= row_at <= ended for a, row_at in rows):
            said.append(_claimed(at, event["attempt"], claim.get("worker"), claim["lease_until"]))
    lease_until = job.get("claim_lease_until")
    started = job.get("claimed_at") or job.get("started_at")
    if lease_until is not None and started is not None:
        at = _time(started)
        attempt = job["attempts"]
        if at not in carried and not any(a == attempt and row_at >= at for a, row_at in rows):
            said.append(_claimed(at, attempt, job.get("worker_id"), lease_until))
    return sorted([*listed, *said], key=lambda e: (_time(e["at"]), e["id"]))


def _claimed(at: datetime, attempt: int | None, worker: Any, lease_until: Any) -> dict[str, Any]:
    return {
        "id": NO_ROW_ID,
        "at": at,
        "kind": JobEventKind.CLAIMED.value,
        "attempt": attempt,
        "detail": {"worker": worker, "lease_until": lease_until},
    }
