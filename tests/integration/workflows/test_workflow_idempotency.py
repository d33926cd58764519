"""A workflow's idempotency key: a replay answers the first workflow and writes nothing, a
different request under the key is refused, two requests racing with one key make one
workflow (the unique index decides, not a read before the insert), and operators'
cancels and every retry of a step are audited."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import psycopg
import pytest

from jobcore.database.gateway import Database
from jobcore.execution.payloads import validate_payload
from jobcore.kernel.errors import IdempotencyConflict, InvalidIdempotencyKey, JobNotRetryable
from jobcore.testing import InlineWorker
from jobcore.usecases.workflows import (
    cancel_workflow,
    retry_step,
    steps_from_documents,
    workflow_fingerprint,
)
from tests.integration.workflows.jobtypes import REGISTRY, RUNS
from tests.integration.workflows.test_workflow_runs import step

DIAMOND = [step("a"), step("b", "a"), step("c", "a"), step("d", "b", "c")]


@pytest.fixture
def worker(jobcore_db: Database) -> InlineWorker:
    RUNS.clear()
    return InlineWorker(jobcore_db, registry=REGISTRY)


async def counts(worker: InlineWorker) -> dict[str, int]:
    async with worker.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT (SELECT count(*) FROM jobcore.workflows) AS workflows,"
            " (SELECT count(*) FROM jobcore.jobs) AS jobs,"
            " (SELECT count(*) FROM jobcore.outbox) AS messages,"
            " (SELECT count(*) FROM jobcore.workflow_edges) AS edges"
        )
        row = await cursor.fetchone()
    assert row is not None
    return {name: int(value) for name, value in row.items()}


async def test_a_replay_answers_the_first_workflow_and_writes_nothing(
    worker: InlineWorker,
) -> None:
    first = await worker.workflow(DIAMOND, name="diamond", idempotency_key="wf-1")
    before = await counts(worker)
    assert before == {"workflows": 1, "jobs": 4, "messages": 1, "edges": 4}
    again = await worker.workflow(DIAMOND, name="diamond", idempotency_key="wf-1")
    assert (first.replayed, again.replayed) == (False, True)
    assert again.id == first.id
    assert again.created_at == first.created_at
    assert again.jobs == first.jobs
    assert await counts(worker) == before
    # The same key under another tenant is another tenant's: a workflow of its own.
    other = await worker.workflow(DIAMOND, name="diamond", tenant="other", idempotency_key="wf-1")
    assert not other.replayed
    assert other.id != first.id
    # The replayed workflow runs once, as created.
    await worker.drain()
    assert sorted(label for label, _, _ in RUNS) == sorted("abcd" * 2)


@pytest.mark.parametrize(
    "changed",
    [
        pytest.param({"name": "another"}, id="name"),
        pytest.param({"jobs": [*DIAMOND[:3], step("d", "b")]}, id="edges"),
        pytest.param({"jobs": [step("a", fail=True), *DIAMOND[1:]]}, id="payload"),
        pytest.param({"jobs": [DIAMOND[1], DIAMOND[0], *DIAMOND[2:]]}, id="order"),
    ],
)
async def test_a_different_request_under_the_key_is_refused_and_writes_nothing(
    worker: InlineWorker, changed: dict[str, Any]
) -> None:
    first = await worker.workflow(DIAMOND, name="diamond", idempotency_key="wf-2")
    before = await counts(worker)
    request: dict[str, Any] = {"jobs": DIAMOND, "name": "diamond", **changed}
    with pytest.raises(IdempotencyConflict, match=str(first.id)):
        await worker.workflow(request["jobs"], name=request["name"], idempotency_key="wf-2")
    assert await counts(worker) == before


async def test_a_malformed_key_is_refused_before_anything_is_written(
    worker: InlineWorker,
) -> None:
    for bad in ("", "x" * 256, "caf\u00e9", "tab\there"):
        with pytest.raises(InvalidIdempotencyKey):
            await worker.workflow(DIAMOND, idempotency_key=bad)
    assert (await counts(worker))["workflows"] == 0


async def test_two_requests_racing_with_one_key_make_one_workflow(worker: InlineWorker) -> None:
    answers = await asyncio.gather(
        *(worker.workflow(DIAMOND, name="race", idempotency_key="wf-race") for _ in range(4))
    )
    assert len({answer.id for answer in answers}) == 1
    assert sorted(answer.replayed for answer in answers) == [False, True, True, True]
    assert await counts(worker) == {"workflows": 1, "jobs": 4, "messages": 1, "edges": 4}


async def until_a_backend_waits_for_a_lock(worker: InlineWorker, fragment: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        async with worker.db.connection() as conn:
            cursor = await conn.execute(
                "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event = 'transactionid' AND position(%s in query) > 0",
                [fragment],
            )
            row = await cursor.fetchone()
        if row is not None and row["n"] > 0:
            return
        await asyncio.sleep(0.01)  # the poll's interval, bounded by the deadline
    async with worker.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT state, wait_event_type, wait_event, left(query, 200) AS query"
            " FROM pg_stat_activity WHERE datname = current_database()"
        )
        seen = await cursor.fetchall()
    raise AssertionError(f"the create never waited for the holder of its key: {seen}")


async def test_a_key_committed_after_the_statement_began_is_a_replay_not_a_second_workflow(
    worker: InlineWorker,
) -> None:
    """The race a read before the insert would lose: another transaction holds the key,
    uncommitted, when the statement reads; the unique index makes the insert wait for it,
    then write nothing, and the answer is the holder's workflow."""

    def resolve(type_name: str, payload: Any, _: int) -> tuple[Any, Any]:
        kind = REGISTRY.get(type_name)
        return kind, validate_payload(kind, payload)

    fingerprint = workflow_fingerprint(steps_from_documents(DIAMOND, resolve, "test"), "held")
    holder = uuid.uuid4()
    async with await psycopg.AsyncConnection.connect(worker.settings.database_url) as other:
        # Not through the usage row's lock (which every create takes, and which would
        # make the create read after this commit): only the unique index stands between.
        await other.execute(
            "INSERT INTO jobcore.workflows (id, tenant, name, jobs_total, unsettled, open_jobs,"
            " exchange, idempotency_key, request_fingerprint)"
            " VALUES (%s, 'test', 'held', 0, 0, 0, 'x', 'wf-held', %s)",
            [holder, fingerprint],
        )
        create = asyncio.ensure_future(
            worker.workflow(DIAMOND, name="held", idempotency_key="wf-held")
        )
        # Waiting for the holder's transaction (the unique index's check), in the create's
        # statement (pg_stat_activity keeps only its start: the first CTE).
        await until_a_backend_waits_for_a_lock(worker, "WITH input AS")
        assert not create.done()
        await other.commit()
        created = await create
    assert created.replayed
    assert created.id == holder
    counted = await counts(worker)
    assert (counted["workflows"], counted["jobs"], counted["messages"]) == (1, 0, 0)


