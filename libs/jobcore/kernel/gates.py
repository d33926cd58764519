"""Flow control declared on a job type: concurrency limits, rate limits, per-key ordering.

A job that may not start now is *held*: its claim leaves it ``pending`` with a
``held_reason``, acknowledges its message (no attempt is used, no broker redelivery is
counted), and the gate releaser (jobcore.maintenance.gate_releaser) publishes it again
through the outbox once its gate may let it through. The claim statement checks the gates
(:data:`jobcore.database.sql.jobs.run.JOB_CLAIM_MANY`); slots are counted from ``running`` job rows,
so a dead worker's slot is freed when the reaper returns its job to pending, and nothing
is kept in any process.

This module is pure: what a job type declares, and the gate keys a job gets at enqueue
(resolved once, stored on the job row, so the claim statement needs no registry).
Imports nothing of ours.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

# What a gate key is made of: "type" (one gate for all jobs of the type), "tenant" (one per
# tenant), or the name of a top-level payload field (one per value, within the tenant).
Per = str
MAX_KEY_CHARS = 255
MAX_RATE = 10_000.0
OrderingOnFailure = Literal["block", "skip"]


class HeldReason(StrEnum):
    """Why a pending job waits although it is due (``held_reason`` in ``GET /jobs/{id}``)."""

    CONCURRENCY = "concurrency"
    RATE_LIMIT = "rate_limit"
    ORDERING = "ordering"


@dataclass(frozen=True, slots=True)
class Limit:
    """At most ``n`` jobs of the gate running at once, across all workers."""

    n: int
    per: Per = "type"

    def __post_init__(self) -> None:
        if not 1 <= self.n <= 1_000_000:
            raise ValueError("a concurrency limit must be within 1..1000000")
        _check_per(self.per)


@dataclass(frozen=True, slots=True)
class Rate:
    """At most ``per_second`` starts a second of the gate's jobs, across all workers
    (GCRA: starts spaced 1/per_second apart, ``burst`` at once after a quiet spell)."""

    per_second: float
    per: Per = "type"
    burst: int = 1

    def __post_init__(self) -> None:
        if not 0 < self.per_second <= MAX_RATE or not math.isfinite(self.per_second):
            raise ValueError(f"a rate limit must be within (0, {MAX_RATE:g}] starts a second")
        if not 1 <= self.burst <= 10_000:
            raise ValueError("a rate limit's burst must be within 1..10000")
        _check_per(self.per)


def _check_per(per: str) -> None:
    if not per or len(per) > 64:
        raise ValueError("per must be 'type', 'tenant' or a payload field name")


def gate_key(kind: str, per: Per, *, type_name: str, tenant: str, payload: Any) -> str:
    """The key of the gate a job passes: jobs with the same key share one limit.

    A payload field's value is scoped to the tenant, so one tenant's values never share
    (or starve) another's gate; a missing field counts as the value ``null``.
    """
    if per == "type":
        key = f"{kind}:{type_name}"
    elif per == "tenant":
        key = f"{kind}:{type_name}:tenant={tenant}"
    else:
        value = payload.get(per) if isinstance(payload, Mapping) else None
        key = f"{kind}:{type_name}:tenant={tenant}:{per}={_text(value)}"
    if len(key) <= MAX_KEY_CHARS:
        return key
    # Distinct long values must stay distinct gates: keep a prefix and a digest of the rest.
    return key[:190] + "#" + hashlib.sha256(key.encode()).hexdigest()


def _text(value: Any) -> str:
    return "null" if value is None else str(value)
