"""with_job_row: the `published` and ending events a timeline lists from the job row
(migration 0041) beside the rows, in order, each once, also while relays and workers of
the previous revision (which write those rows) run next to the new ones; and the header
the relay says a publish in."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from jobcore.kernel.envelope import PUBLISHED_HEADER, published_header, read_published
from jobcore.kernel.jobevents import DETAIL_TEXT_CHARS, NO_ROW_ID, with_job_row

T0 = datetime(2026, 12, 6, 20, 0, tzinfo=UTC)
MESSAGE = uuid.UUID("00000000-0000-4000-8000-000000000001")


def t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def event(id: int, at: float, kind: str, attempt: int | None, **detail: Any) -> dict[str, Any]:
    return {"id": id, "at": t(at), "kind": kind, "attempt": attempt, "detail": detail}


def job(
    status: str,
    attempts: int,
    *,
    published: float | None = None,
    started: float | None = None,
    finished: float | None = None,
    last_error: str | None = None,
) -> dict[str, Any]:
    return {
        "status": status,
        "attempts": attempts,
        "worker_id": "w1",
        "started_at": None if started is None else t(started),
        "claimed_at": None,
        "claim_lease_until": None if started is None else "L1",
        "finished_at": None if finished is None else t(finished),
        "last_error": last_error,
        "published_at": None if published is None else t(published),
        "published_by": None if published is None else "relay-1",
        "published_message_id": None if published is None else MESSAGE,
    }


def summary(events: list[dict[str, Any]]) -> list[tuple[str, int | None, datetime]]:
    return [(e["kind"], e["attempt"], e["at"]) for e in events]


def test_a_happy_job_with_no_event_row_lists_its_publish_claim_and_end() -> None:
    listed = with_job_row([], job("succeeded", 1, published=0.5, started=1.0, finished=2.0))
    assert summary(listed) == [
        ("published", 1, t(0.5)),
        ("claimed", 1, t(1.0)),
        ("finished", 1, t(2.0)),
    ]
    assert all(e["id"] == NO_ROW_ID for e in listed)
    assert listed[0]["detail"] == {"relay": "relay-1", "message_id": str(MESSAGE)}
    assert listed[2]["detail"] == {"status": "succeeded"}


def test_a_failed_job_lists_its_error_cut_as_the_event_cut_it() -> None:
    error = "x" * 2000
    listed = with_job_row(
        [], job("failed", 1, published=0.5, started=1.0, finished=2.0, last_error=error)
    )
    assert listed[-1]["kind"] == "finished"
    assert listed[-1]["detail"] == {"status": "failed", "error": "x" * DETAIL_TEXT_CHARS}


def test_a_cancelled_job_lists_cancelled() -> None:
    listed = with_job_row([], job("cancelled", 0, finished=1.0))
    assert summary(listed) == [("cancelled", 0, t(1.0))]
    assert listed[0]["detail"] == {"status": "cancelled"}


def test_a_pending_or_running_job_lists_no_end() -> None:
    assert summary(with_job_row([], job("running", 1, published=0.5, started=1.0))) == [
        ("published", 1, t(0.5)),
        ("claimed", 1, t(1.0)),
    ]
    assert with_job_row([], job("pending", 0)) == []


def test_a_retried_job_lists_each_publish_the_retry_and_its_end() -> None:
    claim = {"at": t(1.0).isoformat(), "worker": "w1", "lease_until": "L1"}
    events = [
        event(3, 2.0, "retry_scheduled", 1, until="u", error="boom", claim=claim),
        event(4, 3.0, "published", 2, relay="relay-1", message_id="m2", confirmed_at="c"),
    ]
    row = job("succeeded", 2, published=0.5, started=1.0, finished=5.0)
    row["claimed_at"] = t(4.0)
    listed = with_job_row(events, row)
    assert summary(listed) == [
        ("published", 1, t(0.5)),
        ("claimed", 1, t(1.0)),
        ("retry_scheduled", 1, t(2.0)),
        ("published", 2, t(3.0)),
        ("claimed", 2, t(4.0)),
        ("finished", 2, t(5.0)),
    ]


def test_rows_of_the_previous_revision_are_not_listed_twice() -> None:
    # A job of before the upgrade: its rows say everything, the job row holds no publish.
    events = [
        event(1, 0.5, "published", 1, relay="old", message_id="m1", confirmed_at="c"),
        event(2, 1.0, "claimed", 1, worker="w0", lease_until="L0"),
        event(3, 2.0001, "finished", 1, status="succeeded"),
    ]
    old = job("succeeded", 1, started=1.0, finished=2.0)
    old["claim_lease_until"] = None
    assert summary(with_job_row(events, old)) == [
        ("published", 1, t(0.5)),
        ("claimed", 1, t(1.0)),
        ("finished", 1, t(2.0001)),
    ]
    # A new worker's claim kept the publish of a new relay that wrote its row anyway.
    events = [event(1, 0.5, "published", 1, relay="relay-1", message_id="m1")]
    listed = with_job_row(events, job("running", 1, published=0.5, started=1.0))
    assert summary(listed) == [("published", 1, t(0.5)), ("claimed", 1, t(1.0))]


RETRIED_IN_PLACE = ["published", "claimed", "finished", "revived", "finished"]


def test_a_step_retried_in_place_lists_the_end_it_left_and_its_new_one() -> None:
    finish = {"at": t(2.0).isoformat(), "status": "failed", "attempt": 1, "error": "boom"}
    events = [event(5, 3.0, "revived", 1, workflow="wf", retried=True, finish=finish)]
    listed = with_job_row(events, job("succeeded", 2, published=0.5, started=1.0, finished=4.0))
    assert [e["kind"] for e in listed] == RETRIED_IN_PLACE
    assert listed[2]["detail"] == {"status": "failed", "error": "boom"}
    assert listed[3]["detail"] == {"workflow": "wf", "retried": True}
    assert listed[4]["detail"] == {"status": "succeeded"}
    # Its earlier end written as a row by a worker of the previous revision: listed once.
    events.insert(0, event(4, 2.0001, "finished", 1, status="failed", error="boom"))
    listed = with_job_row(events, job("succeeded", 2, published=0.5, started=1.0, finished=4.0))
    assert [e["kind"] for e in listed] == RETRIED_IN_PLACE


def test_a_publish_kept_without_a_message_id_names_the_jobs_own() -> None:
    """An enqueue's first message has the job's id, which the claim leaves out of
    published_message_id (migration 0045's revision): the event names the job's id."""
    job_id = uuid.uuid4()
    row = {**job("succeeded", 1, published=0.5, started=1.0), "published_message_id": None}
    [published] = [e for e in with_job_row([], {**row, "id": job_id}) if e["kind"] == "published"]
    assert published["detail"] == {"relay": "relay-1", "message_id": str(job_id)}
    [kept] = [
        e
        for e in with_job_row([], {**row, "id": job_id, "published_message_id": MESSAGE})
        if e["kind"] == "published"
    ]
    assert kept["detail"]["message_id"] == str(MESSAGE)


def test_with_events_off_nothing_is_said_from_the_job_row() -> None:
    events = [event(1, 0.5, "published", 2, relay="r")]
    assert summary(with_job_row(events, {})) == [("published", 2, t(0.5))]


def test_rows_read_as_json_list_the_same_events() -> None:
    row = job("succeeded", 1, published=0.5, started=1.0, finished=2.0)
    as_json = {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}
    as_json["published_message_id"] = str(MESSAGE)
    assert summary(with_job_row([], as_json)) == summary(with_job_row([], row))


def test_the_published_header_round_trips_and_odd_ones_are_ignored() -> None:
    value = published_header(t(0.5), "host:12")
    assert read_published({PUBLISHED_HEADER: value}) == (t(0.5), "host:12")
    assert read_published({PUBLISHED_HEADER: value.encode()}) == (t(0.5), "host:12")
    odd_ones = (
        None,
        3,
        "",
        "not-a-time host",
        t(0.5).isoformat(),
        "2026-12-06T20:00:00 h",
        f"{t(0.5).isoformat()} a\x00b",
        f"{t(0.5).isoformat()} {'r' * 201}",
    )
    for odd in odd_ones:
        assert read_published({PUBLISHED_HEADER: odd}) == (None, None)
    assert read_published({}) == (None, None)
    assert read_published(None) == (None, None)


def test_a_publish_written_by_both_the_claim_and_the_relay_is_listed_once() -> None:
    # A paused queue's claim parked the message and wrote its publish; the relay's late
    # delete wrote one too, with the confirm time, which is the one listed.
    events = [
        event(1, 0.5, "published", 1, relay="relay-1", message_id="m1"),
        event(2, 0.5, "published", 1, relay="relay-1", message_id="m1", confirmed_at="c"),
        event(3, 2.0, "published", 1, relay="relay-1", message_id="m2", confirmed_at="c"),
    ]
    listed = with_job_row(events, job("pending", 0))
    assert [e["id"] for e in listed] == [2, 3]


def test_a_relay_row_for_the_message_the_job_row_keeps_is_listed_instead() -> None:
    # The relay's row for the very message the claim kept, dated otherwise (a clock read
    # apart): one entry, the row's.
    events = [event(4, 0.6, "published", 1, relay="relay-1", message_id=str(MESSAGE))]
    listed = with_job_row(events, job("running", 1, published=0.5, started=1.0))
    assert [(e["kind"], e["id"]) for e in listed] == [("published", 4), ("claimed", 0)]
    # A row naming no message matches none.
    events = [event(4, 0.6, "published", 1, relay="relay-1")]
    listed = with_job_row(events, job("running", 1, published=0.5, started=1.0))
    assert [(e["kind"], e["id"]) for e in listed] == [
        ("published", 0),
        ("published", 4),
        ("claimed", 0),
    ]
