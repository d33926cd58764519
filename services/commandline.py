"""What every `jobcore` command shares, the CLI's (:mod:`services.cli`) and the bench's
(:mod:`services.bench`): the settings, and a failure as one line on stderr with a non-zero
exit. Below both, so neither imports the other (import rules in pyproject.toml)."""

from __future__ import annotations

from typing import NoReturn

import typer

from jobcore.settings import Settings, load_settings


def settings() -> Settings:
    return load_settings()


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"jobcore: {message}", err=True)
    raise typer.Exit(code)
