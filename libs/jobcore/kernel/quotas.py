"""Tenant quotas as pure arithmetic: the enqueue rate limit (GCRA), the caps, and the
``RateLimit`` / ``RateLimit-Policy`` header values (IETF httpapi ratelimit-headers draft 11).

The rate limit is a token bucket kept as one number per tenant, its *theoretical arrival
time* (GCRA): a request at ``now`` is admitted when ``max(tat, now) + interval`` is at most
``burst`` intervals ahead of ``now``, and then that becomes the new ``tat``. The database
applies the same rule in the enqueue statement (:mod:`jobcore.database.sql.tenant_quotas`), so the
limit holds across API processes; this module is the reference the tests check it
against, and turns the state the statement returns into headers.

A limit of 0 means unlimited, for every quota. Imports nothing of ours.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

# Seconds of slack in comparisons of times the database rounded to microseconds.
EPSILON = 1e-6
# Rates a tenant may be given (besides 0, unlimited): slower than one a day would make
# the bucket's horizon (burst / rate) centuries long.
MIN_RATE = 1 / 86_400
MAX_RATE = 1_000_000.0
# The name of the enqueue policy in the RateLimit headers.
ENQUEUE_POLICY = "enqueue"


class Refusal(StrEnum):
    """Why a request was refused: the reason label of the refusal metric, and the
    ``reason`` the enqueue statement returns."""

    ENQUEUE_RATE = "enqueue_rate"
    MAX_UNFINISHED = "max_unfinished"
    LONG_POLLS_TENANT = "long_polls_tenant"
    LONG_POLLS_PROCESS = "long_polls_process"


class Admission(StrEnum):
    """How an enqueue's quotas are checked.

    ``EXACT``: under the lock of the tenant's usage row, which the admission updates (the
    rate limit's bucket, the refusal) and holds until its transaction ends; each admission
    sees its predecessor's job, so a cap is never passed. The API's enqueues, in
    transactions of their own that end at once.

    ``APPROXIMATE``: against the tenant's usage as committed (and the transaction's own
    jobs), read without a lock; the job's own count is an appended delta, so nothing is
    held that another enqueue waits for. Transactions open at once each see the others'
    jobs only once they commit: together they can pass the cap by the jobs they hold
    uncommitted. The rate limit refuses when the tenant's bucket is empty, and an
    admission here does not draw from it. For enqueues in an application's own
    transactions, which may stay open for long."""

    EXACT = "exact"
    APPROXIMATE = "approximate"


@dataclass(frozen=True, slots=True)
class Quotas:
    """A tenant's effective quotas (its overrides, else the deployment's defaults)."""

    enqueue_rate: float  # admitted enqueues per second, sustained; 0 = unlimited
    enqueue_burst: int  # admitted at once after a quiet spell
    max_unfinished: int  # jobs not yet succeeded, failed or cancelled; 0 = unlimited
    max_long_polls: int  # GET ?wait= parked at once, per API process; 0 = unlimited


@dataclass(frozen=True, slots=True)
class RateLimit:
    rate: float  # per second; 0 = unlimited
    burst: int

    @property
    def limited(self) -> bool:
        return self.rate > 0

    @property
    def interval(self) -> float:
        """Seconds one admitted request uses up."""
        return 1.0 / self.rate

    @property
    def horizon(self) -> float:
        """How far ahead of now the bucket's tat may run: a full burst."""
        return self.burst * self.interval

    def admit(self, tat: float | None, now: float) -> tuple[bool, float | None]:
        """Whether a request at ``now`` is admitted, and the tat afterwards (unchanged
        when refused). Times are seconds on any one clock; ``tat`` None: never used."""
        if not self.limited:
            return True, tat
        start = now if tat is None else max(tat, now)
        following = start + self.interval
        if following - now <= self.horizon + EPSILON:
            return True, following
        return False, tat

    def state(self, tat: float | None, now: float) -> RateState:
        """What the bucket holds at ``now`` given its tat (after this request's turn)."""
        if not self.limited:
            return RateState(remaining=0, reset=0, retry_after=0)
        ahead = 0.0 if tat is None else max(0.0, tat - now)
        remaining = math.floor((self.horizon - ahead) / self.interval + EPSILON)
        # The next request is admitted once the tat is at most horizon - interval ahead.
        wait = ahead - (self.horizon - self.interval)
        return RateState(
            remaining=max(0, min(self.burst, remaining)),
            reset=math.ceil(ahead - EPSILON) if ahead > EPSILON else 0,
            retry_after=max(1, math.ceil(wait - EPSILON)) if wait > EPSILON else 0,
        )

    def policy_header(self) -> str:
        """``RateLimit-Policy``: ``burst`` requests per the time the bucket takes to fill."""
        window = max(1, math.ceil(self.horizon - EPSILON))
        return f'"{ENQUEUE_POLICY}";q={self.burst};w={window}'


@dataclass(frozen=True, slots=True)
class RateState:
    remaining: int  # requests admitted if sent now, at once
    reset: int  # seconds until the bucket is full again (all of the burst available)
    retry_after: int  # seconds until one more request is admitted (0: now)

    def header(self) -> str:
        """``RateLimit``: what is left of the enqueue policy, and when it is full again."""
        return f'"{ENQUEUE_POLICY}";r={self.remaining};t={self.reset}'


def rate_headers(limit: RateLimit, tat: float | None, now: float) -> dict[str, str]:
    """The RateLimit headers of an enqueue answer (none when the rate is unlimited)."""
    if not limit.limited:
        return {}
    return {"RateLimit-Policy": limit.policy_header(), "RateLimit": limit.state(tat, now).header()}


def under_cap(used: int, cap: int) -> bool:
    """One more fits under ``cap`` (0: no cap)."""
    return cap <= 0 or used < cap


UNLIMITED = Quotas(enqueue_rate=0.0, enqueue_burst=1, max_unfinished=0, max_long_polls=0)
