"""Invariant 6: every write after the claim is fenced by the lease token.

A worker that lost its lease (the reaper handed the job to another worker, whose claim
issued a new token) must write nothing: no status, no effect, no outbox message. Each
outcome statement is run here with a stale token against a running job, then with the
current token to show the same call would have written.
"""

from __future__ import annotations

import uuid

import orjson
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, fetch_all, fetch_one
from jobcore.database.sql import Query
from jobcore.database.sql.jobs.run import JOB_END_RUNNING, JOB_RELEASE, JOB_RETRY, JOB_SUCCEED_MANY
from jobcore.kernel.settings import Settings
from tests.integration.worker.support import outcome_params, running_echo_job

EFFECTS = Query(
    "test_effects",
    "A job's effects.",
    "SELECT kind, detail FROM job_effects WHERE job_id = %(id)s",
)

SNAPSHOT = Query(
    "test_snapshot",
    "A job's status and lease, with its outbox messages and effects counted.",
    """
    SELECT status, lease_token, attempts, last_error,
           (SELECT count(*) FROM outbox WHERE job_id = %(id)s) AS messages,
           (SELECT count(*) FROM job_effects WHERE job_id = %(id)s) AS effects
    FROM jobs WHERE id = %(id)s
    """,
)


@pytest.mark.parametrize(
    ("statement", "ends"),
    [
        (JOB_SUCCEED_MANY, "succeeded"),
        (JOB_RETRY, "pending"),
        (JOB_END_RUNNING, "failed"),
        (JOB_END_RUNNING, "cancelled"),
        (JOB_RELEASE, "pending"),
    ],
    ids=["succeed", "retry", "fail", "cancel_running", "release"],
)
async def test_a_stale_lease_token_writes_nothing(
    statement: Query, ends: str, db: Database, topology: Topology, settings: Settings
) -> None:
    current, stale = uuid.uuid4(), uuid.uuid4()
    job_id = await running_echo_job(db, topology, current)

    async with db.unit_of_work() as uow:
        before = await fetch_one(uow, SNAPSHOT({"id": job_id}))
        lost = await fetch_all(
            uow,
            statement(outcome_params(statement, job_id, stale, topology, settings, ends=ends)),
        )
        after = await fetch_one(uow, SNAPSHOT({"id": job_id}))
        await uow.commit()
    assert lost == []
    assert after == before  # same status, lease, attempts, messages and effects

    async with db.unit_of_work() as uow:
        won = await fetch_all(
            uow,
            statement(outcome_params(statement, job_id, current, topology, settings, ends=ends)),
        )
        changed = await fetch_one(uow, SNAPSHOT({"id": job_id}))
        await uow.commit()
    assert len(won) == 1
    assert changed is not None
    assert changed["status"] == ends


async def test_a_batch_with_two_attempts_of_a_job_writes_only_the_winners_effects(
    db: Database, topology: Topology, settings: Settings
) -> None:
    """A lost attempt's success, retried through a database outage, can share a batch with
    the success of the attempt the reaper started: one effect, the winner's."""
    current, stale = uuid.uuid4(), uuid.uuid4()
    job_id = await running_echo_job(db, topology, current)

    lost = outcome_params(JOB_SUCCEED_MANY, job_id, stale, topology, settings)
    won = outcome_params(JOB_SUCCEED_MANY, job_id, current, topology, settings)
    batch = {
        **won,
        "ids": lost["ids"] + won["ids"],
        "lease_tokens": lost["lease_tokens"] + won["lease_tokens"],
        "results": lost["results"] + won["results"],
        "result_refs": lost["result_refs"] + won["result_refs"],
        "effects": orjson.dumps(
            orjson.loads(lost["effects"]) + orjson.loads(won["effects"])
        ).decode(),
    }
    async with db.unit_of_work() as uow:
        rows = await fetch_all(uow, JOB_SUCCEED_MANY(batch))
        effects = await fetch_all(uow, EFFECTS({"id": job_id}))
        await uow.commit()
    assert [row["id"] for row in rows] == [job_id]
    assert [(e["kind"], e["detail"]) for e in effects] == [("charged", {"cents": 100})]
