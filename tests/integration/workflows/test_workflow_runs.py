"""Workflows run through the testing kit's InlineWorker: the outbox rows, the worker's
claim and fenced outcomes, and the database trigger that counts readiness."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from jobcore.database.gateway import Database
from jobcore.kernel.errors import InvalidWorkflow
from jobcore.testing import InlineWorker
from jobcore.usecases.timeline import job_timeline
from jobcore.usecases.workflows import (
    cancel_workflow,
    get_workflow,
    retry_step,
)
from tests.integration.workflows.jobtypes import REGISTRY, RUNS


@pytest.fixture
def worker(jobcore_db: Database) -> InlineWorker:
    RUNS.clear()
    return InlineWorker(jobcore_db, registry=REGISTRY)


def step(
    name: str, *deps: Any, fail: bool = False, final: bool = False, size: int = 0
) -> dict[str, Any]:
    return {
        "name": name,
        "type": "wf_step",
        "payload": {"label": name, "fail": fail, "size": size},
        "depends_on": list(deps),
        "finally": final,
    }


async def summary(worker: InlineWorker, workflow_id: uuid.UUID) -> dict[str, Any]:
    async with worker.db.session() as session:
        return await get_workflow(session, workflow_id, tenant=None)


def statuses(workflow: dict[str, Any]) -> dict[str, str]:
    return {job["name"]: job["status"] for job in workflow["jobs"]}


async def test_a_diamond_runs_in_dependency_order_each_job_once(worker: InlineWorker) -> None:
    created = await worker.workflow(
        [step("a"), step("b", "a"), step("c", "a"), step("d", "b", "c")], name="diamond"
    )
    assert created.published == 1
    await worker.drain()
    order = [label for label, _, _ in RUNS]
    assert sorted(order) == ["a", "b", "c", "d"]
    assert order[0] == "a"
    assert order[-1] == "d"
    # d read both of its dependencies' results by name, inline.
    _, _, deps = RUNS[-1]
    assert deps == {
        "b": ("succeeded", {"label": "b", "padding": ""}),
        "c": ("succeeded", {"label": "c", "padding": ""}),
    }
    workflow = await summary(worker, created.id)
    assert workflow["status"] == "succeeded"
    assert workflow["finished_at"] is not None
    assert statuses(workflow) == dict.fromkeys("abcd", "succeeded")


async def test_a_dependency_result_stored_by_reference_is_read_from_the_store(
    worker: InlineWorker,
) -> None:
    large = worker.settings.inline_result_max_bytes + 10
    created = await worker.workflow([step("big", size=large), step("reader", "big")])
    await worker.drain()
    big = await worker.job(created.jobs["big"])
    assert big["result_ref"] is not None  # really stored by reference
    _, _, deps = RUNS[-1]
    assert deps["big"][0] == "succeeded"
    assert deps["big"][1]["padding"] == "x" * large


async def test_on_failure_runs_compensation_and_the_success_path_is_cancelled_naming_it(
    worker: InlineWorker,
) -> None:
    created = await worker.workflow(
        [
            step("charge", fail=True),
            step("ship", "charge"),
            step("refund", {"name": "charge", "policy": "on_failure"}),
            step("audit", {"name": "ship", "policy": "on_complete"}),
            step("notify", "ship"),
        ]
    )
    await worker.drain()
    assert sorted(label for label, _, _ in RUNS) == ["audit", "charge", "refund"]
    workflow = await summary(worker, created.id)
    assert statuses(workflow) == {
        "charge": "failed",
        "ship": "cancelled",
        "refund": "succeeded",
        "audit": "succeeded",
        "notify": "cancelled",
    }
    ship = await worker.job(created.jobs["ship"])
    assert ship["last_error"] == (
        f"unreachable: its dependency 'charge' (job {created.jobs['charge']}) failed"
    )
    notify = await worker.job(created.jobs["notify"])
    assert "'ship'" in notify["last_error"]
    assert "was cancelled" in notify["last_error"]
    # The refund read what charge ended with.
    refund = next(deps for label, _, deps in RUNS if label == "refund")
    assert refund == {"charge": ("failed", None)}
    assert workflow["status"] == "failed"
    assert workflow["open_jobs"] == 0


async def test_a_compensation_that_cannot_run_is_cancelled_and_nothing_hangs(
    worker: InlineWorker,
) -> None:
    created = await worker.workflow(
        [step("work"), step("undo", {"name": "work", "policy": "on_failure"}), step("next", "undo")]
    )
    await worker.drain()
    workflow = await summary(worker, created.id)
    assert statuses(workflow) == {"work": "succeeded", "undo": "cancelled", "next": "cancelled"}
    assert workflow["status"] == "succeeded"
    assert workflow["finished_at"] is not None


async def test_finally_runs_once_after_every_other_job_settled(worker: InlineWorker) -> None:
    created = await worker.workflow(
        [
            step("cleanup", final=True),
            step("a"),
            step("b", "a", fail=True),
            step("c", "b"),
            step("d", "a"),
        ]
    )
    await worker.drain()
    order = [label for label, _, _ in RUNS]
    assert order.count("cleanup") == 1
    assert order[-1] == "cleanup"
    workflow = await summary(worker, created.id)
    assert statuses(workflow) == {
        "cleanup": "succeeded",
        "a": "succeeded",
        "b": "failed",
        "c": "cancelled",
        "d": "succeeded",
    }
    assert workflow["status"] == "failed"


@pytest.mark.parametrize(
    ("jobs", "kind"),
    [
        ([step("a", "b"), step("b", "a")], "cycle"),
        ([step("a"), step("b", "c"), step("c", "d"), step("d", "b")], "cycle"),
        ([step("a", "a")], "cycle"),
        ([step("a"), step("a")], "duplicate"),
        ([step("a", "nope")], "unknown"),
    ],
)
async def test_an_invalid_graph_is_refused_and_nothing_is_written(
    worker: InlineWorker, jobs: list[dict[str, Any]], kind: str
) -> None:
    with pytest.raises(InvalidWorkflow) as refused:
        await worker.workflow(jobs)
    assert refused.value.kind == kind
    async with worker.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT (SELECT count(*) FROM jobcore.jobs) + (SELECT count(*) FROM "
            "jobcore.workflows) AS n"
        )
        assert await cursor.fetchone() == {"n": 0}


async def test_retrying_a_failed_job_then_runs_its_dependents(worker: InlineWorker) -> None:
    created = await worker.workflow(
        [step("a", fail=True), step("b", "a"), step("c", "b"), step("z", final=True)]
    )
    await worker.drain()
    workflow = await summary(worker, created.id)
    assert statuses(workflow) == {
        "a": "failed",
        "b": "cancelled",
        "c": "cancelled",
        "z": "succeeded",
    }
    assert workflow["status"] == "failed"
    # The handler succeeds now.
    async with worker.db.connection() as conn:
        await conn.execute(
            "UPDATE jobcore.jobs SET payload = payload || '{\"fail\": false}' WHERE id = %s",
            [created.jobs["a"]],
        )
    await retry_step(worker.db, worker.topology, created.id, "a", tenant="test")
    reopened = await summary(worker, created.id)
    assert reopened["status"] == "running"
    assert reopened["finished_at"] is None
    assert statuses(reopened)["b"] == "pending"
    await worker.drain()
    workflow = await summary(worker, created.id)
    assert statuses(workflow) == dict.fromkeys("abcz", "succeeded")
    assert workflow["status"] == "succeeded"
    runs = [(label, attempt) for label, attempt, _ in RUNS]
    assert runs.count(("a", 2)) == 1
    assert [r for r in runs if r[0] in "bc"] == [("b", 1), ("c", 1)]
    # the finally job ran once, the first time everything was settled
    assert [r for r in runs if r[0] == "z"] == [("z", 1)]
    # Its timeline: the end it left (carried by `revived`, no event row of its own:
    # migration 0041), then its second attempt's, from the job row.
    found = await job_timeline(worker.db, created.jobs["a"], tenant=None)
    assert found is not None
    ends = [(e.kind, e.attempt, e.detail.get("status")) for e in found.events]
    ends = [e for e in ends if e[0] in ("finished", "revived")]
    assert ends == [("finished", 1, "failed"), ("revived", 1, None), ("finished", 2, "succeeded")]
    async with worker.db.connection() as conn:
        cur = await conn.execute(
            "SELECT kind FROM jobcore.job_events WHERE job_id = %s AND kind = 'finished'",
            [created.jobs["a"]],
        )
        assert await cur.fetchall() == []


async def test_cancelling_a_workflow_cancels_every_job_not_ended(worker: InlineWorker) -> None:
    created = await worker.workflow(
        [step("a"), step("b", "a"), step("c", "b"), step("f", final=True)]
    )
    outcome = await cancel_workflow(worker.db, created.id, tenant="test")
    assert outcome.cancelled == 4
    await worker.drain()
    assert RUNS == []
    workflow = await summary(worker, created.id)
    assert statuses(workflow) == dict.fromkeys("abcf", "cancelled")
    assert workflow["status"] == "cancelled"


async def test_the_pruner_removes_a_finished_workflow_with_its_jobs(worker: InlineWorker) -> None:
    from jobcore.maintenance.retention import Retention

    kept = await worker.workflow([step("k1"), step("k2", "k1")])
    created = await worker.workflow([step("a"), step("b", "a")])
    await worker.drain()
    async with worker.db.connection() as conn:
        # Only the second finished past retention.
        await conn.execute(
            "UPDATE jobcore.workflows SET finished_at = now() - interval '400 days' WHERE id = %s",
            [created.id],
        )
        await conn.execute(
            "UPDATE jobcore.jobs SET finished_at = now() - interval '400 days' "
            "WHERE workflow_id IS NOT NULL"
        )
    report = await Retention(worker.settings, worker.db).prune(sweep_files=False)
    assert report.tables["workflows"] == 1
    async with worker.db.connection() as conn:
        cursor = await conn.execute(
            "SELECT (SELECT count(*) FROM jobcore.jobs WHERE workflow_id = %s) AS jobs,"
            " (SELECT count(*) FROM jobcore.workflow_jobs WHERE workflow_id = %s) AS steps,"
            " (SELECT count(*) FROM jobcore.workflow_edges WHERE workflow_id = %s) AS edges,"
            " (SELECT count(*) FROM jobcore.jobs WHERE workflow_id = %s) AS kept",
            [created.id, created.id, created.id, kept.id],
        )
        # The unfinished-past-retention workflow's jobs stay, though they are old enough
        # for the job pruner: they go with their workflow.
        assert await cursor.fetchone() == {"jobs": 0, "steps": 0, "edges": 0, "kept": 2}
