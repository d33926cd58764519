"""Outcome statements that settle many members at once, and batches nobody closes, against
PostgreSQL: the batch_members_settled trigger (migration 0037) locks every batch a
statement settles members of in one order and counts each batch once; the pruner closes an
open batch left idle, its callbacks firing once as for any close."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import psycopg

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, fetch_all
from jobcore.database.sql.jobs.run import JOB_SUCCEED_MANY, JobSucceedManyParams
from jobcore.execution.completion_webhooks import completion_params
from jobcore.maintenance.retention import Retention, prune_exclusively
from jobcore.testing.waiting import eventually
from jobcore.usecases.batches import add_members, close_batch, create_batch, get_batch
from tests.integration.batches.test_batches import (
    CALLBACKS,
    TENANT,
    counts,
    fired,
    member,
    rows,
)


async def _running(db: Database, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, uuid.UUID]:
    """Claim the jobs as a worker would (running, a lease token each): their tokens."""
    tokens = {job_id: uuid.uuid4() for job_id in job_ids}
    async with db.connection() as conn:
        for job_id, token in tokens.items():
            await conn.execute(
                "UPDATE jobcore.jobs SET status = 'running', attempts = 1, lease_token = %s, "
                "lease_expires_at = now() + interval '1 hour', started_at = now() WHERE id = %s",
                (token, job_id),
            )
    return tokens


def _successes(
    db: Database, tokens: dict[uuid.UUID, uuid.UUID], job_ids: list[uuid.UUID]
) -> JobSucceedManyParams:
    """The worker's batched successes of ``job_ids``, in that order."""
    completion = completion_params(Topology.from_settings(db.settings), db.settings)
    return {
        **completion,
        "effects": "[]",
        "ids": job_ids,
        "lease_tokens": [tokens[job_id] for job_id in job_ids],
        "results": [None] * len(job_ids),
        "result_refs": [None] * len(job_ids),
    }


async def _until_all_wait_for_locks(db: Database, pids: list[int]) -> None:
    async def all_waiting() -> bool:
        found = await rows(
            db,
            "SELECT count(*) AS waiting FROM pg_stat_activity "
            "WHERE pid = ANY(%s) AND wait_event_type = 'Lock'",
            pids,
        )
        return bool(found[0]["waiting"] == len(pids))

    await eventually(all_waiting, what="both outcome statements waiting for a batch row")


async def test_two_statements_settling_two_batches_in_opposite_orders_do_not_deadlock(
    jobcore_db: Database, topology: Topology
) -> None:
    """Two workers' batched successes, each ending a member of batch one and one of batch
    two, in opposite orders. Holders of the two batch rows make both statements wait before
    either has counted anything; once they let go, each statement takes its batches as it
    likes. A trigger that locked each batch as its member's row came (0032's) took one
    then two in the first and two then one in the second: a deadlock, one of them
    aborted. Locked in one order, the second waits for the first and both commit."""
    one = await create_batch(
        jobcore_db,
        topology,
        tenant=TENANT,
        members=[member("1a"), member("1b")],
        callbacks=CALLBACKS,
    )
    two = await create_batch(
        jobcore_db,
        topology,
        tenant=TENANT,
        members=[member("2a"), member("2b")],
        callbacks=CALLBACKS,
    )
    tokens = await _running(jobcore_db, [*one.job_ids, *two.job_ids])
    url = jobcore_db.settings.database_url

    async def settle(conn: psycopg.AsyncConnection[Any], job_ids: list[uuid.UUID]) -> None:
        # The rows are updated in the order of the plan; pinned to the input's order (a
        # nested loop over it, looking each job up by key), so that each statement meets
        # its members' batches in the order given, as the worker's statement does on a
        # table of any size.
        for setting in ("enable_hashjoin", "enable_mergejoin", "enable_seqscan"):
            await conn.execute(f"SET LOCAL {setting} = off")
        done = await fetch_all(conn, JOB_SUCCEED_MANY(_successes(jobcore_db, tokens, job_ids)))
        assert len(done) == 2
        await conn.commit()

    async with (
        await psycopg.AsyncConnection.connect(url) as hold_one,
        await psycopg.AsyncConnection.connect(url) as hold_two,
        await psycopg.AsyncConnection.connect(url) as first,
        await psycopg.AsyncConnection.connect(url) as second,
    ):
        lock = "SELECT id FROM jobcore.batches WHERE id = %s FOR UPDATE"
        await hold_one.execute(lock, (one.batch_id,))
        await hold_two.execute(lock, (two.batch_id,))
        first_done = asyncio.create_task(settle(first, [one.job_ids[0], two.job_ids[0]]))
        second_done = asyncio.create_task(settle(second, [two.job_ids[1], one.job_ids[1]]))
        await _until_all_wait_for_locks(
            jobcore_db, [first.info.backend_pid, second.info.backend_pid]
        )
        # Both statements wrote their jobs and wait to count them: nothing fired yet.
        assert counts(await fired(jobcore_db, one.batch_id)) == (0, 0, 0)
        await hold_one.commit()
        await hold_two.commit()
        results = await asyncio.gather(first_done, second_done, return_exceptions=True)
    assert [r for r in results if isinstance(r, BaseException)] == []
    for written in (one, two):
        assert counts(await fired(jobcore_db, written.batch_id)) == (1, 1, 0)
        batch = await get_batch(jobcore_db, tenant=TENANT, batch_id=written.batch_id)
        assert (batch["succeeded"], batch["pending"], batch["status"]) == (2, 0, "succeeded")


