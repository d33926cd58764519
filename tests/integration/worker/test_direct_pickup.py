"""Direct pickup (services/worker/direct.py, ``JOBCORE_DIRECT_PICKUP``): a worker with idle
handlers takes a new job's outbox row itself, in the statement that claims the job
(jobcore.database.sql.jobs.run.JOB_CLAIM_FROM_OUTBOX). Each row is published or taken,
never both, and what needs the relays (a row a relay holds, a job with a gate key, a paused
queue) is left to them."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from typing import Any

import psycopg
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.database.sql.inbox import JOBS_CONSUMER
from jobcore.execution import executor as executor_module
from jobcore.execution.claims import ClaimedJob, OutboxScope, claim_from_outbox
from jobcore.kernel.errors import DatabaseUnavailable
from jobcore.kernel.jobevents import JobEventKind
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from jobcore.usecases.timeline import job_timeline
from services.worker.app import Worker
from services.worker.direct import WINDOW, DirectPickup
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import GatePayload
from tests.integration.worker.support import (
    OutboxPump,
    effects,
    job_row,
    outbox_rows,
    relayed,
    status_is,
    submit,
)


@pytest.fixture
def wsettings(wsettings: Settings) -> Settings:
    """Direct pickup off unless a test turns it on (dsettings): a worker of its own takes no
    row, so only what the test drives does."""
    return relayed(wsettings)


pytestmark = pytest.mark.timeout(120)

SLOTS = 4


@pytest.fixture
def dsettings(wsettings: Settings) -> Settings:
    return wsettings.model_copy(update={"direct_pickup": True})


async def inbox_has(db: Database, message_id: uuid.UUID) -> bool:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM inbox WHERE consumer = %s AND message_id = %s",
            (JOBS_CONSUMER, message_id),
        )
        row = await cur.fetchone()
    assert row is not None
    return bool(row["n"])


def by_hand(worker: Worker) -> DirectPickup:
    """A direct pickup on a started worker that has none of its own (its setting off), so
    that only the test makes it look at the outbox: nothing else takes a row here, as no
    relay runs either."""
    assert worker.consumer.direct is None
    return DirectPickup(
        worker.executor,
        worker.registry,
        worker.queues,
        slots=asyncio.Semaphore(SLOTS),
        limit=SLOTS,
        intake=worker.consumer.intake,
        metrics=worker.metrics,
        track=worker.consumer.track,
    )


async def test_an_idle_worker_takes_a_new_job_from_the_outbox_with_no_relay(
    db: Database, topology: Topology, dsettings: Settings, start_worker: StartWorker
) -> None:
    worker = await start_worker(dsettings)

    async def listening() -> bool:
        return worker.cancels.listening

    await eventually(listening, what="the worker's listener")
    job_id = await submit(db, topology, "wt_gate", GatePayload(effect="charged"))

    row = await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")
    assert (row["attempts"], row["worker_id"]) == (1, worker.worker_id)
    # No relay published it: no publish is kept, and its row left the outbox with the claim.
    assert row["published_at"] is None
    assert await outbox_rows(db, job_id) == []
    assert await inbox_has(db, job_id)  # its message's id is the job's
    assert [(e["kind"], e["attempt"]) for e in await effects(db, job_id)] == [("charged", 1)]
    assert worker.metrics.counts["taken_from_outbox"] == 1
    # Its timeline has no publish: accepted, claimed by this worker, finished.
    found = await job_timeline(db, job_id, tenant="t")
    assert found is not None
    assert [e.kind for e in found.events] == [
        JobEventKind.ACCEPTED,
        JobEventKind.CLAIMED,
        JobEventKind.FINISHED,
    ]
    assert found.events[1].detail["worker"] == worker.worker_id


async def test_job_types_with_int_and_float_leases_are_taken_alike(
    db: Database, topology: Topology, start_worker: StartWorker
) -> None:
    """A type declared with `lease=2` beside one with `lease=2.5`: the statement's leases
    go as one float array (a list of ints and floats mixed cannot be sent)."""
    worker = await start_worker()
    gate = worker.registry.get("wt_gate")
    assert isinstance(gate.lease, int)
    scope = OutboxScope(("testq",), (gate, dataclasses.replace(gate, name="wt_other", lease=2.5)))
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    [answer] = await worker.executor.claim_from_outbox(scope, SLOTS, window=WINDOW)
    assert isinstance(answer, ClaimedJob)
    assert answer.job_id == job_id
    await worker.executor.execute(answer)
    await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")


async def test_a_row_a_relay_holds_is_left_to_it(
    db: Database, topology: Topology, settings: Settings, start_worker: StartWorker
) -> None:
    worker = await start_worker()
    direct = by_hand(worker)
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    [row] = await outbox_rows(db, job_id)
    async with await psycopg.AsyncConnection.connect(settings.database_url) as relay:
        # As a relay's claim holds the rows it publishes until their delete commits.
        await relay.execute("SELECT 1 FROM outbox WHERE id = %s FOR UPDATE", (row["id"],))
        assert await direct.take() == 0
        assert (await job_row(db, job_id))["status"] == "pending"
        assert not await inbox_has(db, job_id)
        await relay.rollback()
    assert await outbox_rows(db, job_id) == [row]
    # Released (the relay's transaction ended without publishing): taken now, and
    # counted towards the outbox's next VACUUM (the relays count only their own deletes).
    assert await direct.take() == 1
    assert direct.vacuum.deleted_since == 1
    await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")
    assert await outbox_rows(db, job_id) == []
    assert direct.slots._value == SLOTS  # every slot given back


async def test_what_needs_the_relays_is_left_in_the_outbox(
    db: Database, topology: Topology, start_worker: StartWorker
) -> None:
    """A job with a concurrency key (its claim locks the key's gate row first), and a job
    of a paused queue (its message would only be parked again): neither is taken, and
    their rows stay as they were."""
    worker = await start_worker()
    direct = by_hand(worker)
    keyed = await submit(db, topology, "wt_gate", GatePayload())
    async with db.connection() as conn:
        # Keys are read from the job row, as every claim reads them.
        await conn.execute(
            "UPDATE jobs SET concurrency_key = 'k', concurrency_limit = 1 WHERE id = %s",
            (keyed,),
        )
    keyed_rows = await outbox_rows(db, keyed)
    assert await direct.take() == 0
    assert await outbox_rows(db, keyed) == keyed_rows
    assert not await inbox_has(db, keyed)

    async with db.connection() as conn:
        await conn.execute("DELETE FROM outbox WHERE job_id = %s", (keyed,))
        await conn.execute(
            "INSERT INTO flow_pauses (kind, name, paused_by) VALUES ('queue', 'testq', 't')"
        )
    paused = await submit(db, topology, "wt_gate", GatePayload())
    paused_rows = await outbox_rows(db, paused)
    assert await direct.take() == 0
    assert await outbox_rows(db, paused) == paused_rows
    assert (await job_row(db, paused))["status"] == "pending"


async def test_an_old_row_is_left_to_the_relays(
    db: Database, topology: Topology, start_worker: StartWorker
) -> None:
    """Only rows due within the last WINDOW seconds: a backlog is the relays' to publish
    fairly, and the look at the outbox stays a short index range."""
    worker = await start_worker()
    direct = by_hand(worker)
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE outbox SET available_at = now() - make_interval(secs => %s) WHERE job_id = %s",
            (WINDOW * 5, job_id),
        )
    assert await direct.take() == 0
    assert (await job_row(db, job_id))["status"] == "pending"


async def test_a_claim_whose_commit_went_unanswered_is_resumed(
    db: Database, topology: Topology, start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection broke after the statement committed: the jobs running under the lease
    tokens drawn for it are its own, and are resumed (their leases renewed), so nothing
    waits for the reaper and no attempt burns."""
    worker = await start_worker()
    job_id = await submit(db, topology, "wt_gate", GatePayload(effect="once"))

    async def committed_unanswered(*args: Any, **kwargs: Any) -> Any:
        await claim_from_outbox(*args, **kwargs)
        raise DatabaseUnavailable("server closed the connection unexpectedly")

    monkeypatch.setattr(executor_module, "claim_from_outbox", committed_unanswered)
    scope = OutboxScope.of(worker.registry, worker.queues)
    [answer] = await worker.executor.claim_from_outbox(scope, SLOTS, window=WINDOW)

    assert isinstance(answer, ClaimedJob)
    assert (answer.job_id, answer.resumed, answer.attempt) == (job_id, True, 1)
    assert await outbox_rows(db, job_id) == []
    row = await job_row(db, job_id)
    assert (row["status"], row["lease_token"]) == ("running", answer.lease_token)
    await worker.executor.execute(answer)
    await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")
    assert [(e["kind"], e["attempt"]) for e in await effects(db, job_id)] == [("once", 1)]


async def test_a_claim_that_did_not_commit_resumes_nothing_and_leaves_the_rows(
    db: Database, topology: Topology, start_worker: StartWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection broke before the statement ran: no job runs under its tokens, so
    none is resumed, and the rows are still in the outbox for the relays."""
    worker = await start_worker()
    job_id = await submit(db, topology, "wt_gate", GatePayload())

    async def never_ran(*args: Any, **kwargs: Any) -> Any:
        raise DatabaseUnavailable("connection refused")

    monkeypatch.setattr(executor_module, "claim_from_outbox", never_ran)
    scope = OutboxScope.of(worker.registry, worker.queues)
    assert await worker.executor.claim_from_outbox(scope, SLOTS, window=WINDOW) == []
    assert len(await outbox_rows(db, job_id)) == 1
    assert (await job_row(db, job_id))["status"] == "pending"


async def test_a_body_the_statement_cannot_read_fails_it_and_loses_nothing(
    db: Database, topology: Topology, start_worker: StartWorker
) -> None:
    """Bodies are jobcore's own JSON; one that is not fails the whole statement, so it is
    left to the relays (and the consumer that dead-letters it), with every other row."""
    worker = await start_worker()
    direct = by_hand(worker)
    good = await submit(db, topology, "wt_gate", GatePayload())
    bad = await submit(db, topology, "wt_gate", GatePayload())
    async with db.connection() as conn:
        await conn.execute("UPDATE outbox SET body = 'not json' WHERE job_id = %s", (bad,))
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        await direct.take()
    assert len(await outbox_rows(db, good)) == len(await outbox_rows(db, bad)) == 1
    assert (await job_row(db, good))["status"] == "pending"
    assert direct.slots._value == SLOTS


async def test_each_job_runs_once_while_a_relay_and_direct_pickup_race(
    db: Database,
    topology: Topology,
    dsettings: Settings,
    pump: OutboxPump,
    start_worker: StartWorker,
) -> None:
    """A stand-in relay publishing every due row at once, and a worker taking rows from
    the outbox too, whatever gets there first: every job runs once, one effect each."""
    worker = await start_worker(dsettings)
    job_ids: list[uuid.UUID] = []
    for i in range(60):
        job_ids.append(await submit(db, topology, "wt_gate", GatePayload(effect=f"e{i}")))
        if i % 6 == 5:
            # Waves: some find the worker idle, some busy with the last ones.
            await eventually(
                lambda: status_is(db, job_ids[-1], "succeeded"), what="the wave to finish"
            )
    for job_id in job_ids:
        row = await eventually(lambda j=job_id: status_is(db, j, "succeeded"), what="success")
        assert row["attempts"] == 1
        assert len(await effects(db, job_id)) == 1
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM outbox")
        left = await cur.fetchone()
    assert left == {"n": 0}
    # Each job's one message (its id the job's) was received once, whichever way it came.
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT count(*) AS n FROM inbox WHERE message_id = ANY(%s)", (job_ids,)
        )
        received = await cur.fetchone()
    assert received == {"n": len(job_ids)}
    assert worker.metrics.counts["processed.succeeded"] == len(job_ids)
