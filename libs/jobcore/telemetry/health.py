"""A small HTTP server for the relay and the worker: /healthz, /readyz and /metrics.

The API serves the same paths from its own app. Each process passes callables that
report its state; the server itself knows nothing about relays or workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from jobcore.kernel.startstop import Service

log = logging.getLogger(__name__)

# (ready?, details) — details is shown as JSON on /healthz and /readyz.
StateProbe = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]
MetricsText = Callable[[], Awaitable[str]]


def _json(body: dict[str, Any], status: int = 200) -> Response:
    return Response(orjson.dumps(body, default=str), status, media_type="application/json")


def health_app(name: str, probe: StateProbe, metrics: MetricsText | None = None) -> Starlette:
    async def healthz(request: Request) -> Response:
        _, details = await probe()
        return _json({"status": "alive", "service": name, **details})

    async def readyz(_: Request) -> Response:
        ready, details = await probe()
        return _json({"ready": ready, "service": name, **details}, 200 if ready else 503)

    async def metrics_endpoint(_: Request) -> Response:
        text = await metrics() if metrics else ""
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    return Starlette(
        routes=[
            Route("/healthz", healthz),
            Route("/readyz", readyz),
            Route("/metrics", metrics_endpoint),
        ]
    )


class EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signals to the process's own handlers."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HealthServer(Service):
    """Serves :func:`health_app` on ``host:port`` (port 0 picks a free one)."""

    def __init__(
        self, name: str, host: str, port: int, probe: StateProbe, metrics: MetricsText | None = None
    ) -> None:
        super().__init__()
        self.name = f"{name}-health"
        config = uvicorn.Config(
            health_app(name, probe, metrics),
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        self._server = EmbeddedServer(config)

    @property
    def port(self) -> int | None:
        servers = getattr(self._server, "servers", [])
        for server in servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return None

    async def run(self) -> None:
        serve = asyncio.create_task(self._server.serve())
        await self.stopping.wait()
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await serve