async def test_one_statement_settling_many_members_counts_them_once_each(
    jobcore_db: Database, topology: Topology
) -> None:
    """A statement ending 50 members of a batch (three of them failed) and the other
    members of a second: each batch is counted once for the statement, its counts exact,
    its first death one of the statement's failures, and each callback fired once."""
    many = await create_batch(
        jobcore_db,
        topology,
        tenant=TENANT,
        members=[member(str(n)) for n in range(50)],
        callbacks=CALLBACKS,
    )
    other = await create_batch(
        jobcore_db, topology, tenant=TENANT, members=[member("x")], callbacks=CALLBACKS
    )
    failed = many.job_ids[:3]
    async with await psycopg.AsyncConnection.connect(jobcore_db.settings.database_url) as conn:
        await conn.execute(
            "UPDATE jobcore.jobs SET status = CASE WHEN id = ANY(%s) THEN 'failed' "
            "ELSE 'succeeded' END, finished_at = now(), attempts = 1 WHERE id = ANY(%s)",
            (failed, [*many.job_ids, *other.job_ids]),
        )
        # The batches' rows this transaction updated: one version each (a trigger per
        # member wrote 51).
        cursor = await conn.execute(
            "SELECT pg_stat_get_xact_tuples_updated('jobcore.batches'::regclass)"
        )
        assert await cursor.fetchone() == (2,)
        await conn.commit()
    batch = await get_batch(jobcore_db, tenant=TENANT, batch_id=many.batch_id)
    assert (batch["total"], batch["succeeded"], batch["failed"], batch["pending"]) == (
        50,
        47,
        3,
        0,
    )
    assert batch["status"] == "settled"
    assert batch["first_death_job_id"] == min(failed)
    assert counts(await fired(jobcore_db, many.batch_id)) == (0, 1, 1)
    complete = (await fired(jobcore_db, many.batch_id))["complete"][0]["payload"]["batch"]
    assert sorted(complete["failed_job_ids"]) == sorted(str(job_id) for job_id in failed)
    assert counts(await fired(jobcore_db, other.batch_id)) == (1, 1, 0)


async def test_one_statement_settling_members_of_a_whole_tree_fires_each_batch_once(
    jobcore_db: Database, topology: Topology
) -> None:
    """A grandchild, its parent and the top batch, their members ended by one statement:
    the three batches are locked deepest first, each counted once, and each fires its
    callbacks once, the top one after the children it waits for."""
    top = await create_batch(
        jobcore_db, topology, tenant=TENANT, members=[member("t")], callbacks=CALLBACKS, close=False
    )
    middle = await create_batch(
        jobcore_db,
        topology,
        tenant=TENANT,
        members=[member("m1"), member("m2")],
        callbacks=CALLBACKS,
        parent_id=top.batch_id,
        close=False,
    )
    bottom = await create_batch(
        jobcore_db,
        topology,
        tenant=TENANT,
        members=[member("b")],
        callbacks=CALLBACKS,
        parent_id=middle.batch_id,
    )
    for written in (middle, top):
        await close_batch(jobcore_db, tenant=TENANT, batch_id=written.batch_id)
    async with jobcore_db.connection() as conn:
        await conn.execute(
            "UPDATE jobcore.jobs SET status = 'succeeded', finished_at = now(), attempts = 1 "
            "WHERE id = ANY(%s)",
            ([*top.job_ids, *middle.job_ids, *bottom.job_ids],),
        )
    for written, total in ((bottom, 1), (middle, 3), (top, 2)):
        assert counts(await fired(jobcore_db, written.batch_id)) == (1, 1, 0)
        batch = await get_batch(jobcore_db, tenant=TENANT, batch_id=written.batch_id)
        assert (batch["total"], batch["succeeded"], batch["status"]) == (total, total, "succeeded")


async def _age(db: Database, batch_id: uuid.UUID, by: timedelta) -> None:
    """Make a batch look created (and last grown) ``by`` ago."""
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE jobcore.batches SET created_at = created_at - %s, "
            "grown_at = grown_at - %s WHERE id = %s",
            (by, by, batch_id),
        )


