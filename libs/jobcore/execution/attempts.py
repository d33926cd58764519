"""One attempt of a job, as every runner of handlers makes it: the handler under its job
type's timeout, its error as the job's ``last_error``, and its result and effects as they
are stored.

The execution core (:mod:`jobcore.execution.executor`, which the worker and the testing
kit's InlineWorker both run) and the testing kit's :func:`~jobcore.testing.run_inline`
call handlers through these, so a handler's test sees the timeout, the error text and the
refusal of an unstorable result that production would.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import orjson

from jobcore.execution.registry import JobContext, JobType
from jobcore.kernel.errors import JobcoreError

ERROR_MAX_CHARS = 2000
_NUL = b"\\u0000"  # how orjson writes U+0000, which PostgreSQL's jsonb refuses


class JobTimedOut(JobcoreError):
    """The handler ran longer than its job type's timeout."""


class UnstorableOutcome(JobcoreError):
    """The handler's result or effects cannot be stored: the attempt fails for good."""


def error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return storable(text)[:ERROR_MAX_CHARS]


def storable(text: str) -> str:
    """``text`` as PostgreSQL can store it: text columns hold no NUL, and a lone surrogate
    (bytes decoded with ``surrogateescape``) cannot be encoded. Either would fail the very
    statement that records the error, and the attempt would end as "lease expired"."""
    return text.replace("\x00", "\\x00").encode("utf-8", "replace").decode("utf-8")


async def call_handler(job_type: JobType[Any], context: JobContext[Any]) -> Any:
    """The handler's result; :class:`JobTimedOut` past the job type's timeout."""
    timeout = asyncio.timeout(job_type.timeout)
    try:
        async with timeout:
            return await job_type.handler(context)
    except TimeoutError:
        if timeout.expired():
            raise JobTimedOut(f"timed out after {job_type.timeout:g}s") from None
        raise


def effect_rows(context: JobContext[Any], lease_token: uuid.UUID) -> list[dict[str, Any]]:
    """The attempt's recorded effects as the success statement takes them."""
    return [
        {
            "job_id": str(context.job_id),
            "lease_token": str(lease_token),
            "kind": e.kind,
            "detail": e.detail,
        }
        for e in context.effects
    ]


def encode_result(result: Any, effects: list[dict[str, Any]]) -> bytes | None:
    """The result as stored (JSON; None for no result), once the result and the effects
    are known to be storable; :class:`UnstorableOutcome` otherwise."""
    try:
        encoded = None if result is None else orjson.dumps(result)
        encoded_effects = orjson.dumps(effects)
    except TypeError as exc:
        raise UnstorableOutcome(f"the handler's result or effects are not JSON: {exc}") from None
    if _NUL in (encoded or b"") or _NUL in encoded_effects:
        # Valid JSON that jsonb refuses; it would fail every batch it travels in.
        raise UnstorableOutcome("the handler's result or effects contain a NUL character")
    return encoded
