"""Commands of the api service: `jobcore api` and the `jobcore keys` admin verbs."""

from __future__ import annotations

import contextlib
import logging
import math
import uuid
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import typer
import uvicorn
from uvicorn import server as uvicorn_server
from uvicorn.supervisors import Multiprocess

from jobcore import apikeys
from jobcore.db import Database
from jobcore.logs import configure_logging
from jobcore.preflight import check_job_types
from jobcore.registry import load_job_modules
from jobcore.settings import Settings
from services.cli.common import emit, fail, run, settings

JSON_OPTION = typer.Option(False, "--json", help="Print JSON instead of a table.")

keys_app = typer.Typer(
    name="keys",
    help="Create, list and revoke API keys (one tenant per key).",
    no_args_is_help=True,
)


def api(
    host: str | None = typer.Option(None, help="Listen address [default: JOBCORE_API_HOST]."),
    port: int | None = typer.Option(
        None, min=0, max=65535, help="Port; 0 picks a free one [default: JOBCORE_API_PORT]."
    ),
    workers: int = typer.Option(1, min=1, max=64, help="Server processes sharing the port."),
    access_log: bool = typer.Option(
        False, "--access-log/--no-access-log", help="Log every request (costs throughput)."
    ),
) -> None:
    """Serve the enqueue and status API with uvicorn until SIGTERM."""
    config = settings()  # a bad setting stops here, with one line, before uvicorn starts
    check_job_types(load_job_modules(config.job_modules), config)
    configure_logging("api")
    server_config = uvicorn.Config(
        "services.api.app:app_from_environment",
        factory=True,
        host=host or config.api_host,
        port=config.api_port if port is None else port,
        workers=workers,
        log_config=None,
        access_log=access_log,
        timeout_graceful_shutdown=max(1, math.ceil(config.shutdown_grace)),
        server_header=False,
    )
    if workers > 1:
        Multiprocess(server_config, sockets=[server_config.bind_socket()]).run()
        return
    server = ApiServer(server_config)
    server.run()
    if not server.started:
        fail("the API did not start (see the log above)")


class ApiServer(uvicorn_server.Server):
    """uvicorn's server, ending with exit code 0 after a graceful SIGTERM / SIGINT.

    uvicorn re-raises the signal it caught once it has shut down, so the process would end
    "killed by SIGTERM"; every jobcore process exits 0 after a clean shutdown instead.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals.clear()


async def _with_db(config: Settings, action: Any) -> Any:
    # The pool logs each failed connection attempt; the one line the CLI prints says it.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    db = Database(config, min_size=0, max_size=1, name="jobcore-cli")
    await db.open(wait=True)
    try:
        return await action(db)
    finally:
        await db.close()


def _shown(key: apikeys.ApiKey) -> dict[str, Any]:
    return asdict(key)


@keys_app.command("create")
def create(
    tenant: str = typer.Option(..., help="The tenant whose jobs the key sees."),
    label: str | None = typer.Option(None, help="A note for people (where the key is used)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Create a key. It is printed once, now: only its hash is stored."""
    try:
        apikeys.check_tenant_name(tenant)
    except apikeys.InvalidTenantName as exc:
        fail(str(exc), code=2)
    created = run(_with_db(settings(), lambda db: apikeys.create_key(db, tenant, label)))
    shown = {"key": created.key, **_shown(created.record)}
    if as_json:
        emit(shown, as_json=True)
        return
    emit(shown, as_json=False)
    typer.echo("\nStore the key now: it cannot be shown again.", err=True)


@keys_app.command("list")
def list_(
    tenant: str | None = typer.Option(None, help="Only this tenant's keys."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Every key's id, tenant, prefix and state (never the key itself)."""
    keys = run(_with_db(settings(), lambda db: apikeys.list_keys(db, tenant)))
    emit(
        [_shown(k) for k in keys],
        as_json=as_json,
        columns=["id", "tenant", "prefix", "label", "created_at", "revoked_at"],
    )


@keys_app.command("revoke")
def revoke(
    key_id: str = typer.Argument(..., metavar="ID", help="The key's id (from `keys list`)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Revoke a key; requests with it are refused from now on."""
    try:
        ident = uuid.UUID(key_id)
    except ValueError:
        fail(f"{key_id!r} is not a key id (a UUID from `jobcore keys list`)", code=2)
    revoked = run(_with_db(settings(), lambda db: apikeys.revoke_key(db, ident)))
    if as_json:
        emit(_shown(revoked), as_json=True)
    else:
        typer.echo(f"revoked key {revoked.id} ({revoked.prefix}…) of tenant {revoked.tenant}")


def register(app: typer.Typer) -> None:
    """Add this service's commands to the `jobcore` program."""
    app.command("api")(api)
    app.add_typer(keys_app)
