"""The job types jobcore ships: real examples (one debounced, one throttled) and a no-op
for benchmarks.

Handlers run in the worker; the API only needs the payload models and queues.
"""

from __future__ import annotations

import asyncio
import csv
import os
import random
import re
import tempfile
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Annotated

import email_validator
from pydantic import BaseModel, ConfigDict, EmailStr, Field

from jobcore.database.store import ledger_store
from jobcore.execution.registry import JobContext, job
from jobcore.execution.transaction import JobTransaction
from jobcore.kernel.errors import PermanentError
from jobcore.kernel.keyed import Debounce, Throttle


class NoopPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")


@job("noop", payload=NoopPayload, queue="default", max_attempts=3, timeout=30, lease=30)
async def noop(ctx: JobContext[NoopPayload]) -> None:
    """Does nothing: the cost of jobcore itself, for benchmarks and smoke tests."""


# A handler's memory is bounded by its payload's schema (docs/handlers.md): every field has
# a bound, and the export streams its file, so the worst payload accepted costs this much.
EXPORT_MAX_ROWS = 1_000_000
EXPORT_MAX_COLUMNS = 20
EXPORT_MAX_COLUMN_NAME = 32
# A column name needs no CSV quoting, so a cell's length is known from the name's.
COLUMN_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
# The longest cell: a named column's "<name>-" and six digits ("id" and "amount" are shorter).
EXPORT_MAX_CELL = EXPORT_MAX_COLUMN_NAME + 7
# The longest row: its cells, the commas between them, the newline.
EXPORT_MAX_ROW_BYTES = EXPORT_MAX_COLUMNS * EXPORT_MAX_CELL + EXPORT_MAX_COLUMNS
# The export hands the result store a chunk once it holds this much: with the row that
# crossed the line, no chunk is larger than EXPORT_CHUNK_BYTES + EXPORT_MAX_ROW_BYTES.
EXPORT_CHUNK_BYTES = 256 * 1024
INT64 = 2**63

ColumnName = Annotated[
    str, Field(min_length=1, max_length=EXPORT_MAX_COLUMN_NAME, pattern=COLUMN_NAME_PATTERN)
]
# A mail header line is one line: a newline in it is refused here, not by the handler.
HeaderText = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")]


class ExportCsvPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rows: int = Field(default=1000, ge=1, le=EXPORT_MAX_ROWS)
    columns: list[ColumnName] = Field(
        default_factory=lambda: ["id", "name", "amount"],
        min_length=1,
        max_length=EXPORT_MAX_COLUMNS,
    )
    seed: int = Field(default=0, ge=-INT64, le=INT64 - 1)


def _any_case(name: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in name)


# EmailStr (email-validator) refuses addresses at special-use domains (RFC 6761: .test,
# .localhost, ...), which `format: email` allows: /openapi.json says so, or clients and
# contract testers take a .test address for valid.
_SPECIAL_USE_DOMAIN = (
    r"@(?:[^@]*\.)?(?:"
    + "|".join(_any_case(name) for name in email_validator.SPECIAL_USE_DOMAIN_NAMES)
    + r")\.?$"
)


class SendEmailPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # RFC 5321's limit on a path, which every deliverable address fits.
    to: Annotated[
        EmailStr,
        Field(
            max_length=254,
            description="A deliverable address: not at a special-use domain "
            f"({', '.join(email_validator.SPECIAL_USE_DOMAIN_NAMES)}).",
            json_schema_extra={"not": {"pattern": _SPECIAL_USE_DOMAIN}},
        ),
    ]
    subject: HeaderText
    body: str = Field(default="", max_length=100_000)


@job("export_csv", payload=ExportCsvPayload, queue="default", max_attempts=3, timeout=600, lease=60)
async def export_csv(ctx: JobContext[ExportCsvPayload]) -> dict[str, object]:
    """Writes a CSV of generated rows (the same rows for the same seed) to the result store,
    a chunk at a time: the file is never in memory as a whole.

    The file is keyed by the job id, so a retry replaces it instead of adding another.
    """
    key, size = await ctx.put_result_chunks(csv_chunks(ctx.payload), suffix="csv")
    ctx.record_effect("export_written", {"key": key, "rows": ctx.payload.rows, "bytes": size})
    return {"rows": ctx.payload.rows, "columns": ctx.payload.columns, "bytes": size}


