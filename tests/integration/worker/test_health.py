"""The worker's health server: liveness, readiness, counters and Prometheus metrics."""

from __future__ import annotations

import httpx

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.testing.waiting import eventually
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.jobtypes import GatePayload
from tests.integration.worker.support import OutboxPump, status_is, submit


async def test_health_and_metrics_report_the_worker(
    db: Database, topology: Topology, pump: OutboxPump, start_worker: StartWorker
) -> None:
    worker = await start_worker()
    job_id = await submit(db, topology, "wt_gate", GatePayload())
    await eventually(lambda: status_is(db, job_id, "succeeded"), what="success")
    assert worker.health is not None

    async def port() -> int | None:
        return worker.health.port if worker.health else None

    base = f"http://127.0.0.1:{await eventually(port, what='the health port')}"
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        ready = await client.get("/readyz")
        health = (await client.get("/healthz")).json()
        metrics = (await client.get("/metrics")).text

    assert ready.status_code == 200
    assert ready.json()["ready"] is True
    assert health["broker_connected"] is True
    assert health["running_handlers"] == 0
    assert health["taking_deliveries"] is True
    assert health["consumer_priority"] == worker.consumer.priority >= 1
    assert health["queues"] == sorted(worker.registry.queues())
    assert health["counters"]["processed.succeeded"] == 1
    assert 'jobcore_worker_jobs_processed_total{outcome="succeeded"} 1.0' in metrics
    assert "jobcore_worker_duplicate_messages_total 0.0" in metrics
    assert "jobcore_worker_running_handlers 0.0" in metrics
