"""Reading a JSON request body without trusting the client: media type, size, encoding.

The size limit is checked twice: against Content-Length before reading anything, and
against the bytes actually received while streaming (a client may lie or send chunked),
so no body larger than the limit is ever held in memory.
"""

from __future__ import annotations

import math
from typing import Any

import orjson
from starlette.requests import Request

from services.api.problems import (
    BodyTooLarge,
    MalformedJson,
    UnstorablePayload,
    UnsupportedMediaType,
)


def _is_json_media_type(content_type: str | None) -> bool:
    if not content_type:
        return False
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )


async def read_json(request: Request, limit: int) -> Any:
    """The parsed JSON body of ``request``, at most ``limit`` bytes long."""
    if not _is_json_media_type(request.headers.get("content-type")):
        raise UnsupportedMediaType()
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise MalformedJson("the Content-Length header is not a number")
        if int(declared) > limit:
            raise BodyTooLarge(f"the body is {declared} bytes; at most {limit} are accepted")
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise BodyTooLarge(f"the body is larger than {limit} bytes")
        chunks.append(chunk)
    try:
        return orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise MalformedJson(f"the body is not valid JSON: {exc}") from None


def check_storable(value: Any, loc: tuple[str | int, ...] = ("body",)) -> None:
    """Refuse what PostgreSQL's jsonb cannot hold (NUL in strings, non-finite numbers).

    Valid JSON and valid for the payload model, yet the INSERT would fail: refusing it
    here keeps such input a 422 instead of a server error.
    """
    errors: list[dict[str, Any]] = []
    _collect_unstorable(value, list(loc), errors)
    if errors:
        raise UnstorablePayload(errors, f"the payload cannot be stored ({len(errors)} errors)")


def _collect_unstorable(value: Any, loc: list[str | int], errors: list[dict[str, Any]]) -> None:
    if isinstance(value, str):
        if "\x00" in value:
            errors.append({"loc": loc, "msg": "NUL characters are not allowed", "type": "nul"})
    elif isinstance(value, float):
        if not math.isfinite(value):
            errors.append({"loc": loc, "msg": "numbers must be finite", "type": "finite_number"})
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and "\x00" in key:
                errors.append(
                    {"loc": [*loc, key], "msg": "NUL characters are not allowed", "type": "nul"}
                )
            _collect_unstorable(item, [*loc, key], errors)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _collect_unstorable(item, [*loc, index], errors)
