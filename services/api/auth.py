"""Authentication before anything else (DESIGN.md, invariant 13).

Every route under ``/jobs`` and ``/admin`` is an :class:`AuthenticatedRoute`: its handler
checks the API key against the database and the key's scope for the route, and only then
hands the request to FastAPI, which reads the body, validates the path, query and headers
and solves the dependencies (resolving a callback URL among them). A dependency could not
do this: FastAPI validates every parameter and solves every dependency of a route even
when one of them fails, so a made-up key with a bad body would get a 422 naming the bad
field, and its callback URL would be resolved. Here it gets a 401, and nothing else runs.

The lookup holds a pooled connection for its one statement only; the route takes its own
once the request has arrived in full (a slow client never holds one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, ClassVar

from fastapi import Depends, Request, Security
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.responses import Response

from jobcore import apikeys
from jobcore.apikeys import Principal
from jobcore.errors import ServiceStateError
from jobcore.scopes import Scope

log = logging.getLogger(__name__)

bearer = HTTPBearer(
    auto_error=False,
    bearerFormat="jc_…",
    description="An API key from `jobcore keys create --tenant NAME`.",
)

_PRINCIPAL = "jobcore_principal"


async def authenticate(request: Request, scope: Scope) -> Principal:
    """The key's principal, if the key is usable and has ``scope``: else 401 or 403."""
    credentials = await bearer(request)
    # Checked before any database work, so a request without a key costs nothing.
    if credentials is None:
        raise apikeys.MissingApiKey()
    db = request.app.state.api.db
    if db is None:
        # Before start-up or after shutdown: the same answer as a closed pool.
        raise ServiceStateError("the database pool is not open")
    async with db.session() as session:
        principal = await apikeys.authenticate(session, credentials.credentials)
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
        handle = super().get_route_handler()
        scope = self.scope

        async def authenticated(request: Request) -> Response:
            request.scope[_PRINCIPAL] = await authenticate(request, scope)
            return await handle(request)

        return authenticated


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
    found: Principal | None = request.scope.get(_PRINCIPAL)
    if found is None:  # pragma: no cover - a route that asks for it is an AuthenticatedRoute
        raise RuntimeError(f"{request.url.path}: the route is not an AuthenticatedRoute")
    return found


PrincipalDep = Annotated[Principal, Depends(principal)]


async def tenant(who: PrincipalDep) -> str:
    return who.tenant


TenantDep = Annotated[str, Depends(tenant)]


async def actor(who: PrincipalDep) -> str:
    """Who an admin route's audit entry names: the key's id, never the key."""
    return f"key:{who.key_id}"


ActorDep = Annotated[str, Depends(actor)]
