"""The `jobcore` program (``[project.scripts]`` in pyproject.toml, and ``python -m
services``): the CLI's commands (:mod:`services.cli`) and `jobcore bench`
(:mod:`services.bench`) in one typer app.

The one module that imports both: the bench does not import the CLI, nor the CLI the bench
(import rules in pyproject.toml); what their commands share is :mod:`services.commandline`.
"""

from __future__ import annotations

from services.bench.cli import register as register_bench
from services.cli import build_app, run_program

app = build_app()
register_bench(app)


def main(argv: list[str] | None = None) -> None:
    run_program(app, argv)
