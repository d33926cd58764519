"""`jobcore.testing.InlineWorker`: jobs run to their end through the outbox rows, the claim
and the fenced outcome statements, in the test's process, without a broker."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg.types.json import Jsonb

from jobcore.database.gateway import Database
from jobcore.execution.executor import RESULT_PUT_TRIES
from jobcore.execution.payloads import UnstorablePayload
from jobcore.execution.registry import InvalidPayloadError
from jobcore.kernel.errors import JobNotFound
from jobcore.storage.results import StoreUnavailable
from jobcore.testing import InlineWorker
from jobcore.usecases.jobs import cancel_job
from jobcore.usecases.timeline import job_timeline
from tests.integration.testing_kit.jobtypes import REGISTRY


@pytest.fixture
def worker(jobcore_db: Database) -> InlineWorker:
    return InlineWorker(jobcore_db, registry=REGISTRY)


async def rows(db: Database, sql: str, *args: Any) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cursor = await conn.execute(sql, args)
        return [dict(row) for row in await cursor.fetchall()]


async def test_retries_run_until_the_job_succeeds(worker: InlineWorker) -> None:
    job_id = await worker.enqueue("kit_flaky", {"succeed_on_attempt": 3})
    drained = await worker.drain()
    job = await worker.job(job_id)
    assert (drained.retried, drained.succeeded, drained.failed) == (2, 1, 0)
    assert (job["status"], job["attempts"], job["result"]) == ("succeeded", 3, {"attempt": 3})
    assert job["last_error"] == "ConnectionError: upstream unavailable (attempt 2)"
    # Only the successful attempt's effects are committed.
    effects = await rows(
        worker.db, "SELECT detail FROM jobcore.job_effects WHERE job_id = %s", job_id
    )
    assert effects == [{"detail": {"attempt": 3}}]


async def test_the_last_attempt_fails_the_job(worker: InlineWorker) -> None:
    job_id = await worker.enqueue("kit_flaky", {"succeed_on_attempt": 9}, max_attempts=2)
    drained = await worker.drain()
    job = await worker.job(job_id)
    assert (drained.retried, drained.failed) == (1, 1)
    assert (job["status"], job["attempts"]) == ("failed", 2)


async def test_a_permanent_error_fails_at_once(worker: InlineWorker) -> None:
    job_id = await worker.enqueue("kit_refuse", {"text": "no"})
    drained = await worker.drain()
    job = await worker.job(job_id)
    assert (drained.failed, drained.retried) == (1, 0)
    assert (job["status"], job["attempts"]) == ("failed", 1)
    assert job["last_error"] == "PermanentError: refused: no"


async def test_a_large_result_is_stored_as_a_file(worker: InlineWorker) -> None:
    job_id = await worker.enqueue("kit_note", {"text": "big", "size": 50_000})
    assert (await worker.drain()).succeeded == 1
    job = await worker.job(job_id)
    assert job["result"] is None
    assert job["result_ref"] is not None
    assert worker.result_store.path(job["result_ref"]).stat().st_size > 50_000


async def test_a_store_outage_gives_the_job_back_without_spending_an_attempt(
    worker: InlineWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    put = worker.result_store.put
    tries = 0

    def put_unavailable_for_one_attempt(*args: Any, **kwargs: Any) -> str:
        nonlocal tries
        tries += 1
        if tries <= RESULT_PUT_TRIES:
            raise StoreUnavailable("the bucket is away")
        return put(*args, **kwargs)

    monkeypatch.setattr(worker.result_store, "put", put_unavailable_for_one_attempt)
    job_id = await worker.enqueue("kit_note", {"text": "big", "size": 50_000})
    drained = await worker.drain()
    job = await worker.job(job_id)
    assert (drained.given_back, drained.succeeded, drained.retried) == (1, 1, 0)
    # As in the worker: the store is tried a few times within the lease, then the job is
    # given back, and the attempt the outage interrupted is not counted.
    assert (job["status"], job["attempts"], tries) == ("succeeded", 1, RESULT_PUT_TRIES + 1)
    assert job["result_ref"] is not None


async def test_a_message_delivered_twice_runs_once(worker: InlineWorker) -> None:
    job_id = await worker.enqueue("kit_note", {"text": "once"})
    (message,) = await rows(worker.db, "SELECT * FROM jobcore.outbox WHERE job_id = %s", job_id)
    assert (await worker.drain()).succeeded == 1
    # The relay publishes the same row again (say it crashed before deleting it).
    async with worker.db.connection() as conn:
        await conn.execute(
            "INSERT INTO jobcore.outbox (message_id, exchange, routing_key, message_type, headers,"
            " body, job_id, tenant) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [
                message["message_id"],
                message["exchange"],
                message["routing_key"],
                message["message_type"],
                Jsonb(message["headers"]),
                message["body"],
                job_id,
                message["tenant"],
            ],
        )
    drained = await worker.drain()
    assert (drained.duplicates, drained.attempts) == (1, 0)
    effects = await rows(
        worker.db, "SELECT kind FROM jobcore.job_effects WHERE job_id = %s", job_id
    )
    assert effects == [{"kind": "noted"}]


async def test_a_job_cancelled_while_pending_does_not_run(worker: InlineWorker) -> None:
    job_id = await worker.enqueue("kit_note", {"text": "never"}, tenant="acme")
    async with worker.db.unit_of_work() as uow:
        await cancel_job(uow, "acme", job_id, completion=worker.completion)
        await uow.commit()
    drained = await worker.drain()
    assert (drained.skipped, drained.attempts, drained.ran) == (1, 0, [])
    assert (await worker.job(job_id))["status"] == "cancelled"


async def test_a_job_scheduled_later_stays_pending(worker: InlineWorker) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    job_id = await worker.enqueue("kit_note", {"text": "later"}, run_at=later)
    drained = await worker.drain()
    assert drained.attempts == 0
    assert drained.next_due_in is not None
    assert drained.next_due_in > 3000
    assert (await worker.job(job_id))["status"] == "pending"


async def test_payloads_are_checked_as_the_api_checks_them(worker: InlineWorker) -> None:
    with pytest.raises(InvalidPayloadError):
        await worker.enqueue("kit_note", {"text": "x", "extra": 1})
    with pytest.raises(UnstorablePayload):
        await worker.enqueue("kit_note", {"text": "nul \x00"})
    assert await rows(worker.db, "SELECT id FROM jobcore.jobs") == []


async def test_an_unknown_job_id_is_not_found(worker: InlineWorker) -> None:
    with pytest.raises(JobNotFound):
        await worker.job(uuid.uuid4())


async def test_an_ordering_key_holds_a_job_until_the_one_before_it_has_retried_and_ended(
    worker: InlineWorker,
) -> None:
    first = await worker.enqueue("kit_flaky", {"succeed_on_attempt": 2}, ordering_key="k")
    second = await worker.enqueue("kit_flaky", {"succeed_on_attempt": 1}, ordering_key="k")
    drained = await worker.drain()
    assert drained.held >= 1
    assert (drained.succeeded, drained.retried) == (2, 1)
    before, after = await worker.job(first), await worker.job(second)
    assert before["finished_at"] < after["started_at"]
    assert after["attempts"] == 1  # held while the first retried: no attempt used


async def test_a_handler_reports_progress_and_commits_its_writes_with_its_success(
    worker: InlineWorker,
) -> None:
    """As in the worker (the same execution core runs it): ``ctx.progress`` is written
    under the lease, and ``ctx.transaction()``'s writes commit with the success."""
    job_id = await worker.enqueue(
        "kit_credit", {"account": "kit-1", "amount_cents": 250}, tenant="acme"
    )
    drained = await worker.drain()
    assert (drained.succeeded, drained.attempts) == (1, 1)
    job = await worker.job(job_id)
    assert job["status"] == "succeeded"
    assert (job["progress_fraction"], job["progress_message"]) == (0.5, "crediting")
    assert job["result"]["balance_cents"] == 250
    entries = await rows(
        worker.db, "SELECT amount_cents FROM jobcore.ledger_entries WHERE job_id = %s", job_id
    )
    assert entries == [{"amount_cents": 250}]