async def audit_entries(worker: InlineWorker) -> list[dict[str, Any]]:
    async with worker.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT actor, action, target_type, target_id, tenant, outcome, details"
            " FROM jobcore.audit_log ORDER BY id"
        )
        return [dict(row) for row in await cursor.fetchall()]


async def test_a_retry_and_an_operators_cancel_are_audited_with_their_actor(
    worker: InlineWorker,
) -> None:
    created = await worker.workflow([step("a", fail=True), step("b", "a")], tenant="acme")
    await worker.drain()
    target = str(created.id)
    # A step that has not failed is refused, and the refusal recorded.
    with pytest.raises(JobNotRetryable):
        await retry_step(worker.db, worker.topology, created.id, "b", tenant=None, actor="ops:bob")
    retried = await retry_step(
        worker.db, worker.topology, created.id, "a", tenant="acme", actor="key:k1"
    )
    # A tenant's own cancel (no actor) is not an admin action, as for a single job.
    own = await worker.workflow([step("x")], tenant="acme")
    assert (await cancel_workflow(worker.db, own.id, tenant="acme")).cancelled == 1
    assert len(await audit_entries(worker)) == 2
    cancelled = await cancel_workflow(worker.db, created.id, tenant=None, actor="ops:alice")
    assert (cancelled.id, cancelled.cancelled) == (created.id, 2)
    entries = await audit_entries(worker)
    assert [
        (e["actor"], e["action"], e["target_type"], e["target_id"], e["tenant"], e["outcome"])
        for e in entries
    ] == [
        ("ops:bob", "workflow.retry", "workflow", target, "acme", "refused"),
        ("key:k1", "workflow.retry", "workflow", target, "acme", "succeeded"),
        ("ops:alice", "workflow.cancel", "workflow", target, "acme", "succeeded"),
    ]
    assert entries[0]["details"] == {"name": "b", "refused": "JobNotRetryable"}
    assert entries[1]["details"] == {"name": "a", "job_id": str(retried.job_id)}
    assert entries[2]["details"] == {"status": "running"}
