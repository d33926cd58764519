"""Flow control (jobcore.kernel.gates) with real workers: concurrency limits, rate limits and
per-key ordering hold across three workers, and held jobs use no attempt.

Every check reads the job rows: intervals started_at..finished_at for the limits, the
started_at of each job for the rates, the order of places in each ordering key.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, fetch_one
from jobcore.database.sql.jobs.reads import JOB_GET_ANY_TENANT
from jobcore.execution.registry import Registry, default_registry, load_job_modules
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue_many
from jobcore.usecases.jobs import retry_job, unblock_job
from services.api.views import job_view
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.support import (
    WORKER_TEST_MODULES,
    OutboxPump,
    effects,
    job_row,
    submit,
    worker_settings,
)
from tests.support import flow_jobtypes
from tests.support.flow import most_starts_in_a_second, order_violations, overlap_per_key
from tests.support.flow_jobtypes import AccountPayload, OrderedPayload

pytestmark = pytest.mark.timeout(180)

WORKERS = 3


@pytest.fixture
def wsettings(settings: Settings) -> Settings:
    return worker_settings(
        settings,
        job_modules=(*WORKER_TEST_MODULES, flow_jobtypes.MODULE),
        gate_release_interval=0.1,
    )


async def start_workers(start_worker: StartWorker) -> None:
    for _ in range(WORKERS):
        await start_worker(concurrency=4)


async def api_read(db: Database, job_id: uuid.UUID) -> dict[str, Any]:
    async with db.connection() as conn:
        row = await fetch_one(conn, JOB_GET_ANY_TENANT({"id": job_id}))
    assert row is not None
    return dict(row)


async def rows_of(db: Database, job_type: str) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT * FROM jobs WHERE type = %s", (job_type,))
        return [dict(r) for r in await cur.fetchall()]


def all_in(*statuses: str, db: Database, job_type: str, count: int) -> Any:
    async def probe() -> list[dict[str, Any]] | None:
        rows = await rows_of(db, job_type)
        done = [r for r in rows if r["status"] in statuses]
        return rows if len(done) == count else None

    return probe


def seen_held(db: Database, job_type: str, reason: str) -> Any:
    async def probe() -> dict[str, Any] | None:
        held = [r for r in await rows_of(db, job_type) if r["held_reason"] == reason]
        return held[0] if held else None

    return probe


async def test_concurrency_limit_per_key_holds_across_workers_without_using_attempts(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker
) -> None:
    await start_workers(start_worker)
    for n in range(24):
        await submit(db, topology, "flow_limited", AccountPayload(account=f"a{n % 2}", seconds=0.1))

    held = await eventually(seen_held(db, "flow_limited", "concurrency"), what="a held job")
    # What GET /jobs/{id} shows of a job waiting for a slot (read as the API reads it).
    # The read's whereabouts columns, the held row's own state (it may be released since).
    view = job_view({**await api_read(db, held["id"]), **held})
    assert view["status"] == "pending"
    assert view["held_reason"] == "concurrency"
    assert view["held_since"] is not None

    rows = await eventually(
        all_in("succeeded", db=db, job_type="flow_limited", count=24),
        timeout=120,
        what="every limited job to succeed",
    )
    overlaps = overlap_per_key(rows, "concurrency_key")
    assert len(overlaps) == 2
    assert max(overlaps.values()) <= flow_jobtypes.LIMIT, overlaps
    # Held and released again and again, yet each job used one attempt.
    assert {r["attempts"] for r in rows} == {1}
    assert all(r["held_reason"] is None for r in rows)


async def test_rate_limit_per_key_spaces_starts_across_workers(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker
) -> None:
    await start_workers(start_worker)
    for n in range(20):
        await submit(db, topology, "flow_rated", AccountPayload(account=f"r{n % 2}", seconds=0))

    held = await eventually(seen_held(db, "flow_rated", "rate_limit"), what="a rate-held job")
    assert job_view({**await api_read(db, held["id"]), **held})["held_reason"] == "rate_limit"
    rows = await eventually(
        all_in("succeeded", db=db, job_type="flow_rated", count=20),
        timeout=120,
        what="every rate-limited job to succeed",
    )
    for account in ("r0", "r1"):
        starts = [r["started_at"] for r in rows if r["payload"]["account"] == account]
        assert most_starts_in_a_second(starts) <= flow_jobtypes.RATE, sorted(starts)
    assert {r["attempts"] for r in rows} == {1}


async def test_ordering_key_runs_jobs_in_enqueue_order_through_retries(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker
) -> None:
    await start_workers(start_worker)
    keys, per_key = 6, 8
    for n in range(per_key):
        for k in range(keys):
            # Every third job fails its first attempt: its retry still comes before the next.
            payload = OrderedPayload(n=n, fail_times=1 if n % 3 == 1 else 0)
            await submit(db, topology, "flow_ordered", payload, ordering_key=f"key-{k}")

    rows = await eventually(
        all_in("succeeded", db=db, job_type="flow_ordered", count=keys * per_key),
        timeout=150,
        what="every ordered job to succeed",
    )
    assert order_violations(rows) == []
    for row in rows:
        assert row["ordering_seq"] == row["payload"]["n"] + 1
        assert row["attempts"] == (2 if row["payload"]["n"] % 3 == 1 else 1)


async def test_a_failed_job_blocks_only_its_key_until_an_operator_retries_it(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
    tmp_path: Path,
) -> None:
    await start_workers(start_worker)
    fixed = tmp_path / "fixed"
    ids: dict[str, list[uuid.UUID]] = {"poisoned": [], "healthy": []}
    for n in range(4):
        for key in ids:
            poison = key == "poisoned" and n == 1
            payload = OrderedPayload(n=n, fail_unless=str(fixed) if poison else None)
            ids[key].append(await submit(db, topology, "flow_ordered", payload, ordering_key=key))

    async def healthy_done() -> bool:
        return all([(await job_row(db, i))["status"] == "succeeded" for i in ids["healthy"]])

    await eventually(healthy_done, timeout=60, what="the healthy key to finish")
    poisoned = ids["poisoned"]
    await eventually(
        lambda: _status_is(db, poisoned[1], "failed"), timeout=60, what="the poison job to fail"
    )
    assert (await job_row(db, poisoned[0]))["status"] == "succeeded"
    # The jobs after it wait, and say why.
    for job_id in poisoned[2:]:
        row = await eventually(
            lambda job_id=job_id: _held(db, job_id), what="the later jobs to be held"
        )
        assert row["status"] == "pending"
        assert row["attempts"] == 0

    # The operator fixes the cause and retries: the copy takes the failed job's place.
    fixed.touch()
    outcome = await retry_job(db, wsettings, default_registry, poisoned[1], actor="test:operator")
    copy_row = await eventually(
        lambda: _status_is(db, outcome.job_id, "succeeded"), timeout=60, what="the copy to run"
    )
    for job_id in poisoned[2:]:
        await eventually(
            lambda job_id=job_id: _status_is(db, job_id, "succeeded"),
            timeout=60,
            what="the rest of the key to run",
        )
    later = [await job_row(db, i) for i in poisoned[2:]]
    assert all(copy_row["finished_at"] < row["started_at"] for row in later)
    assert order_violations(later) == []


async def test_a_skip_type_failed_job_lets_its_key_go_on(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    tmp_path: Path,
) -> None:
    await start_workers(start_worker)
    missing = str(tmp_path / "never")
    first = await submit(
        db,
        topology,
        "flow_ordered_skip",
        OrderedPayload(n=0, fail_unless=missing),
        ordering_key="k",
    )
    second = await submit(db, topology, "flow_ordered_skip", OrderedPayload(n=1), ordering_key="k")
    done = await eventually(
        lambda: _status_is(db, second, "succeeded"), timeout=60, what="the second job"
    )
    failed = await job_row(db, first)
    assert failed["status"] == "failed"
    assert failed["finished_at"] < done["started_at"]


@pytest.mark.parametrize(
    ("job_type", "unblock"),
    [("flow_ordered_skip", False), ("flow_ordered", True)],
    ids=["skip-type", "unblocked-block-type"],
)
async def test_a_retried_job_never_runs_beside_a_later_job_of_its_key(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
    tmp_path: Path,
    job_type: str,
    unblock: bool,
) -> None:
    await start_workers(start_worker)
    fixed, gate = tmp_path / "fixed", tmp_path / "gate"
    first = await submit(
        db, topology, job_type, OrderedPayload(n=0, fail_unless=str(fixed)), ordering_key="k"
    )
    later = await submit(
        db, topology, job_type, OrderedPayload(n=1, gate=str(gate)), ordering_key="k"
    )
    await eventually(lambda: _status_is(db, first, "failed"), timeout=60, what="the first to fail")
    if unblock:  # a blocking type's failed job, let go by hand: the key goes on
        await unblock_job(db, first, actor="test:operator")
    # The later job of the key runs (its handler waits for the gate file).
    await eventually(lambda: _status_is(db, later, "running"), timeout=60, what="the later job")

    fixed.touch()
    outcome = await retry_job(db, wsettings, default_registry, first, actor="test:operator")

    # The copy goes to the back of the key: it waits for the running job, it does not run.
    async def copy_waits_or_ran() -> dict[str, Any] | None:
        row = await job_row(db, outcome.job_id)
        return row if row["held_reason"] == "ordering" or row["status"] != "pending" else None

    copy_now = await eventually(copy_waits_or_ran, timeout=60, what="the copy to be claimed")
    assert (copy_now["status"], copy_now["held_reason"]) == ("pending", "ordering")
    assert (await job_row(db, later))["status"] == "running"

    gate.touch()
    done = [
        await eventually(
            lambda job_id=job_id: _status_is(db, job_id, "succeeded"),
            timeout=60,
            what="the later job and the copy to succeed",
        )
        for job_id in (later, outcome.job_id)
    ]
    # Where the copy went: after the later job in its key.
    assert (
        done[1]["ordering_seq"]
        > done[0]["ordering_seq"]
        > (await job_row(db, first))["ordering_seq"]
    )
    assert order_violations(done) == []
    # The handlers' own intervals (recorded by each run) do not overlap.
    ran = [(await effects(db, row["id"]))[0]["detail"] for row in done]
    assert [r["n"] for r in ran] == [1, 0]
    assert ran[0]["ended"] <= ran[1]["started"], ran


async def test_retrying_a_blocking_job_twice_gives_its_place_once(
    db: Database, topology: Topology, wsettings: Settings
) -> None:
    first = await submit(db, topology, "flow_ordered", OrderedPayload(n=0), ordering_key="k")
    second = await submit(db, topology, "flow_ordered", OrderedPayload(n=1), ordering_key="k")
    async with db.connection() as conn:  # the first failed for good; the second waits
        await conn.execute(
            "UPDATE jobs SET status = 'failed', finished_at = now() WHERE id = %s", (first,)
        )
    place = (await job_row(db, first))["ordering_seq"]

    copy = await retry_job(db, wsettings, default_registry, first, actor="test:operator")
    again = await retry_job(db, wsettings, default_registry, first, actor="test:operator")
    # The first retry takes the blocking job's place (the second job waits for it); the
    # job no longer blocks then, so the next retry goes to the back of the key.
    assert (await job_row(db, copy.job_id))["ordering_seq"] == place
    assert (await job_row(db, first))["ordering_blocks"] is False
    assert (await job_row(db, again.job_id))["ordering_seq"] > (await job_row(db, second))[
        "ordering_seq"
    ]


async def _status_is(db: Database, job_id: uuid.UUID, status: str) -> dict[str, Any] | None:
    row = await job_row(db, job_id)
    return row if row["status"] == status else None


async def _held(db: Database, job_id: uuid.UUID) -> dict[str, Any] | None:
    row = await job_row(db, job_id)
    return row if row["held_reason"] == "ordering" else None


async def test_a_batch_of_limited_jobs_takes_its_types_gates(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker
) -> None:
    job_type = default_registry.get("flow_limited")
    items = [
        EnqueueRequest(
            tenant="t", job_type=job_type, payload=AccountPayload(account=f"b{n % 2}", seconds=0.1)
        )
        for n in range(12)
    ]
    async with db.unit_of_work() as uow:
        await enqueue_many(uow, topology, items)
        await uow.commit()
    written = await rows_of(db, "flow_limited")
    assert len(written) == 12
    assert {r["concurrency_key"] is not None for r in written} == {True}
    assert {r["concurrency_limit"] for r in written} == {flow_jobtypes.LIMIT}
    assert len({r["concurrency_key"] for r in written}) == 2  # one gate per account

    await start_workers(start_worker)
    rows = await eventually(
        all_in("succeeded", db=db, job_type="flow_limited", count=12),
        timeout=120,
        what="every batched limited job to succeed",
    )
    overlaps = overlap_per_key(rows, "concurrency_key")
    assert max(overlaps.values()) <= flow_jobtypes.LIMIT, overlaps
    assert {r["attempts"] for r in rows} == {1}


def registry_without_limits(settings: Settings, job_type: str) -> Registry:
    """A registry as a worker deployed before ``job_type`` declared its limits has it."""
    old = Registry()
    for declared in load_job_modules(settings.job_modules):
        if declared.name == job_type:
            declared = dataclasses.replace(declared, concurrency=None, rate=None)
        old.register(declared)
    return old


async def test_a_worker_whose_registry_lacks_the_rate_limit_still_keeps_it(
    db: Database,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    wsettings: Settings,
) -> None:
    # A rolling deploy: the API (and one worker) know flow_rated's Rate, another worker
    # still runs a registry without it. The limit is on the job rows; both workers keep it.
    jobs = 24
    for _ in range(jobs):
        await submit(db, topology, "flow_rated", AccountPayload(account="deploy", seconds=0))
    written = await rows_of(db, "flow_rated")
    assert {(r["rate_per_second"], r["rate_burst"]) for r in written} == {(flow_jobtypes.RATE, 1)}

    # Same consumer priority: RabbitMQ shares the deliveries between the two workers. The
    # old worker starts first, so it claims the first batch before any gate row exists.
    same = wsettings.model_copy(update={"worker_consumer_priority": 10})
    old = registry_without_limits(wsettings, "flow_rated")
    assert old.get("flow_rated").rate is None
    old_worker = await start_worker(same, registry=old, concurrency=8)
    await eventually(lambda: _any_started(db, "flow_rated"), what="the old worker to start a job")
    new_worker = await start_worker(same, concurrency=8)

    rows = await eventually(
        all_in("succeeded", db=db, job_type="flow_rated", count=jobs),
        timeout=120,
        what="every rate-limited job to succeed",
    )
    starts = [r["started_at"] for r in rows]
    # burst 1: no window of one second holds more than RATE starts.
    assert most_starts_in_a_second(starts) <= flow_jobtypes.RATE, sorted(starts)
    ran = {r["worker_id"] for r in rows}
    assert {old_worker.worker_id, new_worker.worker_id} <= ran, ran
    assert {r["attempts"] for r in rows} == {1}


async def _any_started(db: Database, job_type: str) -> bool:
    return any(r["started_at"] is not None for r in await rows_of(db, job_type))
