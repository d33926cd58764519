"""Where a job is now, in words (jobcore.usecases.whereabouts.whereabouts): one sentence per
state."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from jobcore.usecases.whereabouts import WHEREABOUTS_KEYS, whereabouts, with_where

NOW = datetime(2026, 12, 1, 10, 40, 0, tzinfo=UTC)


def job(**columns: Any) -> dict[str, Any]:
    """A job row as the job reads return it, pending with no message and no event."""
    row: dict[str, Any] = {
        "status": "pending",
        "attempts": 0,
        "max_attempts": 3,
        "last_error": None,
        "worker_id": None,
        "lease_expires_at": None,
        "cancel_requested_at": None,
        "finished_at": None,
        "updated_at": NOW - timedelta(seconds=30),
        "queue": "exports",
        "message_note": None,
        **{key: None for key in WHEREABOUTS_KEYS},
        "read_at": NOW,
    }
    row.update(columns)
    return row


def in_outbox(**columns: Any) -> dict[str, Any]:
    return {
        "message_outbox_id": 41,
        "message_created_at": NOW - timedelta(seconds=12),
        "message_available_at": NOW - timedelta(seconds=12),
        "message_attempts": 0,
        "message_last_error": None,
        "message_failing_since": None,
        "message_quarantined_at": None,
        **columns,
    }


def test_a_message_waiting_for_the_relay_is_relay_lag() -> None:
    assert whereabouts(job(**in_outbox())) == "in the outbox for 12 s: relay lag"


def test_a_retry_waiting_out_its_backoff_says_until_when_and_why() -> None:
    row = job(
        attempts=2,
        last_error="RuntimeError: the export service answered 503",
        **in_outbox(message_available_at=datetime(2026, 12, 1, 10, 42, 7, tzinfo=UTC)),
    )
    assert whereabouts(row) == (
        "in backoff until 10:42:07 UTC after attempt 2 failed: "
        "RuntimeError: the export service answered 503"
    )


def test_a_scheduled_job_is_due_at_its_run_at() -> None:
    row = job(**in_outbox(message_available_at=datetime(2026, 12, 3, 8, 0, tzinfo=UTC)))
    assert whereabouts(row) == "due at 2026-12-03 08:00:00 UTC (its run_at)"


def test_a_message_the_broker_keeps_refusing_says_so_and_when_it_is_tried_again() -> None:
    row = job(
        **in_outbox(
            message_created_at=NOW - timedelta(minutes=3, seconds=5),
            message_available_at=NOW + timedelta(seconds=4),
            message_attempts=6,
            message_failing_since=NOW - timedelta(minutes=3),
            message_last_error="returned: NO_ROUTE",
        )
    )
    assert whereabouts(row) == (
        "in the outbox for 3 min 5 s: the broker refused it 6 times (returned: NO_ROUTE); "
        "the relay tries again at 10:40:04 UTC"
    )


def test_a_quarantined_message_names_the_commands_that_act_on_it() -> None:
    row = job(
        **in_outbox(
            message_quarantined_at=NOW - timedelta(minutes=1),
            message_last_error="too_large: body over max_message_size",
        )
    )
    assert whereabouts(row) == (
        "quarantined in the outbox since 10:39:00 UTC (too_large: body over "
        "max_message_size): `jobcore outbox requeue 41` publishes it again, "
        "`jobcore outbox discard 41` drops it"
    )


def test_a_published_message_waits_for_a_worker() -> None:
    row = job(last_event_kind="published", last_event_at=NOW - timedelta(seconds=75))
    assert whereabouts(row) == (
        "published at 10:38:45 UTC (attempt 1), waiting 1 min 15 s for a worker to take it "
        "from queue exports: a backlog, or no worker consuming that queue"
    )


def test_a_publish_no_row_says_yet_is_dated_by_the_jobs_last_change() -> None:
    # Published once and not yet claimed: the relay wrote no event (the claim keeps the
    # publish on the job row), so the time is a bound, not the publish's own.
    row = job(last_event_kind=None)
    assert whereabouts(row) == (
        "published at or after 10:39:30 UTC (attempt 1), waiting up to 30 s for a worker "
        "to take it from queue exports: a backlog, or no worker consuming that queue"
    )


def test_a_message_the_broker_dead_lettered_points_at_dlq_replay() -> None:
    row = job(
        attempts=1,
        last_event_kind="dead_lettered",
        last_event_at=NOW - timedelta(seconds=5),
        last_event_attempt=2,
        last_event_detail={"by": "broker", "reason": "delivery_limit", "queue": "jobs.q"},
    )
    assert whereabouts(row) == (
        "dead-lettered by the broker at 10:39:55 UTC (delivery_limit): `jobcore dlq replay` "
        "runs it now, or the sweeper publishes it again once it has been stale"
    )


def test_a_dead_letter_note_without_its_event_still_counts() -> None:
    # A job noted before its events were recorded: the note on the job row says it.
    note = {"event": "dead_lettered", "attempt": 1, "reason": "rejected", "at": "10:30"}
    row = job(message_note=note)
    assert whereabouts(row).startswith("dead-lettered by the broker at 10:30 (rejected): ")


def test_a_dead_letter_of_an_older_attempt_says_nothing_about_this_one() -> None:
    row = job(
        attempts=2,
        last_event_kind="dead_lettered",
        last_event_at=NOW,
        last_event_attempt=1,
        last_event_detail={"by": "broker", "reason": "delivery_limit"},
    )
    assert whereabouts(row).startswith("published at ")


def test_a_message_a_worker_could_not_run_gives_the_workers_reason() -> None:
    reason = "attempt 1's message was dead-lettered by a worker that does not know the job type"
    row = job(
        last_event_kind="dead_lettered",
        last_event_at=NOW - timedelta(seconds=2),
        last_event_attempt=1,
        last_event_detail={"by": "worker", "reason": reason},
    )
    assert whereabouts(row) == f"in the dead-letter queue since 10:39:58 UTC: {reason}"


def running(**columns: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "status": "running",
        "attempts": 2,
        "worker_id": "w-3",
        "lease_expires_at": NOW + timedelta(seconds=20),
        **columns,
    }
    return job(**values)


def test_a_running_job_names_its_worker_and_lease() -> None:
    assert whereabouts(running()) == (
        "running on worker w-3 (attempt 2 of 3), lease until 10:40:20 UTC"
    )


def test_a_running_job_whose_lease_expired_waits_for_the_reaper() -> None:
    row = running(lease_expires_at=NOW - timedelta(seconds=8))
    assert whereabouts(row) == (
        "running on worker w-3 (attempt 2 of 3), but its lease expired 8 s ago: the reaper "
        "puts it back to pending (or ends it) on its next round"
    )


def test_a_running_job_asked_to_cancel_says_it_waits_for_the_worker() -> None:
    row = running(cancel_requested_at=NOW - timedelta(seconds=1))
    assert whereabouts(row).endswith(
        "; cancellation requested at 10:39:59 UTC, waiting for the worker to stop it"
    )


def test_finished_jobs_say_how_they_ended() -> None:
    finished = NOW - timedelta(days=1)
    assert whereabouts(job(status="succeeded", attempts=1, finished_at=finished)) == (
        "succeeded at 2026-11-30 10:40:00 UTC on attempt 1"
    )
    failed = job(status="failed", attempts=3, finished_at=NOW, last_error="boom")
    assert whereabouts(failed) == "failed at 10:40:00 UTC after attempt 3 of 3: boom"
    assert whereabouts(job(status="cancelled", finished_at=NOW)) == "cancelled at 10:40:00 UTC"


def test_a_long_error_is_cut_and_a_missing_one_said() -> None:
    failed = job(status="failed", attempts=1, finished_at=NOW, last_error="x" * 1000)
    assert len(whereabouts(failed)) < 400
    assert whereabouts(failed).endswith("x…")
    silent = job(status="failed", attempts=1, finished_at=NOW)
    assert whereabouts(silent).endswith(": no error recorded")


def test_with_where_replaces_the_columns_it_was_said_from() -> None:
    shown = with_where(job(id="j", status="cancelled", finished_at=NOW))
    assert shown["where"] == "cancelled at 10:40:00 UTC"
    assert not set(WHEREABOUTS_KEYS) & set(shown)
    assert shown["id"] == "j"


def test_a_paused_queue_or_type_says_what_holds_the_job_and_how_to_resume() -> None:
    by_queue = job(paused="queue", type="export_csv", **in_outbox())
    assert whereabouts(by_queue) == (
        "waiting: its queue exports is paused (`jobcore queues resume exports` lets it run)"
    )
    by_type = job(paused="type", type="export_csv", **in_outbox())
    assert whereabouts(by_type) == (
        "waiting: its job type export_csv is paused (`jobcore types resume export_csv` lets it run)"
    )
    # Paused only holds back what has not started.
    assert whereabouts(job(paused="queue", **running())).startswith("running on worker")


def test_a_held_job_says_which_gate_holds_it() -> None:
    assert whereabouts(job(held_reason="ordering")).startswith(
        "held: an earlier job of its ordering key has not finished"
    )
    assert whereabouts(job(held_reason="concurrency")).startswith(
        "held: its concurrency limit's slots are all running"
    )
    assert whereabouts(job(held_reason="rate_limit")).startswith(
        "held: waiting for its rate limit's next start"
    )
