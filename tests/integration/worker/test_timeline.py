"""A job's timeline: real jobs driven through each path (a real relay in this process, real
workers, PostgreSQL and RabbitMQ) leave their events in order, and the job says in words
where it is now."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, execute, fetch_one
from jobcore.database.sql import Query
from jobcore.database.sql.inbox import JOBS_CONSUMER
from jobcore.database.sql.jobs.run import (
    JOB_CLAIM_MANY,
    JOB_RETRY,
    JOB_SUCCEED_MANY,
    JobClaimManyParams,
)
from jobcore.database.store import outbox_store
from jobcore.execution import outcomes
from jobcore.execution.completion_webhooks import completion_params
from jobcore.execution.registry import load_job_modules
from jobcore.kernel.jobevents import JobEventKind
from jobcore.kernel.retry import backoff_delay
from jobcore.kernel.settings import Settings
from jobcore.testing.draining import InlineWorker
from jobcore.testing.waiting import eventually
from jobcore.usecases.jobs import cancel_job
from jobcore.usecases.timeline import job_timeline
from jobcore.usecases.whereabouts import JobTimeline
from services.relay.relay import Relay
from tests.integration.relay.helpers import running_relay
from tests.integration.webhooks.support import Answer, delivery_in, receiving, webhook_settings
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import GatePayload
from tests.integration.worker.support import outbox_rows, outcome_params, relayed, status_is, submit


@pytest.fixture
def wsettings(wsettings: Settings) -> Settings:
    """Deliveries only: these timelines are a relay's publish and a delivery's claim (a job
    a worker took from the outbox: test_direct_pickup)."""
    return relayed(wsettings)


ACCEPTED = JobEventKind.ACCEPTED
PUBLISHED = JobEventKind.PUBLISHED
CLAIMED = JobEventKind.CLAIMED
FINISHED = JobEventKind.FINISHED


@pytest.fixture
async def relay(wsettings: Settings, db: Database, broker_cleanup: None) -> AsyncIterator[Relay]:
    async with running_relay(wsettings, db) as running:
        yield running


async def timeline(db: Database, job_id: uuid.UUID) -> JobTimeline:
    found = await job_timeline(db, job_id, tenant="t")
    assert found is not None
    return found


def kinds(found: JobTimeline) -> list[str]:
    return [event.kind for event in found.events]


async def ended(db: Database, job_id: uuid.UUID) -> JobTimeline:
    """The timeline once the job ended and the relay committed every confirm it got (a
    worker can finish a job before the relay records its message's confirm)."""
    await eventually(
        lambda: status_is(db, job_id, "succeeded", "failed", "cancelled"), what="the job's end"
    )

    async def settled() -> bool:
        async with db.connection() as conn:
            cur = await conn.execute(UNSETTLED_MESSAGES, (job_id,))
            row = await cur.fetchone()
        return row is not None and row["n"] == 0

    await eventually(settled, what="the relay to record its confirms")
    return await timeline(db, job_id)


# The job's own messages still in the outbox, not quarantined (webhook messages aside).
UNSETTLED_MESSAGES = """
    SELECT count(*) AS n FROM outbox JOIN jobs ON jobs.id = outbox.job_id
    WHERE outbox.job_id = %s AND outbox.message_type = jobs.type
      AND outbox.quarantined_at IS NULL
"""


async def test_a_job_that_succeeds_is_accepted_published_claimed_and_finished(
    db: Database, topology: Topology, relay: Relay, start_worker: StartWorker
) -> None:
    worker = await start_worker()
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    found = await ended(db, job_id)

    assert kinds(found) == [ACCEPTED, PUBLISHED, CLAIMED, FINISHED]
    accepted, published, claimed, finished = found.events
    assert accepted.attempt is None
    assert published.attempt == 1
    assert published.detail["relay"] == relay.relay_id
    assert claimed.attempt == 1
    assert claimed.detail["worker"] == worker.worker_id
    assert "lease_until" in claimed.detail
    assert (finished.attempt, finished.detail) == (1, {"status": "succeeded"})
    assert [e.at for e in found.events] == sorted(e.at for e in found.events)
    assert found.where.startswith("succeeded at ")
    assert found.where.endswith("on attempt 1")


async def event_rows(db: Database, job_id: uuid.UUID) -> list[str]:
    """The kinds of the job's job_events rows, in the order written."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT kind FROM job_events WHERE job_id = %s ORDER BY id", (job_id,)
        )
        return [row["kind"] for row in await cur.fetchall()]


async def test_a_happy_job_writes_no_event_row_yet_its_timeline_lists_each_step(
    db: Database, topology: Topology, relay: Relay, start_worker: StartWorker
) -> None:
    """Published once, succeeded on its first claim: no job_events row at all (migration
    0041); the timeline says every step from the job row, with the times it holds."""
    worker = await start_worker()
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    found = await ended(db, job_id)

    assert await event_rows(db, job_id) == []
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT created_at, published_at, published_by, published_message_id, started_at,"
            " finished_at FROM jobs WHERE id = %s",
            (job_id,),
        )
        row = await cur.fetchone()
    assert row is not None
    assert kinds(found) == [ACCEPTED, PUBLISHED, CLAIMED, FINISHED]
    accepted, published, claimed, finished = found.events
    assert [e.id for e in found.events] == [0, 0, 0, 0]
    assert accepted.at == row["created_at"]
    # Dated the relay's claim of the outbox row, as its event row was.
    assert row["created_at"] <= published.at == row["published_at"] <= claimed.at
    assert published.attempt == 1
    # The enqueue's message had the job's id, which the row does not keep twice.
    assert published.detail == {"relay": relay.relay_id, "message_id": str(job_id)}
    assert row["published_message_id"] is None
    assert row["published_by"] == relay.relay_id
    assert (claimed.at, claimed.detail["worker"]) == (row["started_at"], worker.worker_id)
    assert (finished.at, finished.attempt) == (row["finished_at"], 1)
    assert finished.detail == {"status": "succeeded"}


async def test_a_retry_records_why_and_until_when_then_the_next_attempt(
    db: Database, topology: Topology, relay: Relay, start_worker: StartWorker
) -> None:
    await start_worker()
    job_id = await submit(db, topology, "wt_gate", GatePayload(fail_times=1))
    found = await ended(db, job_id)

    assert kinds(found) == [
        ACCEPTED,
        PUBLISHED,
        CLAIMED,
        JobEventKind.RETRY_SCHEDULED,
        PUBLISHED,
        CLAIMED,
        FINISHED,
    ]
    retry = found.events[3]
    assert retry.attempt == 1
    # The claim it carried is the `claimed` event before it, not part of its detail.
    assert set(retry.detail) == {"until", "error"}
    assert found.events[2].id == 0
    assert found.events[2].detail["worker"] == found.events[5].detail["worker"]
    assert "planned failure on attempt 1" in retry.detail["error"]
    # Full jitter draws the delay from [0, ceiling]: the retry is due at its event or later.
    assert datetime.fromisoformat(retry.detail["until"]) >= retry.at
    assert [e.attempt for e in found.events[4:]] == [2, 2, 2]
    assert found.events[-1].detail == {"status": "succeeded"}
    # Rows only for the retry and the publish the job row does not keep (its second).
    assert await event_rows(db, job_id) == [JobEventKind.RETRY_SCHEDULED, PUBLISHED]
    assert [e.id > 0 for e in found.events if e.kind == PUBLISHED] == [False, True]
    assert "confirmed_at" in found.events[4].detail


async def test_a_retry_drawn_without_delay_is_due_at_its_event_not_before(
    db: Database,
    topology: Topology,
    relay: Relay,
    start_worker: StartWorker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def lowest_draw(attempt: int, *, base: float, cap: float, rng: Callable[[], float]) -> float:
        return backoff_delay(attempt, base=base, cap=cap, rng=lambda: 0.0)

    # The retry policy's jitter at its lowest draw: the worker runs in this process.
    monkeypatch.setattr(outcomes, "backoff_delay", lowest_draw)
    await start_worker()
    job_id = await submit(db, topology, "wt_gate", GatePayload(fail_times=1))
    found = await ended(db, job_id)

    [retry] = [e for e in found.events if e.kind == JobEventKind.RETRY_SCHEDULED]
    assert datetime.fromisoformat(retry.detail["until"]) == retry.at
    assert found.events[-1].detail == {"status": "succeeded"}


async def test_a_permanent_failure_finishes_failed_with_its_error(
    db: Database, topology: Topology, relay: Relay, start_worker: StartWorker
) -> None:
    await start_worker()
    job_id = await submit(db, topology, "wt_gate", GatePayload(permanent=True))
    found = await ended(db, job_id)

    assert kinds(found) == [ACCEPTED, PUBLISHED, CLAIMED, FINISHED]
    assert found.events[-1].detail["status"] == "failed"
    assert "this job can never work" in found.events[-1].detail["error"]
    assert found.where.startswith("failed at ")
    assert "after attempt 1 of 3: " in found.where
    assert "this job can never work" in found.where


async def test_a_scheduled_job_is_due_at_its_run_at_until_cancelled(
    db: Database, topology: Topology, wsettings: Settings
) -> None:
    run_at = datetime.now(UTC) + timedelta(hours=1)
    job_id = await submit(db, topology, "wt_gate", GatePayload(), run_at=run_at)
    found = await timeline(db, job_id)
    assert kinds(found) == [ACCEPTED]
    assert datetime.fromisoformat(found.events[0].detail["run_at"]) == run_at
    assert found.where.startswith("due at ")
    assert found.where.endswith("(its run_at)")

    async with db.unit_of_work() as uow:
        await cancel_job(uow, "t", job_id, completion=completion_params(topology, wsettings))
        await uow.commit()
    found = await timeline(db, job_id)
    assert kinds(found) == [ACCEPTED, JobEventKind.CANCELLED]
    assert found.events[-1].detail == {"status": "cancelled"}
    assert found.where.startswith("cancelled at ")


async def test_a_running_job_asked_to_cancel_records_the_request_then_its_end(
    db: Database,
    topology: Topology,
    relay: Relay,
    start_worker: StartWorker,
    wsettings: Settings,
    tmp_path: Any,
) -> None:
    await start_worker()
    job_id = await submit(db, topology, "wt_gate", GatePayload(gate=str(tmp_path / "never")))
    await eventually(lambda: status_is(db, job_id, "running"), what="the job to run")
    found = await timeline(db, job_id)
    assert found.where.startswith("running on worker ")
    assert "(attempt 1 of 3), lease until " in found.where

    async with db.unit_of_work() as uow:
        await cancel_job(uow, "t", job_id, completion=completion_params(topology, wsettings))
        await uow.commit()
    found = await ended(db, job_id)
    assert kinds(found) == [
        ACCEPTED,
        PUBLISHED,
        CLAIMED,
        JobEventKind.CANCEL_REQUESTED,
        JobEventKind.CANCELLED,
    ]


async def test_a_lost_lease_is_recorded_by_the_reaper_before_the_next_attempt(
    db: Database, topology: Topology, wsettings: Settings, start_worker: StartWorker
) -> None:
    # A worker claimed the job, then died: its message is gone and its lease runs out.
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    [message] = await outbox_rows(db, job_id)
    async with db.unit_of_work() as uow:
        claim = {
            "consumer": JOBS_CONSUMER,
            "worker_id": "died-after-claim",
            "exchange": topology.jobs_exchange,
            "message_ids": [message["message_id"]],
            "job_ids": [job_id],
            "types": ["wt_gate"],
            "attempts": [1],
            "lease_tokens": [uuid.uuid4()],
            "leases": [0.5],
            "published_ats": [None],
            "published_bys": [None],
        }
        assert await fetch_one(uow, JOB_CLAIM_MANY(claim)) is not None
        await execute(uow, DELETE_OUTBOX_ROW({"id": message["id"]}))
        await uow.commit()

    async with running_relay(wsettings, db):
        await start_worker()
        found = await ended(db, job_id)

    assert kinds(found) == [
        ACCEPTED,
        CLAIMED,
        JobEventKind.LEASE_LOST,
        PUBLISHED,
        CLAIMED,
        FINISHED,
    ]
    lost = found.events[2]
    assert (lost.attempt, lost.detail) == (1, {"worker": "died-after-claim", "then": "pending"})
    assert [e.attempt for e in found.events[3:]] == [2, 2, 2]


def new_claim(
    job_id: uuid.UUID, message: dict[str, Any], topology: Topology, attempt: int = 1
) -> JobClaimManyParams:
    return {
        "consumer": JOBS_CONSUMER,
        "worker_id": "w-new",
        "exchange": topology.jobs_exchange,
        "message_ids": [message["message_id"]],
        "job_ids": [job_id],
        "types": ["wt_gate"],
        "attempts": [attempt],
        "lease_tokens": [uuid.uuid4()],
        "leases": [30.0],
        "published_ats": [None],
        "published_bys": [None],
    }


async def test_a_claim_writes_no_event_row_and_the_timeline_says_it_from_the_job_row(
    db: Database, topology: Topology
) -> None:
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    [message] = await outbox_rows(db, job_id)
    async with db.unit_of_work() as uow:
        claimed = await fetch_one(uow, JOB_CLAIM_MANY(new_claim(job_id, message, topology)))
        await uow.commit()
    assert claimed is not None
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM job_events WHERE job_id = %s", (job_id,)
        )
        assert await cur.fetchone() == {"n": 0}
        cur = await conn.execute("SELECT started_at FROM jobs WHERE id = %s", (job_id,))
        row = await cur.fetchone()
    assert row is not None

    found = await timeline(db, job_id)
    assert kinds(found) == [ACCEPTED, CLAIMED]
    claim = found.events[1]
    assert (claim.id, claim.at, claim.attempt) == (0, row["started_at"], 1)
    assert claim.detail["worker"] == "w-new"
    # The lease the claim took, as the claim returned it.
    assert datetime.fromisoformat(claim.detail["lease_until"]) == claimed["lease_expires_at"]


# What the claim of a worker of the previous revision did: the job row without the claim
# columns, and a `claimed` row (at: the moment it was written).
OLD_CLAIM = Query[dict[str, Any]](
    "test_old_claim",
    "Claim a pending job as a worker of the previous revision did.",
    """
    WITH claimed AS (
        UPDATE jobs SET status = 'running', attempts = attempts + 1, lease_token = %(token)s,
                        lease_expires_at = now() + interval '30 seconds', worker_id = 'w-old',
                        started_at = coalesce(started_at, statement_timestamp()),
                        updated_at = now()
        WHERE id = %(id)s AND status = 'pending'
        RETURNING id, attempts, lease_expires_at
    )
    INSERT INTO job_events (job_id, kind, attempt, detail)
    SELECT id, 'claimed', attempts,
           jsonb_build_object('worker', 'w-old', 'lease_until', lease_expires_at)
    FROM claimed
    """,
)


@pytest.mark.parametrize("first", ["old", "new"])
async def test_during_a_rolling_upgrade_each_claim_is_listed_once(
    db: Database, topology: Topology, wsettings: Settings, first: str
) -> None:
    """Attempt 1 claimed by one revision's worker and retried, attempt 2 claimed by the
    other's and succeeded: two claims, each once, in order (an old claim after a new one
    leaves the job row holding the new one's, which must not be listed again)."""
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    workers = ["w-old", "w-new"] if first == "old" else ["w-new", "w-old"]
    for attempt, worker in enumerate(workers, start=1):
        if worker == "w-old":
            token = uuid.uuid4()
            async with db.unit_of_work() as uow:
                await execute(uow, OLD_CLAIM({"id": job_id, "token": token}))
                await uow.commit()
        else:
            # The attempt's message as delivered (the claim reads only its envelope).
            claim = new_claim(job_id, {"message_id": uuid.uuid4()}, topology, attempt)
            token = claim["lease_tokens"][0]
            async with db.unit_of_work() as uow:
                assert await fetch_one(uow, JOB_CLAIM_MANY(claim)) is not None
                await uow.commit()
        ending = JOB_RETRY if attempt == 1 else JOB_SUCCEED_MANY
        async with db.unit_of_work() as uow:
            await execute(uow, ending(outcome_params(ending, job_id, token, topology, wsettings)))
            await uow.commit()

    found = await timeline(db, job_id)
    assert kinds(found) == [ACCEPTED, CLAIMED, JobEventKind.RETRY_SCHEDULED, CLAIMED, FINISHED]
    claims = [found.events[1], found.events[3]]
    assert [(c.attempt, c.detail["worker"]) for c in claims] == [(1, workers[0]), (2, workers[1])]
    # The old worker's claim is its row; the new one's is said (id 0).
    assert [c.id > 0 for c in claims] == [w == "w-old" for w in workers]
    # The retry's detail is as it was, whether it carried a claim or not.
    assert set(found.events[2].detail) == {"until", "error"}


# What a relay and a worker of the previous revision write: a `published` row (the relay's,
# with no header for the claim to keep) and a `finished` row (the worker's success).
OLD_PUBLISHED = Query[dict[str, Any]](
    "test_old_published",
    "Write a `published` row as a relay of the previous revision did.",
    """INSERT INTO job_events (job_id, at, kind, attempt, detail)
       VALUES (%(id)s, now(), 'published', 1, jsonb_build_object(
           'relay', 'r-old', 'message_id', %(message_id)s::uuid,
           'confirmed_at', clock_timestamp()))""",
)
OLD_FINISHED = Query[dict[str, Any]](
    "test_old_finished",
    "Write a `finished` row as a worker of the previous revision did.",
    """INSERT INTO job_events (job_id, kind, attempt, detail)
       SELECT id, 'finished', attempts, jsonb_build_object('status', status)
       FROM jobs WHERE id = %(id)s""",
)


async def test_rows_of_a_previous_revisions_relay_and_worker_are_listed_once(
    db: Database, topology: Topology, wsettings: Settings
) -> None:
    """During a rolling upgrade: an old relay's `published` row (its message carries no
    header), a new worker's claim, an old worker's `finished` row: each step once, the
    rows preferred to what the job row says."""
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    [message] = await outbox_rows(db, job_id)
    async with db.unit_of_work() as uow:
        await execute(uow, OLD_PUBLISHED({"id": job_id, "message_id": message["message_id"]}))
        await execute(uow, DELETE_OUTBOX_ROW({"id": message["id"]}))
        await uow.commit()
    claim = new_claim(job_id, message, topology)
    async with db.unit_of_work() as uow:
        assert await fetch_one(uow, JOB_CLAIM_MANY(claim)) is not None
        await uow.commit()
    token = claim["lease_tokens"][0]
    params = outcome_params(JOB_SUCCEED_MANY, job_id, token, topology, wsettings)
    async with db.unit_of_work() as uow:
        await execute(uow, JOB_SUCCEED_MANY(params))
        await execute(uow, OLD_FINISHED({"id": job_id}))
        await uow.commit()

    found = await timeline(db, job_id)
    assert kinds(found) == [ACCEPTED, PUBLISHED, CLAIMED, FINISHED]
    published, finished = found.events[1], found.events[3]
    assert (published.id > 0, published.detail["relay"]) == (True, "r-old")
    assert "confirmed_at" in published.detail
    assert (finished.id > 0, finished.detail) == (True, {"status": "succeeded"})


async def test_a_publish_the_claim_kept_is_not_written_again_by_a_late_confirm(
    db: Database, topology: Topology
) -> None:
    """The worker's claim can commit before the relay records the confirm: the relay
    then finds its own publish on the job row and writes no row; a publish the job row
    does not hold (another relay's, or a later one) is a row."""
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    [message] = await outbox_rows(db, job_id)
    async with db.unit_of_work() as uow:
        [taken] = await outbox_store.claim_due(uow, {"limit": 100, "window": 1e9})
        assert taken["id"] == message["id"]
        claim = new_claim(job_id, message, topology)
        claim["published_ats"] = [taken["taken_at"]]
        claim["published_bys"] = ["r-1"]
        # The claim commits on its own connection while the relay's transaction is open.
        async with db.unit_of_work() as worker:
            assert await fetch_one(worker, JOB_CLAIM_MANY(claim)) is not None
            await worker.commit()
        await outbox_store.delete_published(uow, {"ids": [message["id"]], "relay": "r-1"})
        await uow.commit()
    assert await event_rows(db, job_id) == []
    found = await timeline(db, job_id)
    assert kinds(found) == [ACCEPTED, PUBLISHED, CLAIMED]
    assert (found.events[1].at, found.events[1].detail["relay"]) == (taken["taken_at"], "r-1")

    # A second message of the same attempt (a republish): the job row keeps the first.
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO outbox (message_id, exchange, routing_key, message_type, body, job_id,"
            " tenant) VALUES (gen_random_uuid(), %s, %s, %s, %s, %s, %s)",
            [message[k] for k in ("exchange", "routing_key", "message_type", "body")]
            + [job_id, message["tenant"]],
        )
    async with db.unit_of_work() as uow:
        [again] = await outbox_store.claim_due(uow, {"limit": 100, "window": 1e9})
        await outbox_store.delete_published(uow, {"ids": [again["id"]], "relay": "r-2"})
        await uow.commit()
    assert await event_rows(db, job_id) == [PUBLISHED]
    found = await timeline(db, job_id)
    assert kinds(found) == [ACCEPTED, PUBLISHED, CLAIMED, PUBLISHED]
    assert [e.detail["relay"] for e in found.events if e.kind == PUBLISHED] == ["r-1", "r-2"]


DELETE_OUTBOX_ROW = Query[dict[str, Any]](
    "test_delete_outbox_row", "Delete one outbox row.", "DELETE FROM outbox WHERE id = %(id)s"
)

# Headers AMQP cannot encode (an integer over 64 bits): the relay quarantines the row.
MAKE_UNPUBLISHABLE = Query[dict[str, Any]](
    "test_make_unpublishable",
    "Give a job's outbox row headers AMQP cannot carry.",
    """UPDATE outbox SET headers = '{"n": 1180591620717411303424}'::jsonb
       WHERE job_id = %(job_id)s""",
)


async def test_a_quarantined_message_is_recorded_and_named_then_the_job_fails(
    db: Database,
    topology: Topology,
    wsettings: Settings,
    broker_cleanup: None,
    start_worker: StartWorker,
) -> None:
    # Spoilt before any relay runs: a running one could publish it first.
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    async with db.unit_of_work() as uow:
        await execute(uow, MAKE_UNPUBLISHABLE({"job_id": job_id}))
        await uow.commit()

    async def quarantined() -> JobTimeline | None:
        found = await timeline(db, job_id)
        return found if JobEventKind.QUARANTINED in kinds(found) else None

    async with running_relay(wsettings, db):
        found = await eventually(quarantined, what="the row to be quarantined")
        [row] = await outbox_rows(db, job_id)
        event = found.events[-1]
        assert (event.attempt, event.detail["outbox_id"]) == (1, row["id"])
        assert event.detail["error"].startswith("malformed")
        assert found.where.startswith("quarantined in the outbox since ")
        assert f"`jobcore outbox requeue {row['id']}` publishes it again" in found.where

        await start_worker()  # its rescuer fails the job
        found = await ended(db, job_id)
    assert kinds(found) == [ACCEPTED, JobEventKind.QUARANTINED, FINISHED]
    assert found.events[-1].detail["status"] == "failed"
    assert found.events[-1].detail["error"].startswith("outbox row quarantined: malformed")


async def test_a_message_no_worker_knows_is_dead_lettered_and_said_so(
    db: Database,
    topology: Topology,
    wsettings: Settings,
    broker_cleanup: None,
    start_worker: StartWorker,
) -> None:
    # The job's type as its message names it is one no worker here knows (a rolling deploy):
    # the worker sends it to the dead-letter queue and notes it on the job. Renamed before
    # any relay runs: a running one could publish it first.
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    async with db.unit_of_work() as uow:
        await execute(uow, RENAME_TYPE({"job_id": job_id}))
        await uow.commit()
    await start_worker()

    async def dead_lettered() -> JobTimeline | None:
        # The worker can note it (and its publish: no claim keeps it) before the relay
        # commits the confirm it got, which deletes the outbox row.
        async with db.connection() as conn:
            cur = await conn.execute(UNSETTLED_MESSAGES, (job_id,))
            row = await cur.fetchone()
        if row is None or row["n"] != 0:
            return None
        found = await timeline(db, job_id)
        return found if {PUBLISHED, JobEventKind.DEAD_LETTERED} <= set(kinds(found)) else None

    async with running_relay(wsettings, db):
        found = await eventually(dead_lettered, what="the dead letter to be noted")
    assert kinds(found) == [ACCEPTED, PUBLISHED, JobEventKind.DEAD_LETTERED]
    event = found.events[-1]
    assert (event.attempt, event.detail["by"]) == (1, "worker")
    assert found.where.startswith("in the dead-letter queue since ")
    assert "dead-lettered by a worker that does not know the job type" in found.where
    assert "`jobcore dlq replay` runs it" in found.where


RENAME_TYPE = Query[dict[str, Any]](
    "test_rename_type",
    "Make a job and its message of a type no worker knows.",
    """
    WITH job AS (UPDATE jobs SET type = 'wt_unknown' WHERE id = %(job_id)s RETURNING id)
    UPDATE outbox SET message_type = 'wt_unknown',
        body = convert_to(replace(convert_from(body, 'UTF8'), '"wt_gate"', '"wt_unknown"'),
                          'UTF8')
    WHERE job_id = (SELECT id FROM job)
    """,
)


@pytest.fixture
def hooked(wsettings: Settings) -> Settings:
    return webhook_settings(wsettings, job_modules=wsettings.job_modules)


async def test_each_webhook_attempt_is_recorded_after_the_job_finished(
    db: Database, topology: Topology, hooked: Settings, start_worker: StartWorker
) -> None:
    async with receiving(Answer(500)) as receiver, running_relay(hooked, db):
        await start_worker(hooked)
        job_id = await submit(db, topology, "wt_gate", GatePayload(), callback_url=receiver.url())
        await eventually(delivery_in(db, job_id, "delivered"), what="the webhook's delivery")
    found = await timeline(db, job_id)

    assert kinds(found) == [
        ACCEPTED,
        PUBLISHED,
        CLAIMED,
        FINISHED,
        JobEventKind.WEBHOOK_ATTEMPT,
        JobEventKind.WEBHOOK_ATTEMPT,
    ]
    first, second = found.events[-2:]
    assert first.detail["attempt"] == 1
    assert (first.detail["outcome"], first.detail["status"]) == ("retry", "pending")
    assert first.detail["status_code"] == 500
    assert "next_attempt_at" in first.detail
    assert second.detail["attempt"] == 2
    assert (second.detail["outcome"], second.detail["status"]) == ("delivered", "delivered")
    assert second.detail["status_code"] == 200
    assert first.detail["delivery_id"] == second.detail["delivery_id"]
    # No URL (it may hold a token) and no body in an event.
    assert receiver.url() not in str([e.detail for e in found.events])


async def test_with_events_off_none_is_written_and_the_timeline_says_so(
    settings: Settings, db: Database
) -> None:
    """JOBCORE_JOB_EVENTS=false: the hot path's statements write no event (the timeline
    keeps only `accepted`, which is the job row), and the timeline says events are off;
    the same statements on a pool with events on write them all."""
    registry = load_job_modules(("jobcore.examples.jobtypes",))
    off = Database(settings.model_copy(update={"job_events": False}), name="events-off")
    await off.open(wait=True)
    try:
        quiet = InlineWorker(off, registry=registry)
        quiet_id = await quiet.enqueue("noop", {})
        assert (await quiet.drain()).succeeded == 1
        quiet_timeline = await job_timeline(off, quiet_id, tenant=None)
    finally:
        await off.close()
    loud = InlineWorker(db, registry=registry)
    loud_id = await loud.enqueue("noop", {})
    assert (await loud.drain()).succeeded == 1

    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT job_id, count(*) AS n FROM job_events WHERE job_id = ANY(%s) GROUP BY 1",
            ([quiet_id, loud_id],),
        )
        written = {row["job_id"]: row["n"] for row in await cur.fetchall()}
    # None either way: a happy job's claim, publish and end are kept on the job row
    # (migrations 0040, 0041), its publish only while events are on.
    assert written == {}
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT id, published_at IS NOT NULL AS kept FROM jobs WHERE id = ANY(%s)",
            ([quiet_id, loud_id],),
        )
        kept = {row["id"]: row["kept"] for row in await cur.fetchall()}
    assert kept == {quiet_id: False, loud_id: True}
    assert quiet_timeline is not None
    assert (kinds(quiet_timeline), quiet_timeline.events_recorded) == ([ACCEPTED], False)
    assert quiet_timeline.where.startswith("succeeded at ")
    loud_timeline = await job_timeline(db, loud_id, tenant=None)
    assert loud_timeline is not None
    assert (kinds(loud_timeline), loud_timeline.events_recorded) == (
        [ACCEPTED, PUBLISHED, CLAIMED, FINISHED],
        True,
    )
