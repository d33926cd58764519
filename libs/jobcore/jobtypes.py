"""The job types jobcore ships: two real examples and a no-op for benchmarks.

Handlers run in the worker; the API only needs the payload models and queues.
"""

from __future__ import annotations

import asyncio
import csv
import io
import os
import random
import tempfile
from email.message import EmailMessage
from pathlib import Path

from pydantic import BaseModel, ConfigDict, EmailStr, Field

from jobcore.errors import PermanentError
from jobcore.registry import JobContext, job


class NoopPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")


@job("noop", payload=NoopPayload, queue="default", max_attempts=3, timeout=30, lease=30)
async def noop(ctx: JobContext[NoopPayload]) -> None:
    """Does nothing: the cost of jobcore itself, for benchmarks and smoke tests."""


class ExportCsvPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rows: int = Field(default=1000, ge=1, le=1_000_000)
    columns: list[str] = Field(
        default_factory=lambda: ["id", "name", "amount"], min_length=1, max_length=50
    )
    seed: int = 0


class SendEmailPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    to: EmailStr
    subject: str = Field(min_length=1, max_length=200)
    body: str = Field(default="", max_length=100_000)


@job("export_csv", payload=ExportCsvPayload, queue="default", max_attempts=3, timeout=600, lease=60)
async def export_csv(ctx: JobContext[ExportCsvPayload]) -> dict[str, object]:
    """Writes a CSV of generated rows (the same rows for the same seed) to the result store.

    The file is keyed by the job id, so a retry replaces it instead of adding another.
    """
    data = await asyncio.to_thread(render_csv, ctx.payload)
    key = await ctx.put_result(data, suffix="csv")
    ctx.record_effect("export_written", {"key": key, "rows": ctx.payload.rows, "bytes": len(data)})
    return {"rows": ctx.payload.rows, "columns": ctx.payload.columns, "bytes": len(data)}


def render_csv(payload: ExportCsvPayload) -> bytes:
    rng = random.Random(payload.seed)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(payload.columns)
    for number in range(1, payload.rows + 1):
        writer.writerow([_cell(column, number, rng) for column in payload.columns])
    return out.getvalue().encode()


def _cell(column: str, number: int, rng: random.Random) -> str | int:
    if column == "id":
        return number
    if column == "amount":
        return f"{rng.randrange(100_000) / 100:.2f}"
    return f"{column}-{rng.randrange(1_000_000):06d}"


MAIL_SINK = "outbox-mail"
MAIL_FROM = "jobcore@localhost"


@job("send_email", payload=SendEmailPayload, queue="default", max_attempts=5, timeout=60, lease=30)
async def send_email(ctx: JobContext[SendEmailPayload]) -> dict[str, object]:
    """Delivers to a local sink directory (``<result dir>/outbox-mail``), one file a mail.

    The job id is the idempotency key: the file is named by it and created atomically
    (written aside, then linked into place, which fails if it exists), so a retry after
    a crash that came after delivery finds the mail there and does not send it again.
    """
    if ctx.settings is None:
        raise PermanentError("send_email needs the worker's settings to find its mail sink")
    sink = ctx.settings.result_dir / MAIL_SINK
    message = EmailMessage()
    message["From"] = MAIL_FROM
    message["To"] = str(ctx.payload.to)
    message["Subject"] = ctx.payload.subject
    message["Message-ID"] = f"<{ctx.idempotency_key}@jobcore>"
    message.set_content(ctx.payload.body)
    delivered = await asyncio.to_thread(
        deliver_once, sink, f"{ctx.idempotency_key}.eml", message.as_bytes()
    )
    ctx.record_effect(
        "email_sent", {"to": str(ctx.payload.to), "message_id": message["Message-ID"]}
    )
    return {"delivered": delivered, "message_id": message["Message-ID"]}


def deliver_once(sink: Path, name: str, data: bytes) -> bool:
    """Put ``data`` at ``sink/name`` unless it is there already; True if this call did."""
    sink.mkdir(parents=True, exist_ok=True)
    target = sink / name
    fd, tmp = tempfile.mkstemp(dir=sink, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(tmp, target)
        except FileExistsError:
            return False
        return True
    finally:
        Path(tmp).unlink(missing_ok=True)
