"""The opaque cursor of ``GET /jobs``: the keyset position (created_at, id) of the last
job on a page. Opaque so clients cannot build one, and so its format may change."""

from __future__ import annotations

import base64
import binascii
import uuid
from datetime import datetime

import orjson

from services.api.problems import InvalidCursor

_VERSION = 1
MAX_CURSOR_LENGTH = 200
# Unpadded base64url: what encode_cursor writes (empty: the first page).
CURSOR_PATTERN = r"^[A-Za-z0-9_-]*$"


def encode_cursor(created_at: datetime, job_id: uuid.UUID) -> str:
    raw = orjson.dumps([_VERSION, created_at.isoformat(), str(job_id)])
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(token: str) -> tuple[datetime, uuid.UUID]:
    if len(token) > MAX_CURSOR_LENGTH:
        raise InvalidCursor()
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        version, created_at, job_id = orjson.loads(raw)
        if version != _VERSION or not isinstance(created_at, str) or not isinstance(job_id, str):
            raise InvalidCursor()
        position = datetime.fromisoformat(created_at), uuid.UUID(job_id)
    except (binascii.Error, ValueError, TypeError):  # JSONDecodeError is a ValueError
        raise InvalidCursor() from None
    if position[0].tzinfo is None:
        raise InvalidCursor()
    return position
