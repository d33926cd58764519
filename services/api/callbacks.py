"""The ``callback_url`` of ``POST /jobs/{type}``: checked before the request takes a pooled
connection (resolving a host can take a while, and must not hold one)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Query

from jobcore.webhooks import MAX_URL_LENGTH, UnsafeCallbackUrl, check_callback_url
from services.api.deps import StateDep
from services.api.problems import InvalidRequest

CallbackUrlQuery = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=MAX_URL_LENGTH,
        description="An http(s) URL that receives a signed POST when the job ends "
        "(succeeded, failed or cancelled). Its host must resolve to public addresses only.",
        examples=["https://example.com/hooks/jobs"],
    ),
]


async def checked_callback_url(
    state: StateDep, callback_url: CallbackUrlQuery = None
) -> str | None:
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
