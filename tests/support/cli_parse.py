"""Parse a `jobcore ...` command line as the program would, invoking nothing.

For the tests that check command lines written down elsewhere (the deploy files, the help's
examples, the docs): a renamed command or option, a missing argument or a bad value fails
there, not in the hands of whoever copies the line.
"""

from __future__ import annotations

from typing import Any

import typer

from services.entry import app


def _unparsed(ctx: Any) -> list[str]:
    # A group keeps the subcommand name apart from its arguments; typer's vendored click
    # names the field `_protected_args` (click 8.2's public `protected_args` warns, and
    # warnings are errors here).
    protected = getattr(ctx, "_protected_args", None)
    if protected is None:
        protected = ctx.protected_args
    return [*protected, *ctx.args]


def parse_jobcore(args: tuple[str, ...], *, allow_group: bool = False) -> list[str]:
    """Parse ``jobcore ARGS`` as the program would, invoking nothing; return the command path.

    Mirrors typer's own group invocation (TyperGroup.invoke): unknown commands, unknown
    options, bad values and missing arguments raise a UsageError. ``allow_group`` accepts
    a group named without a subcommand (prose mentions `jobcore dlq`).
    """
    command: Any = typer.main.get_command(app)
    ctx = command.make_context("jobcore", list(args), resilient_parsing=False)
    path: list[str] = []
    rest = _unparsed(ctx)
    while isinstance(command, typer.core.TyperGroup):
        if not rest and allow_group and path:
            break
        assert rest, f"`jobcore {' '.join(path)}` needs a subcommand"
        name, command, rest = command.resolve_command(ctx, rest)
        assert name is not None  # an unknown name raised a UsageError
        path.append(name)
        ctx = command.make_context(name, rest, parent=ctx, resilient_parsing=False)
        rest = _unparsed(ctx)
    return path
