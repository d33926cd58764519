"""The baselines a user would build for `jobcore bench peers`' HTTP comparison, each a
minimal FastAPI app in one process:

- ``api``: sends a Celery task with ``apply_async`` and answers 202 with its id (``GET
  /jobs/{id}`` answers the task's state from the result backend), for a Celery worker with
  ``acks_late`` and ``task_track_started`` and Celery's PostgreSQL result backend
  (``db+postgresql+psycopg://``);
- ``procrastinate_api``: defers the no-op Procrastinate task of
  :mod:`services.bench.peers_apps` with ``defer_async`` over its ``PsycopgConnector``'s
  pool and answers 202 with the job id (``GET /jobs/{id}``: the job's status from
  ``procrastinate_jobs``), for a Procrastinate worker on the same database.

Each also takes ``POST /jobs/noop/batch`` (``{"count": n, "enqueued": t}``), the paced
scenario's batches: Celery sends ``n`` tasks carrying ``t``, Procrastinate defers ``n``
jobs in one statement and answers their ids.

Configured from the environment the scenario sets (``BENCH_PEERS_*``); needs the ``bench``
extra (celery, SQLAlchemy, procrastinate).

The Celery task returns when it was enqueued (the API's clock) and when it started (the
worker's): the same machine's clock, read from the backend's rows afterwards with its
``date_done``, gives POST→succeeded and enqueue→start as jobcore's job rows do.
Procrastinate records both itself (``procrastinate_events``: deferred, started, succeeded).
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from celery import Celery  # type: ignore[import-untyped]
from celery.result import AsyncResult  # type: ignore[import-untyped]
from fastapi import FastAPI
from pydantic import BaseModel, Field

from services.bench.peers_apps import procrastinate_app, procrastinate_noop

celery_http = Celery(
    "bench_peers_http",
    broker=os.environ.get("BENCH_PEERS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    backend=os.environ.get("BENCH_PEERS_CELERY_BACKEND", "db+postgresql+psycopg:///postgres"),
)
celery_http.conf.update(
    task_default_queue=os.environ.get("BENCH_PEERS_CELERY_QUEUE", "bench_peers_http"),
    task_acks_late=True,
    task_track_started=True,
    result_serializer="json",
    # One backend for the API's threads (FastAPI runs the plain-def handler in a pool of
    # up to 40): per thread, each made its own on its first task and connected to create
    # the tables, up to 40 connections at once, past a shared server's max_connections.
    result_backend_thread_safe=True,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@celery_http.task(name="noop_http")  # type: ignore[untyped-decorator]
def noop_http(enqueued: float) -> dict[str, float]:
    return {"enqueued": enqueued, "started": time.time()}


api = FastAPI()


@api.post("/jobs/noop", status_code=202)
def enqueue() -> dict[str, str]:
    # A plain def: FastAPI runs it in its thread pool, as Celery's blocking publish needs.
    result = noop_http.apply_async((time.time(),))
    return {"id": str(result.id), "status": "pending"}


class Paced(BaseModel):
    """A batch of the paced scenario: how many no-op tasks, and the load generator's clock
    just before it sent them (each task carries it, so its pickup is measured from it)."""

    count: int = Field(ge=1, le=1000)
    enqueued: float


@api.post("/jobs/noop/batch", status_code=202)
def enqueue_batch(batch: Paced) -> dict[str, int]:
    # One publish per task on the app's producer, as a Celery user enqueues many.
    with celery_http.producer_or_acquire() as producer:
        for _ in range(batch.count):
            noop_http.apply_async((batch.enqueued,), producer=producer)
    return {"count": batch.count}


@api.get("/jobs/{task_id}")
def status(task_id: str) -> dict[str, Any]:
    return {"id": task_id, "state": AsyncResult(task_id, app=celery_http).state}


@asynccontextmanager
async def _procrastinate_open(_: FastAPI) -> AsyncIterator[None]:
    async with procrastinate_app.open_async():
        yield


procrastinate_api = FastAPI(lifespan=_procrastinate_open)


@procrastinate_api.post("/jobs/noop", status_code=202)
async def defer() -> dict[str, Any]:
    job_id = await procrastinate_noop.defer_async()
    return {"id": job_id, "status": "todo"}


@procrastinate_api.post("/jobs/noop/batch", status_code=202)
async def defer_batch(batch: Paced) -> dict[str, list[int]]:
    # One statement for the batch: Procrastinate's own batch defer.
    return {"ids": await procrastinate_noop.batch_defer_async(*([{}] * batch.count))}


@procrastinate_api.get("/jobs/{job_id}")
async def job_status(job_id: int) -> dict[str, Any]:
    status = await procrastinate_app.job_manager.get_job_status_async(job_id)
    return {"id": job_id, "status": status.value}
