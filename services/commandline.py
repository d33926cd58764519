"""What every `jobcore` command shares, the CLI's (:mod:`services.cli`) and the bench's
(:mod:`services.bench`): the settings, and a failure as one line on stderr with a non-zero
exit, and the one example every command's help ends with. Below both, so neither imports the
other (import rules in pyproject.toml)."""

from __future__ import annotations

from typing import NoReturn

import typer

from jobcore.kernel.settings import Settings, load_settings


def settings() -> Settings:
    return load_settings()


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"jobcore: {message}", err=True)
    raise typer.Exit(code)


EXAMPLE_LABEL = "Example:"


def example(command_line: str) -> str:
    """The epilog of a command's ``--help``: one command line that runs it, the same way for
    every command and group (``epilog=example("jobcore ...")``).

    tests/unit/test_cli_examples.py parses each one against its command. Only 127.0.0.1
    addresses and no real secrets. typer renders an epilog as rich markup, where ``[...]``
    would vanish, so an example has no square brackets."""
    if not command_line.startswith("jobcore") or "[" in command_line or "\n" in command_line:
        raise ValueError(f"an example is one `jobcore ...` line without [ ]: {command_line!r}")
    return f"{EXAMPLE_LABEL} {command_line}"
