"""Reading a JSON request body without trusting the client: media type, size, encoding.

The size limit is checked twice: against Content-Length before reading anything, and
against the bytes actually received while streaming (a client may lie or send chunked),
so no body larger than the limit is ever held in memory.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request

from services.api.problems import (
    BodyTooLarge,
    MalformedJson,
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
