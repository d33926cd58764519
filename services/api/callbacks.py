"""The ``callback_url`` of ``POST /jobs/{type}``: checked before the request takes a pooled
connection (resolving a host can take a while, and must not hold one)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query

from jobcore.execution.completion_webhooks import (
    MAX_URL_LENGTH,
    UnsafeCallbackUrl,
    check_callback_url,
)
from services.api.deps import ApiState, StateDep
from services.api.problems import InvalidRequest

# The shape jobcore.execution.completion_webhooks.parse_callback_url takes, so /openapi.json can say
# it: http(s), a host (a name or a bracketed IPv6 address) without credentials, an optional port, no
# whitespace or control characters. What a pattern cannot say (the port's range, where
# the host resolves to) is checked after it, with the same 422.
_NO_SPACE = r"\x00-\x20\x7f\s"
CALLBACK_URL_PATTERN = (
    rf"^[Hh][Tt][Tt][Pp][Ss]?://(?:[^{_NO_SPACE}/?#@:\[\]]+|\[[0-9A-Fa-f:.]+\])"
    rf"(?::[0-9]{{1,5}})?(?:[/?#][^{_NO_SPACE}]*)?$"
)

CallbackUrlQuery = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=MAX_URL_LENGTH,
        pattern=CALLBACK_URL_PATTERN,
        json_schema_extra={"format": "uri"},
        description="An http(s) URL that receives a signed POST when the job ends "
        "(succeeded, failed or cancelled). Its host must resolve to public addresses only "
        "(or be one of JOBCORE_WEBHOOK_ALLOWED_HOSTS), its port from 1 to 65535.",
        examples=["https://example.com/hooks/jobs"],
    ),
]


async def checked_callback_url(
    state: StateDep, callback_url: CallbackUrlQuery = None
) -> str | None:
    return await check_callback(callback_url, state)


async def check_callback(callback_url: str | None, state: ApiState) -> str | None:
    """The callback URL if it may be used, else a 422 naming why."""
    if callback_url is None:
        return None
    try:
        await check_callback_url(callback_url, state.settings.webhook_allowed_hosts)
    except UnsafeCallbackUrl as exc:
        raise InvalidRequest(
            [{"loc": ["query", "callback_url"], "msg": str(exc), "type": "unsafe_callback_url"}],
            str(exc),
        ) from None
    return callback_url


CallbackUrlDep = Annotated[str | None, Depends(checked_callback_url)]