async def test_a_snooze_runs_the_job_again_within_the_drain_without_spending_an_attempt(
    worker: InlineWorker,
) -> None:
    job_id = await worker.enqueue("kit_snooze", {"seconds": 0.2})
    drained = await worker.drain(scheduled_within=5)
    job = await worker.job(job_id)
    # max_attempts is 1: a spent attempt could not have run again.
    assert (drained.snoozed, drained.succeeded, drained.failed) == (1, 1, 0)
    assert (job["status"], job["attempts"], job["snoozes"]) == ("succeeded", 1, 1)
    assert job["result"] == {"attempt": 1, "run": 2}
    found = await job_timeline(worker.db, job_id, tenant=None)
    assert found is not None
    assert [e.kind for e in found.events if e.kind != "accepted"] == [
        "published",
        "claimed",
        "snoozed",
        "published",
        "claimed",
        "finished",
    ]


async def test_a_snooze_longer_than_the_drain_waits_leaves_the_job_pending(
    worker: InlineWorker,
) -> None:
    job_id = await worker.enqueue("kit_snooze", {"seconds": 600})
    drained = await worker.drain(scheduled_within=1)
    job = await worker.job(job_id)
    assert (drained.snoozed, job["status"], job["attempts"]) == (1, "pending", 0)
    assert drained.next_due_in is not None
    assert drained.next_due_in > 590
    assert job["where"].startswith("snoozed by its handler until")


