"""The worker's pruner: only the maintenance leader's prunes, metrics, and a message
redelivered after its inbox row was pruned still has no second effect."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import httpx

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.job_messages import job_message_row
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.maintenance import LEADER_LEASE, Pruner
from jobcore.testing.jobtypes import EffectPayload
from jobcore.testing.waiting import eventually
from services.worker.metrics import WorkerMetrics
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.support import (
    Maintenance,
    OutboxPump,
    effects,
    job_row,
    relayed,
    status_is,
    submit,
    worker_settings,
)
from tests.support.retention import make_job, own_rows

DAY = timedelta(days=1)
_OLDEST = 'jobcore_oldest_terminal_job_age_seconds{{status="{}"}}'


def pruner(settings: Settings, db: Database, owner: str) -> Maintenance:
    """A maintainer running only a pruner."""
    metrics = WorkerMetrics()
    return Maintenance(db, owner, Pruner.from_settings(settings, metrics=metrics), metrics=metrics)


async def jobs_left(db: Database) -> int:
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM jobs")
        row = await cur.fetchone()
    return int(row["n"]) if row else -1


async def test_only_the_leader_prunes(
    db: Database, topology: Topology, wsettings: Settings
) -> None:
    first, second = pruner(wsettings, db, "first"), pruner(wsettings, db, "second")
    for _ in range(2):
        await make_job(db, topology)

    await first.round()
    await second.round()

    assert (first.is_leader, second.is_leader) == (True, False)
    assert await jobs_left(db) == 0
    for _ in range(2):
        await make_job(db, topology)
    await second.round()
    assert await jobs_left(db) == 2  # not the holder: prunes nothing
    assert second.metrics.counts["pruned.jobs"] == 0
    await first.round()
    assert await jobs_left(db) == 0
    assert first.metrics.counts["pruned.jobs"] == 4


async def test_a_pruner_that_loses_its_lease_mid_pass_stops_at_the_next_batch(
    db: Database, topology: Topology, wsettings: Settings
) -> None:
    settings = wsettings.model_copy(update={"pruner_batch_size": 2})
    holder = pruner(settings, db, "holder")
    await holder.round()
    assert holder.is_leader
    term = holder.maintainer.term
    assert term is not None
    for _ in range(6):
        await make_job(db, topology, effect=False, delivery=False)

    async def taken_over(seconds: float) -> bool:
        # Between two batches (the holder was paused, say) another worker took the lease.
        async with db.connection() as conn:
            await conn.execute(
                "UPDATE maintenance_leases SET owner = 'successor', token = gen_random_uuid() "
                "WHERE name = %s",
                (LEADER_LEASE,),
            )
        return False

    term.sleep = taken_over  # type: ignore[method-assign]
    await holder.round()

    assert not holder.is_leader
    assert await jobs_left(db) == 4  # one batch of 2, then the fence stopped it
    assert holder.metrics.counts["pruned.jobs"] == 2


async def test_metrics_count_pruned_rows_and_the_oldest_finished_job(
    db: Database, topology: Topology, wsettings: Settings
) -> None:
    for _ in range(3):
        await make_job(db, topology, age=9 * DAY)
    await make_job(db, topology, status="failed", age=2 * DAY)
    await make_job(db, topology, age=DAY)
    holder, other = pruner(wsettings, db, "holder"), pruner(wsettings, db, "other")
    await holder.maintainer.elect()  # the other one is not the leader

    await other.round()  # not the holder: it only surveys

    metrics = other.metrics.render()
    assert await jobs_left(db) == 5
    assert _gauge(metrics, _OLDEST.format("succeeded")) > 9 * 86_400
    assert _gauge(metrics, _OLDEST.format("failed")) > 2 * 86_400
    assert _gauge(metrics, _OLDEST.format("cancelled")) == 0
    assert _gauge(metrics, "jobcore_prune_overdue_seconds") > 2 * 86_400  # 9 days - 7
    assert 'jobcore_worker_pruned_rows_total{table="jobs"} 0.0' in metrics

    await holder.round()

    metrics = holder.metrics.render()
    assert 'jobcore_worker_pruned_rows_total{table="jobs"} 3.0' in metrics
    assert 'jobcore_worker_pruned_rows_total{table="job_effects"} 3.0' in metrics
    assert 'jobcore_worker_pruned_rows_total{table="webhook_deliveries"} 3.0' in metrics
    oldest = _gauge(metrics, _OLDEST.format("succeeded"))
    assert 86_400 <= oldest < 2 * 86_400
    assert _gauge(metrics, "jobcore_prune_overdue_seconds") == 0
    assert holder.metrics.snapshot()["pruned.jobs"] == 3


async def test_a_message_redelivered_after_its_inbox_row_was_pruned_has_no_second_effect(
    db: Database,
    topology: Topology,
    settings: Settings,
    pump: OutboxPump,
    start_worker: StartWorker,
) -> None:
    # Relayed: the test redelivers the message its pump published.
    wsettings = relayed(worker_settings(settings, pruner_interval=0.2))
    worker = await start_worker(wsettings)
    job_id = await submit(db, topology, "effect", EffectPayload(n=1))
    await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")
    [published] = [row for row in pump.published if row.job_id == job_id]
    assert len(await effects(db, job_id)) == 1
    before = await job_row(db, job_id)

    # Its inbox row outlives the window; the worker's own pruner removes it.
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE inbox SET received_at = now() - make_interval(secs => %s) "
            "WHERE message_id = %s",
            (wsettings.inbox_retention.total_seconds() + 60, published.message_id),
        )

    async def inbox_has(present: bool) -> bool:
        async with db.connection() as conn:
            cur = await conn.execute(
                "SELECT 1 FROM inbox WHERE message_id = %s", (published.message_id,)
            )
            return (await cur.fetchone() is not None) is present

    await eventually(lambda: inbox_has(False), what="the inbox row to be pruned")

    # The broker delivers the very same message again (same id, same attempt).
    message: dict[str, Any] = job_message_row(
        topology,
        job_id=job_id,
        job_type=default_registry.get("effect"),
        attempt=1,
        trace_headers={},
    )
    await pump.publish(
        {**message, "headers": {}, "message_id": published.message_id, "body": published.body}
    )

    # Received afresh (a new inbox row), then stopped by the claim's fence.
    await eventually(lambda: inbox_has(True), what="the redelivery to be received")
    await eventually(
        lambda: _counted(worker.metrics.counts, "skipped"), what="the redelivery skipped"
    )
    assert len(await effects(db, job_id)) == 1
    assert await job_row(db, job_id) == before
    assert worker.metrics.counts["processed.succeeded"] == 1
    assert worker.metrics.counts["pruned.inbox"] >= 1
    assert await own_rows(db, job_id) == {
        "jobs": 1,
        "job_effects": 1,
        "webhook_deliveries": 0,
        "outbox": 0,
    }

    # The worker's /healthz shows it holds the pruner lease.
    assert worker.health is not None
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{worker.health.port}", timeout=5
    ) as client:
        health = (await client.get("/healthz")).json()
    assert health["pruner_leader"] is True
    assert health["counters"]["pruned.inbox"] >= 1


async def _counted(counts: dict[str, int], key: str) -> bool:
    return counts.get(key, 0) >= 1


def _gauge(metrics: str, sample: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{sample} is not in the metrics")
