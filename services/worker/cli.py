"""Commands of the worker service."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add this service's commands to the `jobcore` program."""
