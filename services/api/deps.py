"""FastAPI dependencies as ``Annotated`` aliases: what a route asks for by its type.

The caller is authenticated before any of them runs (:mod:`services.api.auth`, which
also holds ``PrincipalDep`` and ``TenantDep``). A route's statements share one pooled
connection (``SessionDep``) in autocommit mode: the enqueue is one statement (job, outbox
row and NOTIFY), reads are single statements, so neither pays for BEGIN and COMMIT; a
route that decides on what it read (cancel) opens a transaction on the same connection.
Routes list what needs no database first (the body, the callback URL), so the connection
is taken only after the request has arrived in full, and it goes back when the route
returns, before the response is sent: a slow client never holds a connection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, Session
from jobcore.execution.registry import Registry
from jobcore.kernel.errors import ServiceStateError
from jobcore.kernel.settings import Settings
from jobcore.storage.results import ResultStore
from jobcore.usecases.enqueue.wakeups import RelayWakeups
from services.api.metrics import ApiMetrics

if TYPE_CHECKING:
    from services.api.auth import KeyCache
    from services.api.coalescing import EnqueueCoalescer


@dataclass(slots=True)
class ApiState:
    """Everything the routes share, built once by :func:`services.api.app.create_app`."""

    settings: Settings
    registry: Registry
    topology: Topology
    metrics: ApiMetrics
    results: ResultStore
    # Set while the app runs (the lifespan opens it).
    db: Database | None = None
    # services.api.auth.KeyCache when JOBCORE_API_KEY_CACHE_SECONDS is set, else None.
    key_cache: KeyCache | None = None
    # The keys POST /jobs/{type} verified lately (services.api.routes.enqueue).
    enqueue_keys: KeyCache | None = None
    # Set with db: the relays' wake-ups after enqueues commit (jobcore.usecases.enqueue.wakeups).
    relay_wakeups: RelayWakeups | None = None
    # Set with db: POST /jobs/{type}'s writes, coalesced per tenant (services.api.coalescing).
    enqueues: EnqueueCoalescer | None = None
    # The pool the lifespan opened, kept once it is closed: a schema it refused on its first
    # connection stops `jobcore api` (services.api.app.schema_refusal).
    own_db: Database | None = None


async def get_state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


StateDep = Annotated[ApiState, Depends(get_state)]


async def get_settings(state: StateDep) -> Settings:
    return state.settings


SettingsDep = Annotated[Settings, Depends(get_settings)]


async def get_db(state: StateDep) -> Database:
    if state.db is None:
        # Before start-up or after shutdown: the same answer as a closed pool.
        raise ServiceStateError("the database pool is not open")
    return state.db


DbDep = Annotated[Database, Depends(get_db)]


async def session(db: DbDep) -> AsyncIterator[Session]:
    async with db.session() as opened:
        yield opened


SessionDep = Annotated[Session, Depends(session, scope="function")]
