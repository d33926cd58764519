"""A job's timeline and where it is now, in words.

:func:`whereabouts` is pure: it reads a job row as the job reads return it (``jobs.*``
plus :data:`jobcore.database.sql.job_events.WHEREABOUTS_COLUMNS`: its latest job message still in
the outbox, its latest event, and the database's ``now()`` as ``read_at``) and says where
the job is and what it waits for, for people (an SRE at 3 a.m., a client polling it).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from jobcore.kernel.jobevents import DETAIL_TEXT_CHARS, JobEventKind


@dataclass(frozen=True, slots=True)
class JobEvent:
    id: int
    at: datetime
    kind: str
    attempt: int | None
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": self.at,
            "kind": self.kind,
            "attempt": self.attempt,
            "detail": self.detail,
        }


@dataclass(frozen=True, slots=True)
class JobTimeline:
    """A job's events, oldest first (the latest ``limit`` of them), and where it is now."""

    job_id: uuid.UUID
    tenant: str
    type: str
    status: str
    where: str
    events: list[JobEvent]
    # False when this deployment records no events (JOBCORE_JOB_EVENTS=false): the list
    # then holds only what was recorded before they were turned off.
    events_recorded: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "tenant": self.tenant,
            "type": self.type,
            "status": self.status,
            "where": self.where,
            "events": [event.as_dict() for event in self.events],
            "events_recorded": self.events_recorded,
        }


# The columns WHEREABOUTS_COLUMNS adds to a job row: what whereabouts reads, not the job's.
WHEREABOUTS_KEYS = (
    "message_outbox_id",
    "message_created_at",
    "message_available_at",
    "message_attempts",
    "message_last_error",
    "message_failing_since",
    "message_quarantined_at",
    "last_event_kind",
    "last_event_at",
    "last_event_attempt",
    "last_event_detail",
    "read_at",
)


# What the `accepted`, `claimed` and first `published` events say: the timeline shows them,
# the job's own view does not.
TIMELINE_ONLY_KEYS = (
    "accepted_detail",
    "accepted_in_batch",
    "claimed_at",
    "claim_lease_until",
    "published_at",
    "published_by",
    "published_message_id",
)


def with_where(job: Mapping[str, Any]) -> dict[str, Any]:
    """The job's own columns, and ``where`` in place of what it was said from."""
    hidden = (*WHEREABOUTS_KEYS, *TIMELINE_ONLY_KEYS)
    shown = {key: value for key, value in job.items() if key not in hidden}
    shown["where"] = whereabouts(job)
    return shown


def whereabouts(job: Mapping[str, Any]) -> str:
    """Where the job is now and what it waits for, in one sentence."""
    now: datetime = job["read_at"]
    status = job["status"]
    if status == "succeeded":
        return f"succeeded at {_clock(job['finished_at'], now)} on attempt {job['attempts']}"
    if status == "failed":
        return (
            f"failed at {_clock(job['finished_at'], now)} after attempt {job['attempts']} "
            f"of {job['max_attempts']}: {_text(job['last_error'])}"
        )
    if status == "cancelled":
        return f"cancelled at {_clock(job['finished_at'], now)}"
    if status == "running":
        return _running(job, now)
    return _pending(job, now)


def _running(job: Mapping[str, Any], now: datetime) -> str:
    lease: datetime | None = job["lease_expires_at"]
    where = (
        f"running on worker {job['worker_id']} (attempt {job['attempts']} of {job['max_attempts']})"
    )
    if lease is not None and lease < now:
        where += (
            f", but its lease expired {_duration(now - lease)} ago: the reaper puts it back "
            "to pending (or ends it) on its next round"
        )
    elif lease is not None:
        where += f", lease until {_clock(lease, now)}"
    if job["cancel_requested_at"] is not None:
        where += (
            f"; cancellation requested at {_clock(job['cancel_requested_at'], now)}, "
            "waiting for the worker to stop it"
        )
    return where


