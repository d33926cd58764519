"""`jobcore tenants set-quota|show|list`: per-tenant quotas (jobcore.kernel.quotas).

Values: a rate is ``N/s``, ``N/min`` or ``N/h`` (``N`` alone is per second), a burst or a
cap a whole number; ``unlimited`` is 0 (no limit) and ``default`` drops the tenant's
override so the deployment's default (JOBCORE_QUOTA_*) applies again.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

import typer

from jobcore.access import apikeys
from jobcore.kernel.errors import JobcoreError
from jobcore.usecases import quotas as quota_usecases
from jobcore.usecases.quotas import KEEP, check_quota
from services.cli.common import JSON_OPTION, emit, example, fail, run, settings, with_db

tenants_app = typer.Typer(
    name="tenants",
    help="Per-tenant quotas: enqueue rate, unfinished jobs, long-polls.",
    no_args_is_help=True,
    epilog=example("jobcore tenants show acme"),
)

DEFAULT = "default"
UNLIMITED = "unlimited"
_PER = {"s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"(?P<n>\d+(?:\.\d+)?|\.\d+)(?:\s*/\s*(?P<per>[a-z]+))?")
_COUNT = re.compile(r"\d+")


class InvalidValue(JobcoreError):
    """Not a value this option takes."""


def parse_rate(text: str) -> float | None:
    """Requests per second from ``N/s``, ``N/min``, ``N/h`` or ``N``; 0 for ``unlimited``;
    None for ``default``."""
    value = text.strip().lower()
    if value == DEFAULT:
        return None
    if value == UNLIMITED:
        return 0.0
    match = _RATE.fullmatch(value)
    if match is None or (match["per"] is not None and match["per"] not in _PER):
        raise InvalidValue(
            f"--enqueue-rate takes N/s, N/min or N/h, {UNLIMITED} or {DEFAULT}, not {text!r}"
        )
    rate = float(match["n"]) / _PER[match["per"] or "s"]
    if not math.isfinite(rate):
        raise InvalidValue(f"--enqueue-rate {text!r} is not a finite rate")
    return rate


def parse_count(option: str, text: str) -> int | None:
    """A whole number; 0 for ``unlimited``; None for ``default``."""
    value = text.strip().lower()
    if value == DEFAULT:
        return None
    if value == UNLIMITED:
        return 0
    if _COUNT.fullmatch(value) is None:
        raise InvalidValue(f"{option} takes a whole number, {UNLIMITED} or {DEFAULT}, not {text!r}")
    return int(value)


def format_rate(rate: float) -> str:
    # Positional, never an exponent (which parse_rate does not take).
    return UNLIMITED if rate == 0 else f"{Decimal(repr(rate)).normalize():f}/s"


def format_count(value: int) -> str:
    return UNLIMITED if value == 0 else str(value)


def _option(text: str | None, parse: Any) -> Any:
    return KEEP if text is None else parse(text)


@tenants_app.command(
    "set-quota",
    epilog=example("jobcore tenants set-quota acme --enqueue-rate 50/s --max-unfinished 20000"),
)
def set_quota(
    tenant: str = typer.Argument(..., help="The tenant (as in `jobcore keys create`)."),
    enqueue_rate: str | None = typer.Option(
        None, help="Sustained enqueues: N/s, N/min, N/h; unlimited; default."
    ),
    enqueue_burst: str | None = typer.Option(
        None, help="Enqueues admitted at once after a quiet spell (at least 1); default."
    ),
    max_unfinished: str | None = typer.Option(
        None, help="Jobs not yet succeeded, failed or cancelled; unlimited; default."
    ),
    max_long_polls: str | None = typer.Option(
        None, help="GET ?wait= parked at once per API process; unlimited; default."
    ),
) -> None:
    """Override some of a tenant's quotas; the others keep their value. Every API process
    applies them from its next request."""
    try:
        apikeys.check_tenant_name(tenant)
        values = {
            "enqueue_rate": _option(enqueue_rate, parse_rate),
            "enqueue_burst": _option(enqueue_burst, lambda t: parse_count("--enqueue-burst", t)),
            "max_unfinished": _option(max_unfinished, lambda t: parse_count("--max-unfinished", t)),
            "max_long_polls": _option(max_long_polls, lambda t: parse_count("--max-long-polls", t)),
        }
        for name, value in values.items():
            if value is not KEEP:
                check_quota(name, value)
    except JobcoreError as exc:
        fail(str(exc), code=2)
    if all(value is KEEP for value in values.values()):
        fail("name at least one quota to set (see --help)", code=2)
    config = settings()
    run(with_db(config, lambda db: quota_usecases.set_quotas(db, tenant, **values)))
    shown = run(
        with_db(config, lambda db: quota_usecases.show_quotas(db, tenant, config.quota_defaults))
    )
    emit(_shown(shown), as_json=False)


def _source(row: dict[str, Any], name: str) -> str:
    return "override" if row[f"{name}_set"] else "default"


def _shown(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "tenant": row["tenant"],
        "enqueue_rate": f"{format_rate(row['enqueue_rate'])} ({_source(row, 'enqueue_rate')})",
        "enqueue_burst": f"{row['enqueue_burst']} ({_source(row, 'enqueue_burst')})",
        "max_unfinished": (
            f"{format_count(row['max_unfinished'])} ({_source(row, 'max_unfinished')})"
        ),
        "max_long_polls": (
            f"{format_count(row['max_long_polls'])} ({_source(row, 'max_long_polls')})"
        ),
        "unfinished": row["unfinished"],
        "last_refusal": row["last_refusal"],
        "last_refused_at": row["last_refused_at"],
    }


@tenants_app.command("show", epilog=example("jobcore tenants show acme --json"))
def show(
    tenant: str = typer.Argument(..., help="The tenant."),
    as_json: bool = JSON_OPTION,
) -> None:
    """A tenant's quotas (its override or the default), its unfinished jobs and its last
    refusal."""
    try:
        apikeys.check_tenant_name(tenant)
    except apikeys.InvalidTenantName as exc:
        fail(str(exc), code=2)
    config = settings()
    row = run(
        with_db(config, lambda db: quota_usecases.show_quotas(db, tenant, config.quota_defaults))
    )
    emit(row if as_json else _shown(row), as_json=as_json)


@tenants_app.command("list", epilog=example("jobcore tenants list"))
def list_(as_json: bool = JSON_OPTION) -> None:
    """Tenants with an override or a job: their overrides (empty: the default) and their
    unfinished jobs."""
    config = settings()
    rows = run(with_db(config, lambda db: quota_usecases.list_quotas(db, config.quota_defaults)))
    emit(
        rows,
        as_json=as_json,
        columns=[
            "tenant",
            "enqueue_rate",
            "enqueue_burst",
            "max_unfinished",
            "max_long_polls",
            "unfinished",
            "updated_at",
        ],
    )


def register(app: typer.Typer) -> None:
    app.add_typer(tenants_app)
