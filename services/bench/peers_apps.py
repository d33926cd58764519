"""The Celery and Procrastinate apps `jobcore bench peers` runs next to jobcore: one
no-op task each, configured from the environment the scenario sets for the worker it
starts (``BENCH_PEERS_*``). Imported only by that scenario and by the workers it starts;
both libraries come with the ``bench`` extra."""

from __future__ import annotations

import os
from typing import Any

import procrastinate
from celery import Celery  # type: ignore[import-untyped]

celery_app = Celery(
    "bench_peers",
    broker=os.environ.get("BENCH_PEERS_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"),
)
# classic (Celery's default) or quorum (what jobcore's queues are).
_queue_type = os.environ.get("BENCH_PEERS_CELERY_QUEUE_TYPE", "classic")
celery_app.conf.update(
    task_ignore_result=True,
    task_default_queue=os.environ.get("BENCH_PEERS_CELERY_QUEUE", "bench_peers"),
    # For the worker's default queue and any named queue the app does not declare (5.5+).
    task_default_queue_type=_queue_type,
    task_create_missing_queue_type=_queue_type,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@celery_app.task(name="noop")  # type: ignore[untyped-decorator]
def celery_noop() -> None:
    return None


def _procrastinate_pool() -> dict[str, Any]:
    """The connector's pool size: BENCH_PEERS_PROCRASTINATE_POOL_MAX connections (the HTTP
    app's: as many as jobcore's API may hold, one to start); unset, psycopg_pool's default
    (the workers')."""
    size = os.environ.get("BENCH_PEERS_PROCRASTINATE_POOL_MAX")
    return {} if size is None else {"min_size": 1, "max_size": int(size)}


procrastinate_app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(
        conninfo=os.environ.get("BENCH_PEERS_PROCRASTINATE_DSN", "postgresql:///postgres"),
        **_procrastinate_pool(),
    )
)


@procrastinate_app.task(name="noop")
async def procrastinate_noop(**_: Any) -> None:
    return None
