"""`jobcore keys create|list|revoke|rotate`: API keys (one tenant per key, with scopes)."""

from __future__ import annotations

import re
import uuid
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any

import typer

from jobcore.access import apikeys
from jobcore.kernel.scopes import DEFAULT_SCOPES, Scope
from jobcore.usecases import keys as key_usecases
from services.cli.common import JSON_OPTION, actor, emit, example, fail, run, settings, with_db

keys_app = typer.Typer(
    name="keys",
    help="Create, list, revoke and rotate API keys (one tenant per key, with scopes).",
    no_args_is_help=True,
    epilog=example("jobcore keys create --tenant acme --label billing"),
)

LIST_COLUMNS = (
    "id",
    "tenant",
    "prefix",
    "label",
    "scopes",
    "state",
    "created_at",
    "expires_at",
    "last_used_at",
    "rotated_from",
)
_DURATION_PART = re.compile(r"(\d+)([wdhms])")
_DURATION = re.compile(r"^(\d+[wdhms])+$")
_UNITS = {"w": "weeks", "d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


def parse_duration(text: str, option: str) -> timedelta:
    """``90d``, ``24h``, ``1h30m``, ``2w``: whole numbers of weeks, days, hours, minutes,
    seconds (a one-line failure, exit 2, otherwise)."""
    compact = text.strip().lower()
    if not _DURATION.match(compact):
        fail(f"{option} takes a duration such as 90d, 24h or 1h30m, not {text!r}", code=2)
    total = timedelta()
    for amount, unit in _DURATION_PART.findall(compact):
        try:
            total += timedelta(**{_UNITS[unit]: int(amount)})
        except OverflowError:
            fail(f"{option}: {text!r} is too long", code=2)
    return total


def parse_time(text: str, option: str) -> datetime:
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        fail(f"{option} takes a time such as 2027-01-31T00:00:00+00:00, not {text!r}", code=2)
    if when.tzinfo is None:
        fail(f"{option} needs a time zone offset (e.g. +00:00 or Z): {text!r}", code=2)
    return when


def parse_key_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError:
        fail(f"{text!r} is not a key id (a UUID from `jobcore keys list`)", code=2)


def _shown(key: apikeys.ApiKey) -> dict[str, Any]:
    shown = asdict(key)
    shown["scopes"] = ",".join(key.scopes)
    return shown


@keys_app.command(
    "create",
    epilog=example(
        "jobcore keys create --tenant acme --label billing --scope enqueue --expires-in 90d"
    ),
)
def create(
    tenant: str = typer.Option(..., help="The tenant whose jobs the key sees."),
    label: str | None = typer.Option(None, help="A note for people (where the key is used)."),
    scope: list[Scope] = typer.Option(
        list(DEFAULT_SCOPES),
        "--scope",
        help="What the key may do; repeat for several. Admin (the /admin routes, every "
        "tenant) only when named.",
    ),
    expires_in: str | None = typer.Option(
        None, help="Refuse the key after this long (90d, 24h, 1h30m)."
    ),
    expires_at: str | None = typer.Option(
        None, help="Refuse the key from this time on (RFC 3339 with an offset)."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Create a key. It is printed once, now: only its hash is stored."""
    try:
        apikeys.check_tenant_name(tenant)
    except apikeys.InvalidTenantName as exc:
        fail(str(exc), code=2)
    if expires_in is not None and expires_at is not None:
        fail("give --expires-in or --expires-at, not both", code=2)
    lifetime = parse_duration(expires_in, "--expires-in") if expires_in is not None else None
    until = parse_time(expires_at, "--expires-at") if expires_at is not None else None
    created = run(
        with_db(
            settings(),
            lambda db: key_usecases.create_key(
                db,
                tenant,
                label,
                scopes=scope,
                expires_at=until,
                expires_in=lifetime,
                actor=actor(),
            ),
        )
    )
    _show_created(created, as_json)


def _show_created(created: apikeys.CreatedKey, as_json: bool) -> None:
    shown = {"key": created.key, **_shown(created.record)}
    emit(shown, as_json=as_json)
    if not as_json:
        typer.echo("\nStore the key now: it cannot be shown again.", err=True)


@keys_app.command("list", epilog=example("jobcore keys list --tenant acme"))
def list_(
    tenant: str | None = typer.Option(None, help="Only this tenant's keys."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Every key's id, tenant, scopes, state, expiry and last use (never the key itself).

    Last use is recorded at most once a minute per key."""
    keys = run(with_db(settings(), lambda db: key_usecases.list_keys(db, tenant)))
    emit([_shown(k) for k in keys], as_json=as_json, columns=LIST_COLUMNS)


@keys_app.command(
    "revoke", epilog=example("jobcore keys revoke 5f0c9a8e-2b7d-4c1e-8a3f-6d2e1b0c9a74")
)
def revoke(
    key_id: str = typer.Argument(..., metavar="ID", help="The key's id (from `keys list`)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Revoke a key; requests with it are refused from now on."""
    ident = parse_key_id(key_id)
    revoked = run(with_db(settings(), lambda db: key_usecases.revoke_key(db, ident, actor=actor())))
    if as_json:
        emit(_shown(revoked), as_json=True)
    else:
        typer.echo(f"revoked key {revoked.id} ({revoked.prefix}…) of tenant {revoked.tenant}")


@keys_app.command(
    "rotate",
    epilog=example("jobcore keys rotate 5f0c9a8e-2b7d-4c1e-8a3f-6d2e1b0c9a74 --overlap 24h"),
)
def rotate(
    key_id: str = typer.Argument(..., metavar="ID", help="The key's id (from `keys list`)."),
    overlap: str = typer.Option(
        "24h", help="How long the old key keeps working (0s: it stops now)."
    ),
    expires_in: str | None = typer.Option(
        None, help="The new key's lifetime (default: the old key's, or none)."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """A new key with the same tenant, scopes and label; the old one expires after the
    overlap. Printed once, now. A key whose successor is still in its overlap is refused."""
    ident = parse_key_id(key_id)
    within = parse_duration(overlap, "--overlap")
    lifetime = parse_duration(expires_in, "--expires-in") if expires_in is not None else None
    created, old = run(
        with_db(
            settings(),
            lambda db: key_usecases.rotate_key(
                db, ident, overlap=within, expires_in=lifetime, actor=actor()
            ),
        )
    )
    _show_created(created, as_json)
    if not as_json:
        typer.echo(f"The old key {old.id} works until {old.expires_at}.", err=True)


def register(app: typer.Typer) -> None:
    app.add_typer(keys_app)
