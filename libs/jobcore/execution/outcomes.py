"""What an attempt's outcome is, decided once for every runner of handlers.

The execution core (:mod:`jobcore.execution.executor`, which the worker and the testing
kit's :class:`~jobcore.testing.draining.InlineWorker` both run) decides here what an
attempt ends in, so a handler's test sees the rows production writes: the result as
stored (inline, or in the result store when larger than
``JOBCORE_INLINE_RESULT_MAX_BYTES``), a retry after the configured backoff or the failure
of the last attempt, a permanent failure, a cancellation, a job given back when the
object store is unavailable (a bounded number of times), an attempt failed when the store
refused it, and every ``last_error`` text.

Pure code: each function takes what the attempt came to (the handler's result or error,
the attempt's number, the limits) and returns a frozen outcome; the executor writes it
with a fenced statement and stores a large result itself (:attr:`Succeed.to_store`).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jobcore.execution.attempts import (
    ERROR_MAX_CHARS,
    UnstorableOutcome,
    effect_rows,
    encode_result,
    error_text,
    storable,
)
from jobcore.execution.registry import InvalidPayloadError, JobContext
from jobcore.kernel.errors import PermanentError
from jobcore.kernel.retry import backoff_ceiling, backoff_delay
from jobcore.storage.results import StoreUnavailable

if TYPE_CHECKING:
    from jobcore.kernel.settings import Settings

# The last_error of a job cancelled while it ran.
CANCELLED_ERROR = "cancelled"
# A result file (ctx.put_result) is the job's result: a returned one too large to keep
# inline would need a second file.
RESULT_FILE_AND_TOO_LARGE = "the handler stored a result file and returned a too large result"


@dataclass(frozen=True, slots=True)
class OutcomeLimits:
    """The settings an outcome depends on."""

    inline_result_max_bytes: int
    retry_backoff_base: float
    retry_backoff_cap: float
    # Store outages that give a job back without spending an attempt, in its life.
    max_store_give_backs: int = 10

    @classmethod
    def from_settings(cls, settings: Settings) -> OutcomeLimits:
        return cls(
            inline_result_max_bytes=settings.inline_result_max_bytes,
            retry_backoff_base=settings.retry_backoff_base,
            retry_backoff_cap=settings.retry_backoff_cap,
            max_store_give_backs=settings.max_store_give_backs,
        )


@dataclass(frozen=True, slots=True)
class Succeed:
    """The job succeeded: ``result`` (JSON text) kept in the row, or ``result_ref`` naming
    the result in the store, and the attempt's effects as the success statement takes them.

    ``to_store``: a result too large for the row, which the caller stores (its key becomes
    ``result_ref``, :meth:`stored`) before it writes the success."""

    result: str | None
    result_ref: str | None
    effects: list[dict[str, Any]]
    to_store: bytes | None = None

    def stored(self, key: str) -> Succeed:
        return Succeed(None, key, self.effects)


@dataclass(frozen=True, slots=True)
class Retry:
    """The attempt failed and another one runs after ``delay`` seconds (the next attempt's
    message carries the attempt's number plus one)."""

    error: str
    delay: float


@dataclass(frozen=True, slots=True)
class Fail:
    """The job failed for good."""

    error: str


@dataclass(frozen=True, slots=True)
class Cancel:
    """The job's cancellation was asked for while it ran: it ends cancelled."""

    error: str = CANCELLED_ERROR


@dataclass(frozen=True, slots=True)
class GiveBack:
    """The object store was unavailable: through no fault of the job, which goes back to
    pending without consuming an attempt (even its last one), at most
    ``max_store_give_backs`` times in its life. Its new message is due after
    :func:`give_back_delay` (it grows with the outages the runner met in a row, which only
    the runner counts)."""

    error: str
    # What the store failed during ("reading the payload", "storing the result", ...).
    during: str


Outcome = Succeed | Retry | Fail | Cancel | GiveBack

CANCEL = Cancel()


def success(
    result: Any, context: JobContext[Any], lease_token: uuid.UUID, limits: OutcomeLimits
) -> Succeed | Fail:
    """What the handler's return records: its result (inline, or to store when large) and
    its effects; :class:`Fail` when they cannot be stored."""
    effects = effect_rows(context, lease_token)
    try:
        encoded = encode_result(result, effects)
    except UnstorableOutcome as exc:
        return Fail(str(exc))
    if encoded is not None and len(encoded) > limits.inline_result_max_bytes:
        if context.result_ref is not None:
            return Fail(RESULT_FILE_AND_TOO_LARGE)
        return Succeed(None, None, effects, encoded)
    return Succeed(None if encoded is None else encoded.decode(), context.result_ref, effects, None)


def attempt_failed(
    exc: BaseException,
    *,
    attempt: int,
    max_attempts: int,
    limits: OutcomeLimits,
    during: str | None = None,
    rng: Callable[[], float] = random.random,
) -> Retry | Fail:
    """A retryable failure of attempt number ``attempt``: retried after the backoff, or the
    job's failure when it was the last attempt. ``during``: what failed, outside the
    handler (``"storing the result"``), named in the error."""
    error = error_text(exc) if during is None else f"{during} failed: {error_text(exc)}"
    return _failed(error, attempt=attempt, max_attempts=max_attempts, limits=limits, rng=rng)


def _failed(
    error: str,
    *,
    attempt: int,
    max_attempts: int,
    limits: OutcomeLimits,
    rng: Callable[[], float] = random.random,
) -> Retry | Fail:
    error = error[:ERROR_MAX_CHARS]
    if attempt >= max_attempts:
        return Fail(error)
    delay = backoff_delay(
        attempt, base=limits.retry_backoff_base, cap=limits.retry_backoff_cap, rng=rng
    )
    return Retry(error, delay)


def handler_failed(
    exc: BaseException,
    *,
    attempt: int,
    max_attempts: int,
    limits: OutcomeLimits,
    give_backs: int = 0,
) -> Retry | Fail | GiveBack:
    """The handler raised ``exc`` (not because its runner stopped it): a permanent error
    fails the job, the object store's outage gives it back (``give_backs``: the times one
    already did, :func:`store_failed`), anything else is retried (a refusal of the store,
    :class:`~jobcore.kernel.errors.StoreRefused`, too: it is no outage)."""
    if isinstance(exc, PermanentError):
        return Fail(error_text(exc))
    if isinstance(exc, StoreUnavailable):
        # The handler's own use of the store (ctx.put_result...) met the outage.
        return store_failed(
            exc,
            during="running the handler",
            attempt=attempt,
            max_attempts=max_attempts,
            limits=limits,
            give_backs=give_backs,
        )
    return attempt_failed(exc, attempt=attempt, max_attempts=max_attempts, limits=limits)


def store_failed(
    exc: BaseException,
    *,
    during: str,
    attempt: int,
    max_attempts: int,
    limits: OutcomeLimits,
    give_backs: int = 0,
) -> Retry | Fail | GiveBack:
    """The result store failed while ``during`` (reading the payload, storing the result).
    An outage of the object store gives the job back, unless outages already did
    ``give_backs`` >= ``max_store_give_backs`` times: then this one counts as the attempt's
    failure, so a store that stays away ends in the job's failure rather than give-backs
    for ever. Anything else (the store refused the request, a missing object, a local
    directory that cannot be written) fails this attempt, as itself; another may not."""
    if isinstance(exc, StoreUnavailable):
        if give_backs < limits.max_store_give_backs:
            return store_outage(exc, during=during)
        error = (
            f"{during} failed: object store unavailable, and the job was given back "
            f"{give_backs} times already: {error_text(exc)}"
        )
        return _failed(error, attempt=attempt, max_attempts=max_attempts, limits=limits)
    return attempt_failed(
        exc, attempt=attempt, max_attempts=max_attempts, limits=limits, during=during
    )


def store_outage(exc: StoreUnavailable, *, during: str) -> GiveBack:
    error = f"{during} failed: object store unavailable: {error_text(exc)}"
    return GiveBack(error[:ERROR_MAX_CHARS], during)


def give_back_delay(
    outages: int, limits: OutcomeLimits, rng: Callable[[], float] = random.random
) -> float:
    """Seconds before a job given back after ``outages`` store outages in a row runs again:
    at least half the backoff ceiling (full jitter could draw ~0 and retry a dead store at
    once), so jobs do not hot-loop against a store that is down."""
    ceiling = backoff_ceiling(outages, base=limits.retry_backoff_base, cap=limits.retry_backoff_cap)
    return ceiling * (0.5 + rng() / 2)


def invalid_payload(exc: InvalidPayloadError) -> Fail:
    """The stored payload does not validate: the job type's model changed since the job
    was enqueued, or it came through SQL (jobcore.enqueue), which cannot run the model.
    The job fails at once, every attempt would; the error names each field."""
    detail = "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'payload'}: {e['msg']}" for e in exc.errors
    )
    return Fail(
        storable(f"payload does not validate against the job type's model: {detail}")[
            :ERROR_MAX_CHARS
        ]
    )


def undeliverable_note(attempt: int, exc: Exception) -> str:
    """The last_error of a job whose message a worker that does not know its type
    dead-lettered (``exc``: the unknown type's error). Worded to stay true after a replay
    ran the job: last_error is the last error seen."""
    return (
        f"attempt {attempt}'s message was dead-lettered by a worker that does "
        f"not know the job type ({exc}); `jobcore dlq replay` runs it once one does"
    )


def snooze_cap_error(cap: int, seconds: float) -> str:
    """The last_error of a job whose handler snoozed it once more than its type's cap."""
    return (
        f"snoozed {cap} times already, its job type's cap (max_snoozes, else "
        f"JOBCORE_MAX_SNOOZES): failed instead of snoozing again for {seconds:g} s"
    )