async def test_a_snoozed_job_keeps_the_later_jobs_of_its_ordering_key_waiting(
    worker: InlineWorker,
) -> None:
    first = await worker.enqueue("kit_snooze", {"seconds": 0.2}, ordering_key="account-1")
    second = await worker.enqueue("kit_snooze", {"seconds": 0.2}, ordering_key="account-1")
    drained = await worker.drain(scheduled_within=5)
    # The first snoozed, and the second did not start until the first had ended.
    assert drained.ran == [first, first, second, second]
    assert drained.held >= 1
    for job_id in (first, second):
        job = await worker.job(job_id)
        assert (job["status"], job["attempts"], job["snoozes"]) == ("succeeded", 1, 1)


async def test_a_snoozed_job_gives_back_its_concurrency_slot(worker: InlineWorker) -> None:
    """One running at a time: while the first job snoozes, the second starts."""
    first = await worker.enqueue("kit_snooze_limited", {"seconds": 0.3})
    second = await worker.enqueue("kit_snooze_limited", {"seconds": 0.3})
    drained = await worker.drain(scheduled_within=5)
    assert drained.ran[:2] == [first, second]
    assert sorted(drained.ran) == sorted([first, first, second, second])
    assert (drained.snoozed, drained.succeeded) == (2, 2)


async def test_a_debounced_key_runs_once_with_every_payload(worker: InlineWorker) -> None:
    ids = {await worker.enqueue("kit_digest", {"text": "k", "size": n}) for n in range(3)}
    other = await worker.enqueue("kit_digest", {"text": "other", "size": 9})
    [job_id] = ids
    # Due a minute from now: the drain leaves it, until its period is made to pass.
    early = await worker.drain()
    assert early.succeeded == 0
    assert early.next_due_in is not None
    assert early.next_due_in > 30

    assert set(await worker.end_debounce_periods()) == {job_id, other}
    drained = await worker.drain()

    assert drained.succeeded == 2
    assert (await worker.job(job_id))["result"] == {"sizes": [0, 1, 2]}
    assert (await worker.job(other))["result"] == {"sizes": [9]}
    # The next enqueue of the key opens the next job.
    later = await worker.enqueue("kit_digest", {"text": "k", "size": 3})
    assert later not in (job_id, other)
