"""The `jobcore` command line: the composition root of every process.

Every command lives in this package, one module per verb or verb group, each adding its
commands through a ``register(app)`` function, so this module stays a list; their shared
plumbing (settings, a database for one command, ``--json``, one-line failures) is
:mod:`services.cli.common`. A jobcore error ends the program with one line on stderr and exit 1;
bad arguments exit 2 (typer's usage errors).
"""

from __future__ import annotations

import importlib
import sys

import typer

try:  # typer >= 0.22 vendors click; older releases use the click package
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

from jobcore.errors import JobcoreError
from services.cli.common import set_actor

COMMAND_MODULES = (
    "services.cli.database",
    "services.cli.topology",
    "services.cli.serve",
    "services.cli.keys",
    "services.cli.tenants",
    "services.cli.outbox",
    "services.cli.dlq",
    "services.cli.webhooks",
    "services.cli.jobs",
    "services.cli.prune",
    "services.cli.schedules",
    "services.cli.flow",
    "services.cli.audit",
    "services.cli.dev",
    "services.cli.demo",
    "services.cli.chaos",
    "services.cli.ui",
)
# Commands that sit above this package (they use its plumbing): imported by name, so the
# import rules (pyproject.toml) see no upward import.
UPPER_COMMAND_MODULES = ("services.bench.cli",)

app = typer.Typer(
    name="jobcore",
    help="User-visible background jobs: API, outbox relay, workers and their tools.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
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


for _module in (*COMMAND_MODULES, *UPPER_COMMAND_MODULES):
    importlib.import_module(_module).register(app)


def main(argv: list[str] | None = None) -> None:
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