def _pending(job: Mapping[str, Any], now: datetime) -> str:
    # An operator's pause holds the job wherever its message is (kept in the outbox, or
    # parked back into it by a worker): nothing moves until the resume.
    paused = job.get("paused")
    if paused == "queue":
        return (
            f"waiting: its queue {job['queue']} is paused "
            f"(`jobcore queues resume {job['queue']}` lets it run)"
        )
    if paused is not None:
        return (
            f"waiting: its job type {job['type']} is paused "
            f"(`jobcore types resume {job['type']}` lets it run)"
        )
    held = job.get("held_reason")
    if held == "dependencies":
        return (
            f"waiting for its dependencies in workflow {job.get('workflow_id')}: the settle "
            "of the last one it waits for publishes it"
        )
    if held is not None:
        return {
            "ordering": "held: an earlier job of its ordering key has not finished",
            "concurrency": "held: its concurrency limit's slots are all running",
            "rate_limit": "held: waiting for its rate limit's next start",
        }.get(held, f"held: {held}") + " (the gate releaser publishes it again when it may start)"
    next_attempt = job["attempts"] + 1
    if job["message_outbox_id"] is not None:
        return _in_outbox(job, now)
    dead_letter = _dead_letter(job, next_attempt)
    if dead_letter is not None:
        return dead_letter
    waiting = (
        f"for a worker to take it from queue {job['queue']}: a backlog, or no worker "
        "consuming that queue"
    )
    if job["last_event_kind"] == JobEventKind.PUBLISHED:
        since = job["last_event_at"]
        return (
            f"published at {_clock(since, now)} (attempt {next_attempt}), waiting "
            f"{_duration(now - since)} {waiting}"
        )
    # A message published once is said by its headers, and kept on the job row by its
    # claim, not before (docs/design.md): until then only the job row's last change, after
    # which its message left the outbox, dates it.
    since = job["updated_at"]
    return (
        f"published at or after {_clock(since, now)} (attempt {next_attempt}), waiting up "
        f"to {_duration(now - since)} {waiting}"
    )


def _in_outbox(job: Mapping[str, Any], now: datetime) -> str:
    outbox_id = job["message_outbox_id"]
    error = job["message_last_error"]
    if job["message_quarantined_at"] is not None:
        return (
            f"quarantined in the outbox since {_clock(job['message_quarantined_at'], now)} "
            f"({_text(error)}): `jobcore outbox requeue {outbox_id}` publishes it again, "
            f"`jobcore outbox discard {outbox_id}` drops it"
        )
    available: datetime = job["message_available_at"]
    if job["message_failing_since"] is not None:
        return (
            f"in the outbox for {_duration(now - job['message_created_at'])}: the broker "
            f"refused it {job['message_attempts']} times ({_text(error)}); the relay tries "
            f"again at {_clock(available, now)}"
        )
    if available > now:
        if job["last_event_kind"] == JobEventKind.SNOOZED:
            return (
                f"snoozed by its handler until {_clock(available, now)} "
                f"(snooze {job['snoozes']}; its attempt {job['attempts'] + 1} is not spent)"
            )
        if job["last_event_kind"] == JobEventKind.EDITED:
            return f"due at {_clock(available, now)} (its run_at, changed in place)"
        if job["attempts"] > 0:
            return (
                f"in backoff until {_clock(available, now)} after attempt {job['attempts']} "
                f"failed: {_text(job['last_error'])}"
            )
        return f"due at {_clock(available, now)} (its run_at)"
    return f"in the outbox for {_duration(now - available)}: relay lag"


def _dead_letter(job: Mapping[str, Any], attempt: int) -> str | None:
    """The sentence for a pending job whose current attempt's message was dead-lettered."""
    detail: Mapping[str, Any] = job["last_event_detail"] or {}
    if job["last_event_kind"] == JobEventKind.DEAD_LETTERED and job["last_event_attempt"] == (
        attempt
    ):
        at = _clock(job["last_event_at"], job["read_at"])
        reason = _text(detail.get("reason"))
        if detail.get("by") == "worker":  # the reason says what to do
            return f"in the dead-letter queue since {at}: {reason}"
        return _broker_dead_letter(at, reason)
    note: Mapping[str, Any] = job["message_note"] or {}
    if note.get("event") == "dead_lettered" and note.get("attempt") == attempt:
        return _broker_dead_letter(str(note.get("at", "")), _text(note.get("reason")))
    return None


def _broker_dead_letter(at: str, reason: str) -> str:
    return (
        f"dead-lettered by the broker at {at} ({reason}): `jobcore dlq replay` runs it now, "
        "or the sweeper publishes it again once it has been stale"
    )


def _text(value: object) -> str:
    if value is None or value == "":
        return "no error recorded"
    text = str(value)
    return text if len(text) <= DETAIL_TEXT_CHARS else text[: DETAIL_TEXT_CHARS - 1] + "…"


def _clock(when: datetime, now: datetime) -> str:
    """A time of day in UTC if it is the day of ``now`` there, else the date too."""
    when_utc = when.astimezone(UTC)
    if when_utc.date() == now.astimezone(UTC).date():
        return when_utc.strftime("%H:%M:%S UTC")
    return when_utc.strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(span: timedelta) -> str:
    seconds = max(0, round(span.total_seconds()))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} days {hours % 24} h"
