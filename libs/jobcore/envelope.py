"""The AMQP wire format: a small, versioned, orjson-encoded envelope.

The body names the job, the attempt and the type; nothing else (no payload, no
secrets). Anything that does not decode to this is a :class:`PoisonMessage`.
"""

from __future__ import annotations

import uuid
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from jobcore.errors import PoisonMessage

ENVELOPE_VERSION: Literal[1] = 1
CONTENT_TYPE = "application/json"
MAX_BODY_BYTES = 64 * 1024


class JobMessage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = ENVELOPE_VERSION
    job_id: uuid.UUID
    attempt: int
    type: str

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