def csv_chunks(payload: ExportCsvPayload) -> Iterator[bytes]:
    """The export's CSV in pieces of about :data:`EXPORT_CHUNK_BYTES` (plain, blocking code:
    the result store consumes it in a thread)."""
    rng = random.Random(payload.seed)
    # The writer appends each row's text to a list: joined once per chunk, it costs the
    # chunk's size (a StringIO reused with truncate keeps 4 bytes a character instead).
    pending: list[str] = []
    writer = csv.writer(_Appender(pending), lineterminator="\n")
    size = writer.writerow(payload.columns)
    for number in range(1, payload.rows + 1):
        size += writer.writerow([_cell(column, number, rng) for column in payload.columns])
        if size >= EXPORT_CHUNK_BYTES:
            yield "".join(pending).encode()
            pending.clear()
            size = 0
    if pending:
        yield "".join(pending).encode()


class _Appender:
    """A file-like ``write`` onto a list, for :func:`csv.writer`."""

    def __init__(self, parts: list[str]) -> None:
        self.parts = parts

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)


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


# --- an account ledger, credited exactly once per job (ctx.transaction) --------------------

ACCOUNT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
# A cent amount well inside bigint, so a balance has room for millions of the largest credit.
CREDIT_MAX_CENTS = 10**12


class CreditAccountPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    account: str = Field(min_length=1, max_length=64, pattern=ACCOUNT_PATTERN)
    amount_cents: int = Field(ge=1, le=CREDIT_MAX_CENTS)


async def post_credit(tx: JobTransaction, account: str, amount_cents: int) -> dict[str, int]:
    """Credit ``account`` of the job's tenant on the handler's transaction: the entry and
    the account's new balance (``entry_id``, ``balance_cents``)."""
    row = await ledger_store.credit(
        tx.connection,
        {
            "job_id": tx.fence.job_id,
            "attempt": tx.fence.attempt,
            "account": account,
            "amount_cents": amount_cents,
        },
    )
    if row is None:  # pragma: no cover - the job row exists while its attempt runs
        raise PermanentError("the job's row is gone")
    return {"entry_id": row["entry_id"], "balance_cents": row["balance_cents"]}


@job(
    "credit_account",
    payload=CreditAccountPayload,
    queue="default",
    max_attempts=5,
    timeout=60,
    lease=30,
)
async def credit_account(ctx: JobContext[CreditAccountPayload]) -> None:
    """Credits the tenant's account in ``ledger_entries`` / ``ledger_accounts`` (migration
    0013) on ``ctx.transaction()``: the credit commits together with the job's success, so
    a worker killed at any point credits it once, whichever attempt runs it."""
    async with ctx.transaction() as tx:
        credited = await post_credit(tx, ctx.payload.account, ctx.payload.amount_cents)
        tx.set_result({"account": ctx.payload.account, **credited})


class ReindexAccountPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    account: str = Field(min_length=1, max_length=100)
    # What changed (a record's id, say): the run gets every change its job coalesced.
    change: str = Field(default="", max_length=200)


# A burst of changes to one account becomes one reindex: 5 s after the last change, at
# most a minute after the first, with every change of the burst (docs/how-to/debounce.md).
@job(
    "reindex_account",
    payload=ReindexAccountPayload,
    queue="default",
    max_attempts=5,
    timeout=60,
    lease=30,
    debounce=Debounce(5.0, max_wait=60.0, per="account", payloads="all", max_payloads=100),
)
async def reindex_account(ctx: JobContext[ReindexAccountPayload]) -> dict[str, object]:
    changes = [p.change for p in ctx.payloads] or [ctx.payload.change]
    return {"account": ctx.payload.account, "changes": len(changes)}


class RefreshDashboardPayload(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dashboard: str = Field(min_length=1, max_length=100)


# At most one refresh of a dashboard every 10 s; a request within that answers the job
# already running or done (docs/how-to/debounce.md).
@job(
    "refresh_dashboard",
    payload=RefreshDashboardPayload,
    queue="default",
    max_attempts=3,
    timeout=60,
    lease=30,
    throttle=Throttle(10.0, per="dashboard"),
)
async def refresh_dashboard(ctx: JobContext[RefreshDashboardPayload]) -> dict[str, object]:
    return {"dashboard": ctx.payload.dashboard}
