"""The long-running processes: `jobcore api`, `jobcore relay` and `jobcore worker`.

Each command reads the settings (a bad one stops it with one line), configures logging
and tracing, and hands over to its service until SIGTERM.
"""

from __future__ import annotations

import contextlib
import math
import socket
import sys
from collections.abc import Iterator

import typer
import uvicorn
from uvicorn import server as uvicorn_server
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess
from uvicorn.supervisors.multiprocess import Process

from jobcore.database.schema_version import check_schema
from jobcore.execution.preflight import check_job_types
from jobcore.execution.registry import load_job_modules
from jobcore.kernel.errors import JobcoreError
from jobcore.kernel.settings import load_relay_options
from jobcore.telemetry.logs import configure_logging
from jobcore.telemetry.traces import setup_tracing
from services.cli.common import example, fail, run, settings


def api(
    host: str | None = typer.Option(None, help="Listen address [default: JOBCORE_API_HOST]."),
    port: int | None = typer.Option(
        None, min=0, max=65535, help="Port; 0 picks a free one [default: JOBCORE_API_PORT]."
    ),
    workers: int = typer.Option(1, min=1, max=64, help="Server processes sharing the port."),
    access_log: bool = typer.Option(
        False, "--access-log/--no-access-log", help="Log every request (costs throughput)."
    ),
    ui: bool = typer.Option(
        False, "--ui/--no-ui", help="Also serve the operators' console at /ui (one process)."
    ),
) -> None:
    """Serve the enqueue and status API with uvicorn until SIGTERM."""
    config = settings()  # a bad setting stops here, with one line, before uvicorn starts
    if ui and workers > 1:
        fail("--ui runs in one process (its sign-ins live in memory): drop --workers")
    check_job_types(load_job_modules(config.job_modules), config)
    # Checked now if the database answers, else by the API's pool on its first connection:
    # the API also starts while it is down.
    check_schema(config, unreachable_ok=True)
    configure_logging("api", config.log_level)
    server_config = uvicorn.Config(
        "services.cli.ui:api_with_console_from_environment"
        if ui
        else "services.api.app:app_from_environment",
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
        supervisor = ApiSupervisor(server_config, sockets=[server_config.bind_socket()])
        supervisor.run()
        if supervisor.a_process_failed_to_start():
            # The database answers by now: the check names the schema a process refused.
            check_schema(config)
            fail("the API did not start (see the log above)")
        return
    server = ApiServer(server_config)
    server.run()
    refusal = server.schema_refusal()
    if refusal is not None:
        raise refusal  # the schema it must not run against, found once the database answered
    if not server.started:
        fail("the API did not start (see the log above)")


class ApiServer(uvicorn_server.Server):
    """uvicorn's server, ending with exit code 0 after a graceful SIGTERM / SIGINT.

    uvicorn re-raises the signal it caught once it has shut down, so the process would end
    "killed by SIGTERM"; every jobcore process exits 0 after a clean shutdown instead.
    """

    def schema_refusal(self) -> JobcoreError | None:
        # Imported here: the web stack would slow every other command's start.
        from services.api.app import schema_refusal

        return schema_refusal(getattr(self.config, "loaded_app", None))

    async def on_tick(self, counter: int) -> bool:
        """Stop, as after SIGTERM, once the API's pool refused the schema (the database was
        down when `jobcore api` started, so the start-up check had to wait for it)."""
        if self.schema_refusal() is not None:
            return True
        return await super().on_tick(counter)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals.clear()


class ApiProcess(Process):
    """One of `jobcore api --workers N`'s processes: it runs :class:`ApiServer` and ends
    with uvicorn's STARTUP_FAILURE code once its pool refused the schema, so the supervisor
    stops every process instead of starting that one again, and again."""

    @property
    def server(self) -> uvicorn_server.Server:
        if self._server is None:
            self._server = ApiServer(config=self.config)
        return self._server

    def target(self, sockets: list[socket.socket] | None = None) -> None:
        super().target(sockets)
        server = self.server
        if isinstance(server, ApiServer) and server.schema_refusal() is not None:
            sys.exit(STARTUP_FAILURE)


class ApiSupervisor(Multiprocess):
    """uvicorn's supervisor of `jobcore api --workers N`, starting :class:`ApiProcess`es.

    A process it starts later, to replace one that died, is uvicorn's own: the others still
    stop the whole API on a refused schema."""

    def init_processes(self) -> None:
        for _ in range(self.processes_num):
            process = ApiProcess(self.config, self.sockets)
            process.start()
            self.processes.append(process)

    def a_process_failed_to_start(self) -> bool:
        return any(process.exitcode == STARTUP_FAILURE for process in self.processes)


def relay(
    listen: bool = typer.Option(
        True,
        "--listen/--no-listen",
        help="Wake on NOTIFY (default) or find work by polling alone.",
    ),
) -> None:
    """Publish outbox rows to RabbitMQ with publisher confirms until SIGTERM."""
    # Imported here: the health server's web stack would slow every other command's start.
    from services.relay.relay import serve

    config = settings()
    options = load_relay_options(**({} if listen else {"listen": False}))
    check_schema(config, unreachable_ok=True)
    configure_logging("relay", config.log_level)
    setup_tracing("jobcore-relay")
    raise typer.Exit(run(serve(config, options)))


QUEUE_OPTION = typer.Option(
    None,
    "--queue",
    "-q",
    help="A job queue to consume (repeatable) (default: every queue of the job types).",
)


def worker(
    queue: list[str] | None = QUEUE_OPTION,
    concurrency: int | None = typer.Option(
        None, min=1, max=10_000, help="Handlers at once (default: JOBCORE_WORKER_CONCURRENCY)."
    ),
) -> None:
    """Consume job queues and run handlers until SIGTERM (then finish or give back work)."""
    from services.worker.app import Worker

    config = settings()  # a bad setting stops here with one line
    check_schema(config, unreachable_ok=True)
    configure_logging("worker", config.log_level)
    setup_tracing("jobcore-worker")
    app = Worker(config, queues=queue or None, concurrency=concurrency)
    raise typer.Exit(run(app.serve()))


def register(app: typer.Typer) -> None:
    app.command("api", epilog=example("jobcore api --host 127.0.0.1 --port 8000 --workers 2"))(api)
    app.command("relay", epilog=example("jobcore relay --no-listen"))(relay)
    app.command("worker", epilog=example("jobcore worker --queue exports --concurrency 32"))(worker)
