"""`jobcore keys create|list|revoke`: API keys (one tenant per key)."""

from __future__ import annotations

import uuid
from dataclasses import asdict
from typing import Any

import typer

from jobcore import apikeys
from jobcore.usecases import keys as key_usecases
from services.cli.common import JSON_OPTION, actor, emit, fail, run, settings, with_db

keys_app = typer.Typer(
    name="keys",
    help="Create, list and revoke API keys (one tenant per key).",
    no_args_is_help=True,
)


def _shown(key: apikeys.ApiKey) -> dict[str, Any]:
    return asdict(key)


@keys_app.command("create")
def create(
    tenant: str = typer.Option(..., help="The tenant whose jobs the key sees."),
    label: str | None = typer.Option(None, help="A note for people (where the key is used)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Create a key. It is printed once, now: only its hash is stored."""
    try:
        apikeys.check_tenant_name(tenant)
    except apikeys.InvalidTenantName as exc:
        fail(str(exc), code=2)
    created = run(
        with_db(settings(), lambda db: key_usecases.create_key(db, tenant, label, actor=actor()))
    )
    shown = {"key": created.key, **_shown(created.record)}
    if as_json:
        emit(shown, as_json=True)
        return
    emit(shown, as_json=False)
    typer.echo("\nStore the key now: it cannot be shown again.", err=True)


@keys_app.command("list")
def list_(
    tenant: str | None = typer.Option(None, help="Only this tenant's keys."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Every key's id, tenant, prefix and state (never the key itself)."""
    keys = run(with_db(settings(), lambda db: key_usecases.list_keys(db, tenant)))
    emit(
        [_shown(k) for k in keys],
        as_json=as_json,
        columns=["id", "tenant", "prefix", "label", "created_at", "revoked_at"],
    )


@keys_app.command("revoke")
def revoke(
    key_id: str = typer.Argument(..., metavar="ID", help="The key's id (from `keys list`)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Revoke a key; requests with it are refused from now on."""
    try:
        ident = uuid.UUID(key_id)
    except ValueError:
        fail(f"{key_id!r} is not a key id (a UUID from `jobcore keys list`)", code=2)
    revoked = run(with_db(settings(), lambda db: key_usecases.revoke_key(db, ident, actor=actor())))
    if as_json:
        emit(_shown(revoked), as_json=True)
    else:
        typer.echo(f"revoked key {revoked.id} ({revoked.prefix}…) of tenant {revoked.tenant}")


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app)
