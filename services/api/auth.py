"""Authentication before anything else (docs/design.md, invariant 13).

Every route under ``/jobs`` and ``/admin`` is an :class:`AuthenticatedRoute`: its handler
checks the API key against the database and the key's scope for the route, and only then
hands the request to FastAPI, which reads the body, validates the path, query and headers
and solves the dependencies (resolving a callback URL among them). A dependency could not
do this: FastAPI validates every parameter and solves every dependency of a route even
when one of them fails, so a made-up key with a bad body would get a 422 naming the bad
field, and its callback URL would be resolved. Here it gets a 401, and nothing else runs.
``POST /jobs/{type}`` trusts keys it verified in the last few seconds instead, because its
statement checks the key again (services.api.routes.enqueue, which looks the key up
before it answers an error or resolves a callback URL).

The lookup holds a pooled connection for its one statement only; the route takes its own
once the request has arrived in full (a slow client never holds one).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar

from fastapi import Depends, Request, Security
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.responses import Response

from jobcore.access import apikeys
from jobcore.access.apikeys import Principal
from jobcore.kernel.errors import ServiceStateError
from jobcore.kernel.scopes import Scope

log = logging.getLogger(__name__)

bearer = HTTPBearer(
    auto_error=False,
    bearerFormat="jc_…",
    description="An API key from `jobcore keys create --tenant NAME`.",
)

_PRINCIPAL = "jobcore_principal"


class KeyCache:
    """Verified keys by hash, each for ``seconds`` (JOBCORE_API_KEY_CACHE_SECONDS), so a
    key in steady use costs no statement per request. Bounded: at most :data:`MAX_KEYS`
    entries (then it starts afresh). A revocation reaches a process within ``seconds``;
    an expiry is checked against the key's own ``expires_at`` on every request."""

    MAX_KEYS = 10_000

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._keys: dict[str, tuple[Principal, float, datetime | None]] = {}

    def get(self, key_hash: str) -> Principal | None:
        entry = self._keys.get(key_hash)
        if entry is None:
            return None
        principal, until, expires_at = entry
        if time.monotonic() >= until or (
            expires_at is not None and datetime.now(UTC) >= expires_at
        ):
            del self._keys[key_hash]
            return None
        return principal

    def put(self, key_hash: str, principal: Principal, expires_at: datetime | None) -> None:
        if self.seconds <= 0:
            return  # it would be forgotten at once
        if len(self._keys) >= self.MAX_KEYS:
            self._keys.clear()
        self._keys[key_hash] = (principal, time.monotonic() + self.seconds, expires_at)

    def forget(self, key_id: uuid.UUID) -> None:
        """Drop the key with this id (found revoked), so its next request looks it up."""
        for key_hash, (principal, _, _) in list(self._keys.items()):
            if principal.key_id == key_id:
                del self._keys[key_hash]


async def _lookup(request: Request, key: str, cache: KeyCache | None) -> Principal:
    db = request.app.state.api.db
    if db is None:
        # Before start-up or after shutdown: the same answer as a closed pool.
        raise ServiceStateError("the database pool is not open")
    if cache is None:
        async with db.session() as session:
            return await apikeys.authenticate(session, key)
    if not apikeys.looks_like_key(key):
        raise apikeys.InvalidApiKey()
    key_hash = apikeys.hash_key(key)
    principal = cache.get(key_hash)
    if principal is None:
        async with db.session() as session:
            principal, expires_at = await apikeys.authenticate_hash_until(session, key_hash)
        cache.put(key_hash, principal, expires_at)
    return principal


async def authenticate(
    request: Request, scope: Scope, *, cache: KeyCache | None = None, fresh: bool = False
) -> Principal:
    """The key's principal, if the key is usable and has ``scope``: else 401 or 403.
    Remembered by ``cache`` if given (a route whose statements check the key again), else
    by the API's own cache if JOBCORE_API_KEY_CACHE_SECONDS is set; looked up whatever
    either remembers when ``fresh``."""
    credentials = await bearer(request)
    # Checked before any database work, so a request without a key costs nothing.
    if credentials is None:
        raise apikeys.MissingApiKey()
    memory = None if fresh else cache if cache is not None else request.app.state.api.key_cache
    principal = await _lookup(request, credentials.credentials, memory)
    # The key's id, never the key or its hash (tests/security/test_keys_in_logs.py).
    log.debug(
        "request authenticated",
        extra={"key_id": str(principal.key_id), "tenant": principal.tenant, "scope": scope},
    )
    principal.require(scope)
    return principal


class AuthenticatedRoute(APIRoute):
    """A route whose every request is authenticated, for :attr:`scope`, first."""

    scope: ClassVar[Scope]

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = self.authenticated_handler()
        scope = self.scope
        memory = self.key_memory

        async def authenticated(request: Request) -> Response:
            request.scope[_PRINCIPAL] = await authenticate(request, scope, cache=memory(request))
            return await handle(request)

        return authenticated

    def authenticated_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """What runs once the caller is authenticated: FastAPI's handler, unless a route
        serves itself (services.api.routes.enqueue)."""
        return super().get_route_handler()

    def key_memory(self, request: Request) -> KeyCache | None:
        """The verified keys this route may trust without a lookup (None: the API's
        JOBCORE_API_KEY_CACHE_SECONDS cache, if any). Only for a route whose statements
        check the key again."""
        return None


def request_principal(request: Request) -> Principal:
    """The principal :class:`AuthenticatedRoute` authenticated for ``request``."""
    found: Principal | None = request.scope.get(_PRINCIPAL)
    if found is None:  # pragma: no cover - a route that asks for it is an AuthenticatedRoute
        raise RuntimeError(f"{request.url.path}: the route is not an AuthenticatedRoute")
    return found


class EnqueueRoute(AuthenticatedRoute):
    scope = Scope.ENQUEUE


class ReadRoute(AuthenticatedRoute):
    scope = Scope.READ


class CancelRoute(AuthenticatedRoute):
    scope = Scope.CANCEL


class AdminRoute(AuthenticatedRoute):
    scope = Scope.ADMIN


async def principal(
    request: Request,
    # Only for /openapi.json, which lists the bearer scheme for every route that has it.
    _: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
) -> Principal:
    return request_principal(request)


PrincipalDep = Annotated[Principal, Depends(principal)]


async def tenant(who: PrincipalDep) -> str:
    return who.tenant


TenantDep = Annotated[str, Depends(tenant)]


async def actor(who: PrincipalDep) -> str:
    """Who an admin route's audit entry names: the key's id, never the key."""
    return f"key:{who.key_id}"


ActorDep = Annotated[str, Depends(actor)]
