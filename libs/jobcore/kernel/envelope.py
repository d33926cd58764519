"""The AMQP wire format: a small, versioned, orjson-encoded envelope.

The body names the job, the attempt and the type; nothing else (no payload, no
secrets). Anything that does not decode to this is a :class:`PoisonMessage`.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobcore.kernel.errors import PoisonMessage

ENVELOPE_VERSION: Literal[1] = 1
CONTENT_TYPE = "application/json"
MAX_BODY_BYTES = 64 * 1024
MAX_ATTEMPT = 10_000
# Printable text, as PostgreSQL text takes it: no NUL (which it cannot store at all) and no
# other control character (the rule the API applies to the ids it takes).
PRINTABLE_TEXT = r"^[^\x00-\x1f\x7f]+$"


class JobMessage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = ENVELOPE_VERSION
    job_id: uuid.UUID
    # Bounded so that a hostile number is poison here, not an out-of-range error in the
    # worker's claim statement (which would fail every message claimed with it). Strict:
    # the relay writes a JSON integer, and `true` or "2" is a malformed message.
    attempt: int = Field(ge=1, le=MAX_ATTEMPT, strict=True)
    # The worker sends the type to PostgreSQL (a claim, or the note on the job of a type it
    # does not know): one it cannot store is poison here, not a statement that fails (and
    # is retried) for every delivery of the message.
    type: str = Field(min_length=1, max_length=200, pattern=PRINTABLE_TEXT)

    def encode(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"))


def decode(body: bytes) -> JobMessage:
    """Parse a message body; raise :class:`PoisonMessage` for anything malformed."""
    if len(body) > MAX_BODY_BYTES:
        raise PoisonMessage(f"message body of {len(body)} bytes is larger than allowed")
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise PoisonMessage(f"message body is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise PoisonMessage("message body is not a JSON object")
    try:
        return JobMessage.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise PoisonMessage(f"bad envelope at {where}: {first['msg']}") from None


# The relay's word on a publish, in each message's headers: "<when it took the outbox row,
# ISO 8601> <relay id>". The worker's claim of a job's first attempt keeps it on the job
# row (jobs.published_at, published_by), which the timeline lists as the job's `published`
# event instead of an event row (migration 0041). A message without it (a relay of the
# previous revision, which writes the event row) or with one that does not parse is
# claimed as before, with no publish kept.
PUBLISHED_HEADER = "x-jobcore-published"
_PRINTABLE = re.compile(PRINTABLE_TEXT)


def published_header(taken_at: datetime, relay: str) -> str:
    return f"{taken_at.isoformat()} {relay}"


def read_published(headers: Mapping[str, Any] | None) -> tuple[datetime | None, str | None]:
    """When and by which relay a message was published, from its headers; (None, None)
    when they do not say (a header is the sender's to write: anything odd is ignored)."""
    value = (headers or {}).get(PUBLISHED_HEADER)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if not isinstance(value, str):
        return None, None
    at, _, relay = value.partition(" ")
    try:
        taken_at = datetime.fromisoformat(at)
    except ValueError:
        return None, None
    # What PostgreSQL text cannot store (a NUL) would fail the claim of the whole batch.
    if taken_at.tzinfo is None or not _PRINTABLE.match(relay) or len(relay) > 200:
        return None, None
    return taken_at, relay
