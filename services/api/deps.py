"""FastAPI dependencies as ``Annotated`` aliases: what a route asks for by its type.

A request to a job route uses one pooled connection and one transaction for everything:
the API-key lookup and the route's own statements (``UowDep`` is shared by both). Routes
list what needs no database first (the key's presence, the body), so the transaction
opens only after the request has arrived in full, and it ends when the route returns,
before the response is sent: a slow client never holds a connection. It rolls back
unless the route committed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from jobcore import apikeys
from jobcore.amqp.topology import Topology
from jobcore.db import Database, UnitOfWork
from jobcore.errors import ServiceStateError
from jobcore.registry import Registry
from jobcore.results import LocalResultStore
from jobcore.settings import Settings
from services.api.metrics import ApiMetrics


@dataclass(slots=True)
class ApiState:
    """Everything the routes share, built once by :func:`services.api.app.create_app`."""

    settings: Settings
    registry: Registry
    topology: Topology
    metrics: ApiMetrics
    results: LocalResultStore
    # Set while the app runs (the lifespan opens it).
    db: Database | None = None


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


async def unit_of_work(db: DbDep) -> AsyncIterator[UnitOfWork]:
    async with db.unit_of_work() as uow:
        yield uow


UowDep = Annotated[UnitOfWork, Depends(unit_of_work, scope="function")]

_bearer = HTTPBearer(
    auto_error=False,
    bearerFormat="jc_…",
    description="An API key from `jobcore keys create --tenant NAME`.",
)


async def api_key(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> str:
    # Checked before any database work, so a request without a key costs nothing.
    if credentials is None:
        raise apikeys.MissingApiKey()
    return credentials.credentials


ApiKeyDep = Annotated[str, Depends(api_key)]


async def authenticated_tenant(key: ApiKeyDep, uow: UowDep) -> str:
    return await apikeys.tenant_for_key(uow, key)


TenantDep = Annotated[str, Depends(authenticated_tenant)]
