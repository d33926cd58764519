"""`jobcore audit [--since DURATION|TIME] [--actor A] [--action X] [--tenant T] [--limit N]
[--json]`: the audit log of admin actions, newest first."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import typer

from jobcore.access.audit import AuditAction
from jobcore.usecases.audit import AuditFilter, list_audit_entries
from services.cli.common import JSON_OPTION, emit, example, fail, run, settings, with_db

COLUMNS = ("at", "actor", "action", "target", "tenant", "outcome", "details")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_SHORT_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw]?)$")
_ISO_DURATION = re.compile(
    r"^P(?:(\d+)W)?(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$"
)


def parse_since(value: str, now: datetime) -> datetime:
    """A duration back from ``now`` (90, 30m, 12h, 7d, 2w, PT1H, P7D) or a time
    (ISO 8601; without an offset it is UTC)."""
    text = value.strip()
    if short := _SHORT_DURATION.match(text):
        return now - timedelta(seconds=float(short[1]) * _UNITS[short[2] or "s"])
    iso = _ISO_DURATION.match(text.upper())
    if iso and text.upper() not in ("P", "PT") and any(iso.groups()):
        weeks, days, hours, minutes, seconds = (float(g or 0) for g in iso.groups())
        return now - timedelta(
            weeks=weeks, days=days, hours=hours, minutes=minutes, seconds=seconds
        )
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"--since: {value!r} is neither a duration (90, 30m, 12h, 7d, PT1H) "
            "nor a time (2026-12-01T10:00:00Z)"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _printable(text: str) -> str:
    """Control characters shown escaped: a value an operator typed cannot rewrite the
    terminal or fake a line of the table."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _row(entry: dict[str, Any]) -> dict[str, Any]:
    target = entry["target_type"]
    if entry["target_id"] is not None:
        target = f"{target}:{entry['target_id']}"
    shown = {
        "at": entry["at"].astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ"),
        "actor": entry["actor"],
        "action": entry["action"],
        "target": target,
        "tenant": entry["tenant"],
        "outcome": entry["outcome"],
        "details": orjson.dumps(entry["details"]).decode() if entry["details"] else None,
    }
    return {k: None if v is None else _printable(str(v)) for k, v in shown.items()}


def audit(
    since: str | None = typer.Option(
        None, "--since", help="Only entries this recent: a duration (30m, 12h, 7d) or a time."
    ),
    by: str | None = typer.Option(None, "--actor", help="Only this actor's entries."),
    action: AuditAction | None = typer.Option(None, "--action", help="Only this action."),
    tenant: str | None = typer.Option(None, "--tenant", help="Only entries about this tenant."),
    limit: int = typer.Option(100, min=1, max=100_000, help="At most this many, newest first."),
    as_json: bool = JSON_OPTION,
) -> None:
    """The audit log of admin actions, newest first: who did what, when, and the outcome."""
    try:
        start = parse_since(since, datetime.now(UTC)) if since is not None else None
    except ValueError as exc:
        fail(str(exc), code=2)
    where = AuditFilter(since=start, actor=by, action=action, tenant=tenant)
    entries = run(with_db(settings(), lambda db: list_audit_entries(db, where, limit=limit)))
    if as_json:
        emit(entries, as_json=True)
        return
    emit([_row(e) for e in entries], as_json=False, columns=COLUMNS)


def register(app: typer.Typer) -> None:
    app.command(
        "audit", epilog=example("jobcore audit --since 7d --action key.rotate --tenant acme")
    )(audit)
