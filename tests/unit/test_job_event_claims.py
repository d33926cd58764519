"""with_claims: the `claimed` events a timeline lists from where claims are kept (the job row,
the event that ended an attempt), in order, each once, also while workers of the previous
revision (which write `claimed` rows) run next to the new ones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from jobcore.kernel.jobevents import NO_ROW_ID, with_claims

T0 = datetime(2026, 12, 6, 17, 0, tzinfo=UTC)


def t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def event(id: int, at: float, kind: str, attempt: int | None, **detail: Any) -> dict[str, Any]:
    return {"id": id, "at": t(at), "kind": kind, "attempt": attempt, "detail": detail}


def carried(at: float, worker: str, lease_until: str) -> dict[str, Any]:
    """What a new outcome writes in ``detail.claim``: JSON, as the row holds it."""
    return {"at": t(at).isoformat(), "worker": worker, "lease_until": lease_until}


def job(
    attempts: int,
    *,
    started: float | None = None,
    claimed: float | None = None,
    lease_until: str | None = None,
    worker: str | None = None,
) -> dict[str, Any]:
    return {
        "attempts": attempts,
        "worker_id": worker,
        "started_at": None if started is None else t(started),
        "claimed_at": None if claimed is None else t(claimed),
        "claim_lease_until": lease_until,
    }


def summary(events: list[dict[str, Any]]) -> list[tuple[str, int | None, datetime]]:
    return [(e["kind"], e["attempt"], e["at"]) for e in events]


def test_the_happy_path_lists_the_claim_the_job_row_keeps_between_publish_and_finish() -> None:
    events = [
        event(7, 0.5, "published", 1, relay="r1"),
        event(9, 2.0, "finished", 1, status="succeeded"),
    ]
    listed = with_claims(events, job(1, started=1.0, lease_until="L1", worker="w1"))
    assert summary(listed) == [
        ("published", 1, t(0.5)),
        ("claimed", 1, t(1.0)),
        ("finished", 1, t(2.0)),
    ]
    assert listed[1]["id"] == NO_ROW_ID
    assert listed[1]["detail"] == {"worker": "w1", "lease_until": "L1"}


def test_a_job_never_claimed_lists_no_claim() -> None:
    events = [event(3, 1.0, "cancelled", 0, status="cancelled")]
    assert summary(with_claims(events, job(0))) == [("cancelled", 0, t(1.0))]


def test_a_retry_carries_the_claim_it_ended_and_the_row_keeps_the_next() -> None:
    events = [
        event(1, 0.5, "published", 1),
        event(2, 2.0, "retry_scheduled", 1, until="u", claim=carried(1.0, "w1", "L1")),
        event(3, 2.5, "published", 2),
        event(4, 4.0, "finished", 2, status="succeeded"),
    ]
    listed = with_claims(events, job(2, started=1.0, claimed=3.0, lease_until="L2", worker="w2"))
    assert summary(listed) == [
        ("published", 1, t(0.5)),
        ("claimed", 1, t(1.0)),
        ("retry_scheduled", 1, t(2.0)),
        ("published", 2, t(2.5)),
        ("claimed", 2, t(3.0)),
        ("finished", 2, t(4.0)),
    ]
    # The carrier's detail is what it said before: the claim is its own event.
    assert listed[2]["detail"] == {"until": "u"}
    assert listed[1]["detail"] == {"worker": "w1", "lease_until": "L1"}
    assert listed[4]["detail"] == {"worker": "w2", "lease_until": "L2"}


def test_a_pending_job_lists_its_last_claim_once_though_the_row_still_holds_it() -> None:
    events = [event(2, 2.0, "snoozed", 1, snoozes=1, claim=carried(1.0, "w1", "L1"))]
    listed = with_claims(events, job(0, started=1.0, lease_until="L1", worker="w1"))
    assert summary(listed) == [("claimed", 1, t(1.0)), ("snoozed", 1, t(2.0))]


def test_claimed_rows_of_jobs_claimed_before_the_upgrade_are_not_listed_twice() -> None:
    # The previous revision set started_at at the claim and wrote its row a moment later.
    events = [
        event(1, 1.0001, "claimed", 1, worker="w1", lease_until="L1"),
        event(2, 2.0, "finished", 1, status="succeeded"),
    ]
    listed = with_claims(events, job(1, started=1.0, lease_until="stale", worker="w1"))
    assert summary(listed) == [("claimed", 1, t(1.0001)), ("finished", 1, t(2.0))]
    assert listed[0]["id"] == 1


def test_an_old_workers_claim_after_a_new_one_wins_over_the_rows_older_claim() -> None:
    # New worker claims attempt 1 (row: started 1.0, L1); an old reaper puts it back
    # without carrying the claim; an old worker claims attempt 2 with a row; a new reaper
    # ends that attempt carrying the row's claim, which is attempt 1's, not attempt 2's.
    events = [
        event(1, 2.0, "lease_lost", 1, worker="w1", then="pending"),
        event(2, 3.0, "claimed", 2, worker="w-old", lease_until="L-old"),
        event(
            3, 5.0, "lease_lost", 2, worker="w-old", then="pending", claim=carried(1.0, "w1", "L1")
        ),
    ]
    listed = with_claims(events, job(2, started=1.0, lease_until="L1", worker="w-old"))
    assert summary(listed) == [
        ("lease_lost", 1, t(2.0)),
        ("claimed", 2, t(3.0)),
        ("lease_lost", 2, t(5.0)),
    ]
    assert listed[2]["detail"] == {"worker": "w-old", "then": "pending"}


def test_a_new_claim_after_an_old_workers_claim_of_the_same_attempt_is_listed_too() -> None:
    # Snoozes keep the attempt number: an old worker's claim and snooze of attempt 1,
    # then a new worker's claim of attempt 1 again, kept on the row.
    events = [
        event(1, 1.0001, "claimed", 1, worker="w-old", lease_until="L-old"),
        event(2, 2.0, "snoozed", 1, snoozes=1, worker="w-old"),
        event(3, 4.0, "finished", 1, status="succeeded"),
    ]
    listed = with_claims(events, job(1, started=1.0, claimed=3.0, lease_until="L2", worker="w2"))
    assert summary(listed) == [
        ("claimed", 1, t(1.0001)),
        ("snoozed", 1, t(2.0)),
        ("claimed", 1, t(3.0)),
        ("finished", 1, t(4.0)),
    ]


def test_rows_read_as_json_list_the_same_claims() -> None:
    """The testing kit reads rows as JSON: times as ISO strings."""
    events = [{"id": 5, "at": t(2.0).isoformat(), "kind": "finished", "attempt": 1, "detail": {}}]
    jobrow = {
        "attempts": 1,
        "worker_id": "w1",
        "started_at": t(1.0).isoformat(),
        "claimed_at": None,
        "claim_lease_until": "L1",
    }
    assert [e["kind"] for e in with_claims(events, jobrow)] == ["claimed", "finished"]
