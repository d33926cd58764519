"""`jobcore prune [--dry-run] [--json]`: retention by hand.

The same pass as the workers' pruner (jobcore.maintenance.retention), under the same ``pruner``
maintenance lease, so it never runs beside one: while a worker's pruner holds the lease it
is refused with one line (that pruner does the work every ``JOBCORE_PRUNER_INTERVAL``).
``--dry-run`` takes no lease and changes nothing: it counts what a pass would delete now.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import typer

from jobcore.database.gateway import Database
from jobcore.usecases.prune import prune as prune_usecase
from services.cli.common import actor, emit, example, run, settings, with_db


def _duration(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


def prune(
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Count what would be pruned now; change nothing."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Delete finished jobs, inbox rows, result files and audit entries past their
    retention, now."""
    config = settings()

    owner = f"jobcore-prune:{socket.gethostname()}:{os.getpid()}"

    async def action(database: Database) -> dict[str, Any]:
        pruned = await prune_usecase(database, config, owner=owner, dry_run=dry_run, actor=actor())
        return pruned.as_dict()

    report = run(with_db(config, action, name="jobcore-prune"))
    if as_json:
        emit(report, as_json=True)
        return
    verb = "to prune (dry run)" if dry_run else "pruned"
    typer.echo(f"finished jobs {verb}, by status and type:")
    emit(
        [
            {
                "status": kind["status"],
                "type": kind["type"],
                "retention": _duration(kind["retention_seconds"]),
                "oldest": _duration(kind["oldest_age_seconds"]),
                "jobs": kind["jobs"],
            }
            for kind in report["jobs"]
        ],
        as_json=False,
        columns=("status", "type", "retention", "oldest", "jobs"),
    )
    typer.echo(f"\nrows {verb}, by table:")
    emit(
        [{"table": table, "rows": rows} for table, rows in report["tables"].items()],
        as_json=False,
        columns=("table", "rows"),
    )


def register(app: typer.Typer) -> None:
    app.command("prune", epilog=example("jobcore prune --dry-run"))(prune)
