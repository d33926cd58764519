"""`jobcore openapi`: the API's OpenAPI document, as `GET /openapi.json` serves it.

Generated clients are built from this output (clients/typescript: `make ts-client`), so it
needs no database, broker or running API: the document comes from the app object itself,
with the job types of JOBCORE_JOB_MODULES.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import typer

from services.api.app import create_app
from services.cli.common import example, settings


def openapi(
    out: Path | None = typer.Option(
        None, "--out", help="Write the document to this file instead of standard output."
    ),
) -> None:
    """Print the API's OpenAPI document (JSON) for the configured job types."""
    document = create_app(settings()).openapi()
    # Indented and newline-terminated: the file is committed and diffed.
    text = orjson.dumps(document, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
    if out is None:
        typer.echo(text.decode(), nl=False)
    else:
        out.write_bytes(text)


def register(app: typer.Typer) -> None:
    app.command(
        "openapi",
        epilog=example("jobcore openapi --out clients/typescript/src/generated/openapi.json"),
    )(openapi)
