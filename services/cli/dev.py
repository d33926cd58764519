"""`jobcore dev`: migrate, then run the API, a relay and a worker as child processes."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import Callable

import httpx
import typer

from jobcore.database import migrate
from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings, load_relay_options
from jobcore.usecases import keys as key_usecases
from services.cli.common import actor, example, settings
from services.cli.supervisor import Supervisor


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prepare_database(config: Settings) -> None:
    if migrate.create_database(config):
        typer.echo(f"created database {config.database_name}")
    before, after = migrate.upgrade(config)
    if before != after:
        typer.echo(f"migrated {config.database_name} from {before or 'empty'} to {after}")


async def create_key(config: Settings, tenant: str, label: str) -> str:
    database = Database(config, min_size=0, max_size=1, name="jobcore-dev")
    await database.open(wait=True)
    try:
        return (await key_usecases.create_key(database, tenant, label, actor=actor())).key
    finally:
        await database.close()


async def wait_until_ready(url: str, supervisor: Supervisor, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=1.0) as client:
        while True:
            dead = [
                c.name
                for c in supervisor.children
                if c.process and c.process.returncode is not None
            ]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited during start-up")
            try:
                if (await client.get(f"{url}/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the API at {url} was not ready within {timeout:.0f}s")
            await asyncio.sleep(0.1)  # the poll interval, bounded by the deadline above


def start_stack(
    config: Settings,
    *,
    api_port: int,
    relay_health_port: int,
    worker_health_port: int,
    env: dict[str, str] | None = None,
    broker_env: dict[str, str] | None = None,
) -> Supervisor:
    """A supervisor for one API, one relay and one worker (not started yet)."""
    supervisor = Supervisor(base_env={**os.environ, **(env or {})}, grace=config.shutdown_grace)
    supervisor.add("api", "api", "--port", str(api_port))
    supervisor.add(
        "relay", "relay", JOBCORE_RELAY_HEALTH_PORT=str(relay_health_port), **(broker_env or {})
    )
    supervisor.add(
        "worker", "worker", JOBCORE_WORKER_HEALTH_PORT=str(worker_health_port), **(broker_env or {})
    )
    return supervisor


def stop_event() -> tuple[asyncio.Event, Callable[[], None]]:
    """An event set by SIGINT/SIGTERM, and a function that removes the handlers."""
    loop = asyncio.get_running_loop()
    event = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, event.set)

    def remove() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)

    return event, remove


async def _dev(config: Settings, port: int, relay_health_port: int) -> int:
    key = await create_key(config, "dev", "jobcore dev")
    supervisor = start_stack(
        config,
        api_port=port,
        relay_health_port=relay_health_port,
        worker_health_port=config.worker_health_port,
    )
    stopped, remove_handlers = stop_event()
    url = f"http://127.0.0.1:{port}"
    await supervisor.start()
    try:
        await wait_until_ready(url, supervisor)
        typer.echo(
            f"\njobcore is running: {url}  (relay health :{relay_health_port}, "
            f"worker health :{config.worker_health_port})\n"
            f"development API key (tenant 'dev'): {key}\n"
            f"try:\n  curl -si -X POST {url}/jobs/send_email -H 'Authorization: Bearer {key}' "
            "-H 'Content-Type: application/json' "
            '-d \'{"to": "ada@example.com", "subject": "hello"}\'\n'
            "Ctrl-C stops everything.\n"
        )
        waiter = asyncio.create_task(supervisor.wait_any())
        signalled = asyncio.create_task(stopped.wait())
        done, _ = await asyncio.wait({waiter, signalled}, return_when=asyncio.FIRST_COMPLETED)
        code = 0 if signalled in done else 1
        if waiter in done:
            typer.echo(f"jobcore: {waiter.result().name} exited; stopping the rest", err=True)
        waiter.cancel()
        signalled.cancel()
        return code
    except RuntimeError as exc:
        typer.echo(f"jobcore: {exc}", err=True)
        return 1
    finally:
        remove_handlers()
        codes = await supervisor.stop()
        typer.echo("stopped: " + ", ".join(f"{n} exit {c}" for n, c in codes.items()))


def dev(
    port: int = typer.Option(None, help="API port (default: JOBCORE_API_PORT)."),
) -> None:
    """Migrate, then run the API, one relay and one worker with their logs interleaved."""
    config = settings()
    relay_health_port = load_relay_options().health_port
    prepare_database(config)
    sys.exit(asyncio.run(_dev(config, port or config.api_port, relay_health_port)))


def register(app: typer.Typer) -> None:
    app.command("dev", epilog=example("jobcore dev --port 8000"))(dev)
