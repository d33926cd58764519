"""`jobcore ui`: the operators' web console as its own process (and the factory that
mounts it at /ui inside the API, for `jobcore api --ui`)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import typer
import uvicorn

from jobcore.database.schema_version import check_schema
from jobcore.kernel.settings import load_settings
from jobcore.telemetry.logs import configure_logging
from services.cli.common import example, fail, settings
from services.cli.serve import ApiServer

DEFAULT_PORT = 8090


def ui(
    host: str = typer.Option("127.0.0.1", help="Listen address (the console is for operators)."),
    port: int = typer.Option(DEFAULT_PORT, min=0, max=65535, help="Port; 0 picks a free one."),
    session_hours: float = typer.Option(
        8.0, min=0.01, max=24 * 30, help="How long a sign-in lasts."
    ),
    access_log: bool = typer.Option(
        False, "--access-log/--no-access-log", help="Log every request."
    ),
) -> None:
    """Serve the web console (sign in with an admin key) until SIGTERM."""
    # Imported here: the console's templates would slow every other command's start.
    from services.ui.app import standalone_app

    config = settings()  # a bad setting stops here, with one line
    check_schema(config)
    configure_logging("ui", config.log_level)
    server_config = uvicorn.Config(
        standalone_app(config, session_ttl=session_hours * 3600),
        host=host,
        port=port,
        log_config=None,
        access_log=access_log,
        timeout_graceful_shutdown=max(1, math.ceil(config.shutdown_grace)),
        server_header=False,
    )
    server = ApiServer(server_config)
    server.run()
    if not server.started:
        fail("the console did not start (see the log above)")


def api_with_console_from_environment() -> Any:
    """The uvicorn factory of `jobcore api --ui`: the API, and the console mounted at /ui
    (one process: the console's sessions live in its memory)."""
    from services.api.app import app_from_environment
    from services.ui.app import MOUNT_PATH, create_app

    api = app_from_environment()
    console = create_app(load_settings())
    api.mount(MOUNT_PATH, console)
    # A mounted app's lifespan is not run by its parent: the API's runs the console's.
    api_lifespan = api.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[Any]:
        async with api_lifespan(app) as state, console.router.lifespan_context(console):
            yield state

    api.router.lifespan_context = lifespan
    return api


def register(app: typer.Typer) -> None:
    app.command("ui", epilog=example("jobcore ui --host 127.0.0.1 --port 8090"))(ui)
