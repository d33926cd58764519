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
    # (detail: relay, message_id, confirmed_at). The first publish of a job's first
    # attempt is no job_events row since migration 0041 (rows written before, or by a
    # relay of the previous revision, stay): the worker's claim keeps it on the job row
    # (published_at, published_by, published_message_id; no confirmed_at), and
    # with_job_row lists it.
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
    CANCELLED = "cancelled"  # ended cancelled (see FINISHED)
    # A workflow step's dependencies allowed it to run: its message was written (detail:
    # workflow). Written by the settle of its last dependency, in that transaction.
    DEPENDENCIES_MET = "dependencies_met"
    # A workflow step cancelled as unreachable waits again, because the dependency that
    # made it unreachable was retried (detail: workflow, dependency).
    REVIVED = "revived"
    # Ended succeeded or failed (detail: status, error), or cancelled (CANCELLED, detail:
    # status). Since migration 0041 the statements that end jobs write no row for it (the
    # reaper's and a workflow's cancel still do): the ended job row says it (status,
    # finished_at, attempts, last_error), and with_job_row lists it; a workflow step
    # retried in place leaves it in its `revived` event (detail.finish).
    FINISHED = "finished"
    WEBHOOK_ATTEMPT = "webhook_attempt"  # a completion webhook was sent (detail: outcome)


# --- the `claimed` events, said from where the claim is kept ---------------------------------

# The id of an entry that is not a row of its own (as `accepted`'s): the order is by time.
NO_ROW_ID = 0


def _time(value: datetime | str) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(value)


def _take_from_detail(event: dict[str, Any], key: str) -> Any:
    """``event["detail"][key]`` (None when absent), taken out of the event's detail: what
    another entry's data rode on this event is listed as that entry, not twice."""
    detail = event["detail"]
    value = detail.get(key) if isinstance(detail, dict) else None
    if value is not None:
        event["detail"] = {k: v for k, v in detail.items() if k != key}
    return value


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
        claim = _take_from_detail(event, "claim")
        if claim is None:
            continue
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


# --- the `published` and ending events, said from the job row -------------------------------

_ENDS = (JobEventKind.FINISHED.value, JobEventKind.CANCELLED.value)
_ENDED = ("succeeded", "failed", "cancelled")


def with_job_row(
    events: Iterable[Mapping[str, Any]], job: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """A job's events (as :func:`with_claims` takes them) with every event the job row
    keeps instead of an event row, in the order of the timeline: the claims
    (:func:`with_claims`), the first publish of its first attempt, and its end.

    ``job`` has, besides what :func:`with_claims` reads, ``status``, ``finished_at``,
    ``last_error``, ``published_at``, ``published_by``, ``published_message_id`` (None:
    the job's ``id``) (any missing: that event is not said; ``{}``: none is). A row written
    before migration 0041, or by a process of the previous revision during a rolling
    upgrade, wins over what the job row says of the same event, so none is listed twice: a
    `published` row dated the job row's publish, an ending row since the job's last
    reopening (a `revived` event, which carries the end it left in ``detail.finish``)."""
    listed = _one_per_message(with_claims(events, job))
    said: list[dict[str, Any]] = []
    ends = [_time(e["at"]) for e in listed if e["kind"] in _ENDS]
    revivals = [e for e in listed if e["kind"] == JobEventKind.REVIVED]
    reopened = max((_time(e["at"]) for e in revivals), default=None)
    for event in revivals:
        finish = _take_from_detail(event, "finish")
        if finish is None:
            continue
        at, revived = _time(finish["at"]), _time(event["at"])
        # An ending row between the end and the revival: a previous revision's statement.
        if not any(at <= end <= revived for end in ends):
            said.append(_end(at, finish.get("status"), finish.get("attempt"), finish.get("error")))
    published_at = job.get("published_at")
    if published_at is not None:
        at = _time(published_at)
        # None beside a publish: the message had the job's own id, which the claim does not
        # keep twice (jobcore.database.sql.jobs.run, _KEEP_PUBLISH).
        message_id = job.get("published_message_id") or job.get("id")
        message = None if message_id is None else str(message_id)
        rows = (e for e in listed if e["kind"] == JobEventKind.PUBLISHED)
        if not any(_time(e["at"]) == at or _message_of(e) == message for e in rows):
            said.append(
                {
                    "id": NO_ROW_ID,
                    "at": at,
                    "kind": JobEventKind.PUBLISHED.value,
                    "attempt": 1,
                    "detail": {"relay": job.get("published_by"), "message_id": message},
                }
            )
    finished_at = job.get("finished_at")
    status = job.get("status")
    ended_again = any(reopened is None or end >= reopened for end in ends)
    if finished_at is not None and status in _ENDED and not ended_again:
        error = job.get("last_error") if status != "succeeded" else None
        said.append(_end(_time(finished_at), status, job.get("attempts"), error))
    return sorted([*listed, *said], key=lambda e: (_time(e["at"]), e["id"]))


def _one_per_message(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events without a second `published` row of one message: a claim that did not
    keep a publish on the job row (its queue paused, its job ended) writes its row, and
    the relay's delete of the confirmed outbox row, coming after it, may write one too.
    The relay's (with the broker's confirm time) is kept."""
    rows: dict[Any, dict[str, Any]] = {}
    for event in events:
        detail = event["detail"]
        message_id = detail.get("message_id") if isinstance(detail, dict) else None
        if event["kind"] != JobEventKind.PUBLISHED or message_id is None:
            continue
        kept = rows.get(message_id)
        if kept is None or ("confirmed_at" in detail and "confirmed_at" not in kept["detail"]):
            rows[message_id] = event
    return [
        e
        for e in events
        if e["kind"] != JobEventKind.PUBLISHED
        or not isinstance(e["detail"], dict)
        or e["detail"].get("message_id") is None
        or rows[e["detail"]["message_id"]] is e
    ]


def _message_of(event: Mapping[str, Any]) -> str | None:
    """The message id a `published` row names ('' for none: it matches no message)."""
    detail = event["detail"]
    named = detail.get("message_id") if isinstance(detail, dict) else None
    return "" if named is None else str(named)


def _end(at: datetime, status: Any, attempt: Any, error: Any) -> dict[str, Any]:
    detail: dict[str, Any] = {"status": status}
    if isinstance(error, str):
        detail["error"] = error[:DETAIL_TEXT_CHARS]
    return {
        "id": NO_ROW_ID,
        "at": at,
        "kind": (JobEventKind.CANCELLED if status == "cancelled" else JobEventKind.FINISHED).value,
        "attempt": attempt,
        "detail": detail,
    }
