"""The API's composition root: settings, registry, pool, routes and error mapping."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.database.schema_version import check_schema_on
from jobcore.execution.preflight import check_job_types
from jobcore.execution.registry import load_job_modules
from jobcore.kernel.errors import DatabaseUnavailable, JobcoreError
from jobcore.kernel.settings import Settings, load_settings
from jobcore.storage.objectstore import open_result_store
from jobcore.telemetry.logs import configure_logging
from jobcore.telemetry.otlp_metrics import MetricsText, metrics_pusher
from jobcore.telemetry.traces import setup_tracing
from jobcore.usecases.enqueue.wakeups import RelayWakeups
from services.api import problems
from services.api.auth import KeyCache
from services.api.deps import ApiState
from services.api.longpolls import LongPollSlots
from services.api.metrics import ApiMetrics
from services.api.openapi import build_document
from services.api.routes import (
    admin,
    batches,
    bench,
    deliveries,
    enqueue,
    health,
    jobs,
    workflows,
)
from services.api.views import JsonBody
from services.api.waiters import JobWaiters

log = logging.getLogger(__name__)

# How long shutdown waits for the long-poll listener to let go of its connection.
WAITERS_STOP_GRACE = 2.0
# One round of waiting for the database's first connection, tried every second; rounds
# repeat until it answers.
FIRST_CONNECTION_WAIT = 60.0

DESCRIPTION = """\
User-visible background jobs. `POST /jobs/{type}` stores the job and its outbox message
in one transaction and answers 202; poll `GET /jobs/{id}`. Every `/jobs` route needs
`Authorization: Bearer <api key>` with the route's scope (`enqueue`, `read` or `cancel`);
the `/admin` routes need the `admin` scope. Errors are RFC 9457 problem JSON."""


def app_from_environment() -> FastAPI:
    """The uvicorn factory of `jobcore api`: each server process (there are several with
    ``--workers``) configures its JSON logs and builds the app from JOBCORE_* variables."""
    settings = load_settings()
    configure_logging("api", settings.log_level)
    setup_tracing("jobcore-api")
    return create_app(settings)


def _rendered(metrics: ApiMetrics) -> MetricsText:
    async def text() -> str:
        return metrics.render().decode()

    return text


async def _check_when_reachable(db: Database) -> None:
    """Open a first connection as soon as the database answers, so that its schema check
    (``first_check``) is made then, not at the first request that needs the database."""
    while True:
        try:
            await db.wait_reachable(FIRST_CONNECTION_WAIT)
            return
        except DatabaseUnavailable:
            continue  # still down: keep trying
        except JobcoreError:
            return  # refused: kept on the pool (schema_refusal), which stops the server


def schema_refusal(app: Any) -> JobcoreError | None:
    """Why the API's own pool refused the schema on its first connection, if it did, for
    the server running ``app`` (wrapped in uvicorn's middleware, or not): `jobcore api`
    then stops, and exits with that one line."""
    while app is not None and not isinstance(app, FastAPI):
        app = getattr(app, "app", None)
    state: ApiState | None = getattr(app.state, "api", None) if app is not None else None
    if state is None or state.own_db is None:
        return None
    return state.own_db.refusal


def create_app(
    settings: Settings | None = None,
    *,
    database: Database | None = None,
) -> FastAPI:
    """Build the API. Without ``database`` the app opens and closes its own pool in its
    lifespan; a database passed in must be open already and is never closed here."""
    settings = settings or load_settings()
    registry = load_job_modules(settings.job_modules)
    check_job_types(registry, settings)
    state = ApiState(
        settings=settings,
        registry=registry,
        topology=Topology.from_settings(settings),
        metrics=ApiMetrics(t.name for t in registry),
        results=open_result_store(settings),
        key_cache=KeyCache(settings.api_key_cache_seconds)
        if settings.api_key_cache_seconds > 0
        else None,
        enqueue_keys=KeyCache(enqueue.KEY_MEMORY_SECONDS),
    )
    # The long-poll listener (GET /jobs/{id}?wait=): one LISTEN connection per process.
    waiters = JobWaiters(settings, registry=state.metrics.registry)
    # Metrics over OTLP too when the environment asks (jobcore.telemetry.otlp_metrics).
    export = metrics_pusher("jobcore-api", _rendered(state.metrics))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        owned = database is None
        db = (
            # The schema is checked on the first connection: `jobcore api` checked it at
            # start only if the database answered then (schema_refusal).
            Database(settings, name="jobcore-api", generic_plans=True, first_check=check_schema_on)
            if database is None
            else database
        )
        first_connection: asyncio.Task[None] | None = None
        if owned:
            # Not waiting for a connection: the API starts while the database is down,
            # answers 503 meanwhile, and recovers without a restart.
            state.own_db = db
            await db.open()
            first_connection = asyncio.create_task(_check_when_reachable(db))
        state.db = db
        state.relay_wakeups = RelayWakeups(db)
        state.enqueues = enqueue.coalescer(state, db)
        await waiters.start()
        if export is not None:
            await export.start()
        log.info("api started", extra={"job_types": [t.name for t in registry]})
        try:
            yield
        finally:
            await waiters.stop(WAITERS_STOP_GRACE)
            if export is not None:
                await export.stop(WAITERS_STOP_GRACE)
            enqueues, state.enqueues = state.enqueues, None
            if enqueues is not None:
                await enqueues.close(WAITERS_STOP_GRACE)
            wakeups, state.relay_wakeups = state.relay_wakeups, None
            state.db = None
            if wakeups is not None:
                await wakeups.close()
            if first_connection is not None:
                first_connection.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await first_connection
            if owned:
                await db.close()

    app = FastAPI(
        title="jobcore",
        version="1",
        description=DESCRIPTION,
        lifespan=lifespan,
        default_response_class=JsonBody,
        # FastAPI's own request span (W3C context in, METHOD route-template) is the
        # parent of our enqueue and statement spans; its per-dependency spans are off.
        telemetry={"operation_spans": False},
    )
    app.state.api = state
    app.state.job_waiters = waiters
    app.state.long_poll_slots = LongPollSlots(settings.api_max_long_polls)
    problems.install(app)
    app.include_router(jobs.build_router(registry))
    app.include_router(batches.build_router(registry))
    app.include_router(workflows.build_router(registry))
    app.include_router(deliveries.router)
    app.include_router(admin.router)
    app.include_router(health.router)
    if settings.bench_routes:  # only `jobcore bench` sets it (refused in production)
        app.include_router(bench.router)

    _, payload_definitions = jobs.payload_schemas(registry)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_document(app, payload_definitions)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
