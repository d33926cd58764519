"""The plumbing every command shares: settings, the actor the audit log names, a database
for one command, the ``--json`` option, one-line failures (non-zero exit) and JSON or
table output. Settings and one-line failures come from :mod:`services.commandline`, which the
bench's command shares."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

import orjson
import typer

from jobcore.access.audit import InvalidActor, check_actor, cli_actor
from jobcore.database.gateway import Database
from jobcore.database.schema_version import check_schema_on
from jobcore.kernel.settings import Settings
from services.commandline import example, fail, settings

__all__ = [
    "JSON_OPTION",
    "actor",
    "emit",
    "example",
    "fail",
    "run",
    "set_actor",
    "settings",
    "with_db",
]

T = TypeVar("T")

JSON_OPTION = typer.Option(False, "--json", help="Print JSON instead of a table.")


# Set once per process by the root callback (`--actor`).
_given_actor: str | None = None


def set_actor(given: str | None) -> None:
    """Who this command acts as (`--actor`); bad input exits 2."""
    global _given_actor
    if given is not None:
        try:
            check_actor(given)
        except InvalidActor as exc:
            fail(f"--actor: {exc}", code=2)
    _given_actor = given


def actor() -> str:
    """Who the audit log says did this command's admin action: `--actor`, else
    JOBCORE_ACTOR, else the OS user at this host."""
    return _given_actor or settings().actor or cli_actor()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine on uvloop: the services spend much of their CPU in the
    event loop (docs/bench/measurements.md, "The event loop"). Windows has no uvloop."""
    if sys.platform == "win32":
        return asyncio.run(coro)
    import uvloop

    return uvloop.run(coro)


async def with_db(
    config: Settings, action: Callable[[Database], Awaitable[T]], *, name: str = "jobcore-cli"
) -> T:
    """Run ``action`` on a one-connection database opened for it, closed after it."""
    # The pool logs each failed connection attempt; the one line the CLI prints says it.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    db = Database(config, min_size=0, max_size=1, name=name)
    await db.open(wait=True)
    try:
        async with db.connection() as conn:
            await check_schema_on(conn)  # a schema over one release newer: one line, exit 1
        return await action(db)
    finally:
        await db.close()


def emit(
    rows: Sequence[dict[str, Any]] | dict[str, Any],
    *,
    as_json: bool,
    columns: Sequence[str] | None = None,
) -> None:
    """Print rows as JSON (for scripts) or as an aligned table (for people)."""
    if as_json:
        typer.echo(orjson.dumps(rows, default=str, option=orjson.OPT_INDENT_2).decode())
        return
    if isinstance(rows, dict):
        width = max((len(k) for k in rows), default=0)
        for key, value in rows.items():
            typer.echo(f"{key.ljust(width)}  {'' if value is None else value}")
        return
    cols = list(columns or (rows[0].keys() if rows else []))
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(cols)]
    typer.echo("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip())
    for row in cells:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