async def test_the_pruner_closes_an_idle_open_batch_which_then_fires_and_is_pruned(
    jobcore_db: Database, topology: Topology
) -> None:
    """An open batch that took no job for JOBCORE_BATCH_OPEN_TIMEOUT is closed by the
    pruner as a close would: its callbacks fire once, in that transaction (its members had
    settled), and the settled batch goes JOBCORE_BATCH_RETENTION later. One that took a
    job within the timeout stays open; a second pass closes nothing twice."""
    timeout = jobcore_db.settings.batch_open_timeout
    idle = await create_batch(
        jobcore_db, topology, tenant=TENANT, members=[member("i")], callbacks=CALLBACKS, close=False
    )
    busy = await create_batch(
        jobcore_db, topology, tenant=TENANT, members=[member("b")], callbacks=CALLBACKS, close=False
    )
    await _age(jobcore_db, idle.batch_id, timeout + timedelta(minutes=1))
    await _age(jobcore_db, busy.batch_id, timeout + timedelta(minutes=1))
    # A job added to `busy` now: it is idle from now on, whatever its age.
    more = await add_members(
        jobcore_db, topology, tenant=TENANT, batch_id=busy.batch_id, members=[member("b2")]
    )
    async with jobcore_db.connection() as conn:
        await conn.execute(
            "UPDATE jobcore.jobs SET status = 'succeeded', finished_at = now(), attempts = 1 "
            "WHERE id = ANY(%s)",
            ([*idle.job_ids, *busy.job_ids, *more.job_ids],),
        )
    assert counts(await fired(jobcore_db, idle.batch_id)) == (0, 0, 0)
    settings = jobcore_db.settings
    dry = await Retention(settings, jobcore_db).count()
    assert dry.batches_closed == 1
    assert counts(await fired(jobcore_db, idle.batch_id)) == (0, 0, 0)  # a dry run changes nothing

    done = await Retention(settings, jobcore_db).prune(sweep_files=False)
    assert done.batches_closed == 1
    assert counts(await fired(jobcore_db, idle.batch_id)) == (1, 1, 0)
    closed = await get_batch(jobcore_db, tenant=TENANT, batch_id=idle.batch_id)
    assert (closed["status"], closed["succeeded"]) == ("succeeded", 1)
    still = await get_batch(jobcore_db, tenant=TENANT, batch_id=busy.batch_id)
    assert still["status"] == "open"
    assert counts(await fired(jobcore_db, busy.batch_id)) == (0, 0, 0)

    again = await Retention(settings, jobcore_db).prune(sweep_files=False)
    assert again.batches_closed == 0
    assert counts(await fired(jobcore_db, idle.batch_id)) == (1, 1, 0)

    # Settled now: pruned once its retention has passed, with its job.
    async with jobcore_db.connection() as conn:
        await conn.execute(
            "UPDATE jobcore.batches SET settled_at = settled_at - %s WHERE id = %s",
            (settings.batch_retention + timedelta(minutes=1), idle.batch_id),
        )
    gone = await Retention(settings, jobcore_db).prune(sweep_files=False)
    assert gone.tables["batches"] == 1
    left = await rows(
        jobcore_db,
        "SELECT id FROM jobcore.batches WHERE id = ANY(%s)",
        [idle.batch_id, busy.batch_id],
    )
    assert left == [{"id": busy.batch_id}]
    members = await rows(jobcore_db, "SELECT id FROM jobcore.jobs WHERE id = ANY(%s)", idle.job_ids)
    assert members == []


async def test_an_idle_open_batch_with_running_members_fires_when_its_last_one_ends(
    jobcore_db: Database, topology: Topology
) -> None:
    """Closed by the pruner while a member still runs: nothing fires at the close; the
    member's own outcome fires the callbacks, once."""
    written = await create_batch(
        jobcore_db,
        topology,
        tenant=TENANT,
        members=[member("done"), member("late")],
        callbacks=CALLBACKS,
        close=False,
    )
    await _age(jobcore_db, written.batch_id, jobcore_db.settings.batch_open_timeout * 2)
    done, late = written.job_ids
    async with jobcore_db.connection() as conn:
        await conn.execute(
            "UPDATE jobcore.jobs SET status = 'succeeded', finished_at = now(), attempts = 1 "
            "WHERE id = %s",
            (done,),
        )
    # As `jobcore prune` runs it: under the pruner's lease.
    report = await prune_exclusively(
        Retention(jobcore_db.settings, jobcore_db), owner="tests", ttl=60.0
    )
    assert report.batches_closed == 1
    batch = await get_batch(jobcore_db, tenant=TENANT, batch_id=written.batch_id)
    assert (batch["status"], batch["pending"]) == ("closed", 1)
    assert counts(await fired(jobcore_db, written.batch_id)) == (0, 0, 0)
    async with jobcore_db.connection() as conn:
        await conn.execute(
            "UPDATE jobcore.jobs SET status = 'failed', finished_at = now(), attempts = 1 "
            "WHERE id = %s",
            (late,),
        )
    assert counts(await fired(jobcore_db, written.batch_id)) == (0, 1, 1)
