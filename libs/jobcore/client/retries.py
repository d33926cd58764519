"""When the client tries a request again, as pure code: after a ``503``, a ``429`` or a
connection error, with exponential backoff and full jitter (:mod:`jobcore.kernel.retry`), never
sooner than the API's ``Retry-After``, within a number of attempts and a deadline."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from jobcore.kernel.retry import backoff_delay

# The answers that say "not now": the database is unreachable, or a quota is used up.
RETRYABLE_STATUSES = frozenset({429, 503})
# Failures of the connection itself. Others (a URL with no scheme, say) would fail again.
RETRYABLE_TRANSPORT_ERRORS: tuple[type[httpx.TransportError], ...] = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
)
# Clients told the same Retry-After come back spread over this fraction of it.
RETRY_AFTER_SPREAD = 0.2


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard one call tries: at most ``max_attempts`` requests, none started later than
    ``deadline`` seconds after the first; attempt n waits a random time in
    [0, min(max_delay, base_delay·2^(n−1))] s, or the API's ``Retry-After`` when it sent one."""

    max_attempts: int = 10
    deadline: float = 60.0
    base_delay: float = 0.2
    max_delay: float = 10.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.deadline < 0:
            raise ValueError("deadline must not be negative")
        if self.base_delay <= 0 or self.max_delay <= 0:
            raise ValueError("base_delay and max_delay must be positive")


NO_RETRIES = RetryPolicy(max_attempts=1)


def retryable_error(error: httpx.TransportError) -> bool:
    return isinstance(error, RETRYABLE_TRANSPORT_ERRORS)


class Attempts:
    """One call's retry budget, started at its first request."""

    def __init__(
        self,
        policy: RetryPolicy,
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.policy = policy
        self.clock = clock
        self.rng = rng
        self.made = 1
        self.deadline = clock() + policy.deadline

    def next_delay(self, retry_after: float | None = None) -> float | None:
        """Seconds to wait before the next request, or None when the budget is spent (or the
        API asked for a wait that would end past the deadline)."""
        if self.made >= self.policy.max_attempts or self.clock() >= self.deadline:
            return None
        if retry_after is not None:
            delay = retry_after * (1 + RETRY_AFTER_SPREAD * self.rng())
        else:
            delay = backoff_delay(
                self.made, base=self.policy.base_delay, cap=self.policy.max_delay, rng=self.rng
            )
        if self.clock() + delay > self.deadline:
            if retry_after is not None:
                return None  # the API said not before then: waiting less is no use
            delay = max(0.0, self.deadline - self.clock())
        self.made += 1
        return delay
