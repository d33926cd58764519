"""`jobcore migrate`."""

from __future__ import annotations

import typer

from jobcore.database import migrate as migrations
from jobcore.database import schema_version
from services.cli.common import example, fail, settings


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
    # A schema a newer jobcore migrated (a rollback, or a migrate Job of the old image):
    # Alembic would fail on a revision it does not ship.
    newer = schema_version.newer_schema(config)
    if newer is not None:
        revision, marker, refusal = newer
        if refusal is not None:
            fail(refusal)
        release = f" (jobcore {marker.release})" if marker else ""
        typer.echo(
            f"database {config.database_name} is at {revision}{release}, one release newer "
            f"than this jobcore {schema_version.own_version()}, which runs with it; nothing to do"
        )
        return
    before, after = migrations.upgrade(config, revision)
    if before == after:
        typer.echo(f"database {config.database_name} is at {after}; nothing to do")
    else:
        typer.echo(f"database {config.database_name} migrated from {before or 'empty'} to {after}")


def register(app: typer.Typer) -> None:
    app.command("migrate", epilog=example("jobcore migrate --create-database"))(migrate)
