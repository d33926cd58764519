"""`jobcore migrate`."""

from __future__ import annotations

import typer

from jobcore import migrate as migrations
from services.cli.common import settings


def migrate(
    create_database: bool = typer.Option(
        False, "--create-database", help="Create the configured database if it is missing."
    ),
    revision: str = typer.Option("head", help="Alembic revision to migrate to."),
) -> None:
    """Bring the database schema to the latest revision (a no-op when it is there)."""
    config = settings()
    if create_database and migrations.create_database(config):
        typer.echo(f"created database {config.database_name}")
    before, after = migrations.upgrade(config, revision)
    if before == after:
        typer.echo(f"database {config.database_name} is at {after}; nothing to do")
    else:
        typer.echo(f"database {config.database_name} migrated from {before or 'empty'} to {after}")


def register(app: typer.Typer) -> None:
    app.command("migrate")(migrate)
