"""FastAPI dependencies as ``Annotated`` aliases: what a route asks for by its type.

A request to a job route uses one pooled connection for everything: the API-key lookup
and the route's own statements (``SessionDep`` is shared by both). The connection is in
autocommit mode: the enqueue is one statement (job, outbox row and NOTIFY), reads are
single statements, so neither pays for BEGIN and COMMIT; a route that decides on what it
read (cancel) opens a transaction on the same connection. Routes list what needs no
database first (the key's presence, the body), so the connection is taken only after the
request has arrived in full, and it goes back when the route returns, before the
response is sent: a slow client never holds a connection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from jobcore import apikeys
from jobcore.amqp.topology import Topology
from jobcore.db import Database, Session
from jobcore.enqueue import KeyOwner
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


async def session(db: DbDep) -> AsyncIterator[Session]:
    async with db.session() as opened:
        yield opened


SessionDep = Annotated[Session, Depends(session, scope="function")]

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


async def authenticated_tenant(key: ApiKeyDep, db_session: SessionDep) -> str:
    return await apikeys.tenant_for_key(db_session, key)


TenantDep = Annotated[str, Depends(authenticated_tenant)]


async def key_owner(key: ApiKeyDep) -> KeyOwner:
    """For the enqueue, which finds the key's tenant in its own statement (one round trip
    instead of two); a string that cannot be a key is refused without a lookup."""
    if not apikeys.looks_like_key(key):
        raise apikeys.InvalidApiKey()
    return KeyOwner(apikeys.hash_key(key))


KeyOwnerDep = Annotated[KeyOwner, Depends(key_owner)]
