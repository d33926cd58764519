"""The `jobcore` command line: the composition root of every process.

Every command lives in this package, one module per verb or verb group, each adding its
commands through a ``register(app)`` function, so this module stays a list. Every command and
group ends its ``--help`` with one example (``epilog=example("jobcore ...")``), which
tests/unit/test_cli_examples.py parses. Their shared plumbing (settings, a database for one
command, ``--json``, one-line failures) is :mod:`services.cli.common`. A jobcore error ends
the program with one line on stderr and exit 1; bad arguments exit 2 (typer's usage errors).
The program itself, these commands and `jobcore bench` in one app, is :mod:`services.entry`
(the bench is not imported here).
"""

from __future__ import annotations

import importlib
import sys

import typer

try:  # typer >= 0.22 vendors click; older releases use the click package
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

from jobcore.kernel.errors import JobcoreError
from services.cli.common import example, set_actor

# In the order `jobcore --help` lists them. Imported by name when the app is built, so that
# a process that serves (`jobcore api`, `relay`, `worker`) imports its own command's module
# and not every other command's (the API's web stack, the console, chaos): each start of a
# replica pays for what it imports.
COMMAND_MODULES = (
    "database",
    "topology",
    "serve",
    "openapi",
    "keys",
    "tenants",
    "outbox",
    "dlq",
    "webhooks",
    "jobs",
    "batches",
    "workflows",
    "prune",
    "schedules",
    "flow",
    "audit",
    "dev",
    "demo",
    "chaos",
    "ui",
)
# The commands that run a service, all in the module `serve`.
SERVING_COMMANDS = frozenset({"api", "relay", "worker"})


def build_app(modules: tuple[str, ...] = COMMAND_MODULES) -> typer.Typer:
    """A `jobcore` app with the commands of ``modules`` of this package (every one by
    default; services.entry adds the bench)."""
    app = typer.Typer(
        name="jobcore",
        help="User-visible background jobs: API, outbox relay, workers and their tools.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        epilog=example("jobcore --actor ops:alice jobs retry 0b6f3c2e-5d1c-4a43-9a55-0f1d2e3c4b5a"),
    )
    app.callback()(_root)
    for name in modules:
        importlib.import_module(f"services.cli.{name}").register(app)
    return app


def _root(
    actor: str | None = typer.Option(
        None,
        "--actor",
        help="Who the audit log names for admin actions "
        "(default: JOBCORE_ACTOR, else cli:<os user>@<host>).",
    ),
) -> None:
    """User-visible background jobs: API, outbox relay, workers and their tools."""
    set_actor(actor)


def run_program(app: typer.Typer, argv: list[str] | None = None) -> None:
    """Run ``app`` as the `jobcore` program: one line and an exit code for each failure."""
    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name="jobcore", standalone_mode=False)
    except click_exceptions.NoArgsIsHelpError as exc:
        typer.echo(exc.ctx.get_help() if exc.ctx else str(exc))
        sys.exit(2)
    except click_exceptions.UsageError as exc:
        hint = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
        typer.echo(f"jobcore: {exc.format_message()}{hint}", err=True)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(130)
    except JobcoreError as exc:
        typer.echo(f"jobcore: {exc}", err=True)
        sys.exit(1)
    sys.exit(result if isinstance(result, int) else 0)
