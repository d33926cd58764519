"""The `jobcore` program (``[project.scripts]`` in pyproject.toml, and ``python -m
services``): the CLI's commands (:mod:`services.cli`) and `jobcore bench`
(:mod:`services.bench`) in one typer app.

The one module that imports both: the bench does not import the CLI, nor the CLI the bench
(import rules in pyproject.toml); what their commands share is :mod:`services.commandline`.
A command that runs a service (`jobcore api`, `relay`, `worker`) is parsed by an app of
that command's module alone: a replica's start does not import the other commands.
"""

from __future__ import annotations

import functools
import sys

import typer

from services.cli import SERVING_COMMANDS, build_app, run_program


@functools.cache
def full_app() -> typer.Typer:
    """Every command: the CLI's and the bench's."""
    from services.bench.cli import register as register_bench

    app = build_app()
    register_bench(app)
    return app


def __getattr__(name: str) -> typer.Typer:
    # `services.entry.app`, built when first read (the docs and the CLI tests read it).
    if name == "app":
        return full_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in SERVING_COMMANDS:
        run_program(build_app(("serve",)), argv)
    run_program(full_app(), argv)
