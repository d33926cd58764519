"""Debounce and throttle by key, declared on a job type: what the declarations are and
the key an enqueue joins. Pure; imports nothing of ours.

- **Debounce** (:class:`Debounce`): the enqueues of one key become one *trailing* job.
  The first enqueue writes a pending job due ``period`` seconds later; each enqueue of
  the key while that job was never claimed joins it instead: the payload joins it
  (``payloads="last"``: the job runs with the last one; ``"all"``: the handler also gets
  every coalesced payload, in enqueue order, as ``ctx.payloads``, at most
  ``max_payloads`` of them: a full job stops taking more and the next enqueue starts the
  next trailing job), and while its message is unpublished its due time moves to
  ``period`` after this enqueue, but never past ``max_wait`` after the first enqueue it
  coalesced. Once the trailing job was claimed, the next enqueue writes a new trailing
  job: at most one job of a key is open to joins. Unless the type declares its own concurrency
  limit, a key's jobs run one at a time (a concurrency limit of 1 per key), so an event
  during a run schedules exactly one more run, after it. ``cancel_running``: that
  enqueue also asks the running job to stop (the cooperative cancel of
  ``POST /jobs/{id}/cancel``).
- **Throttle** (:class:`Throttle`): at most one job of a key per ``period``, leading
  edge. The first enqueue writes a job that runs as any other; the enqueues of the key
  within ``period`` after it write nothing and are answered with that job's id
  (``joined``).

A key is the job type, the tenant and, with ``per`` naming a payload field, that field's
value: tenants never share a key.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

DebouncePayloads = Literal["all", "last"]
MAX_KEY_CHARS = 255
# Bounds a declaration may take: a period up to a day, a list up to 1,000 payloads.
MAX_PERIOD_SECONDS = 86_400.0
MAX_PAYLOADS_LIMIT = 1_000


class KeyKind(StrEnum):
    """What a job type's key does to its enqueues (``job_keys.kind``)."""

    DEBOUNCE = "debounce"
    THROTTLE = "throttle"


@dataclass(frozen=True, slots=True)
class Debounce:
    """Coalesce the enqueues of one key into one trailing run, ``period`` seconds after
    the last of them, at most ``max_wait`` seconds after the first (default: ten
    periods, capped at a day)."""

    period: float
    max_wait: float | None = None
    per: str = "tenant"
    payloads: DebouncePayloads = "last"
    max_payloads: int = 100
    cancel_running: bool = False

    def __post_init__(self) -> None:
        _check_period(self.period, "a debounce period")
        if self.max_wait is not None:
            _check_period(self.max_wait, "a debounce's max_wait")
            if self.max_wait < self.period:
                raise ValueError("a debounce's max_wait must be at least its period")
        if self.payloads not in ("all", "last"):
            raise ValueError("a debounce's payloads must be 'all' or 'last'")
        if not 1 <= self.max_payloads <= MAX_PAYLOADS_LIMIT:
            raise ValueError(f"a debounce's max_payloads must be within 1..{MAX_PAYLOADS_LIMIT}")
        _check_per(self.per)

    @property
    def wait_cap(self) -> float:
        """The longest a trailing job waits after the first enqueue it coalesced."""
        if self.max_wait is not None:
            return self.max_wait
        return min(self.period * 10, MAX_PERIOD_SECONDS)


@dataclass(frozen=True, slots=True)
class Throttle:
    """At most one job of a key per ``period`` seconds, leading edge."""

    period: float
    per: str = "tenant"

    def __post_init__(self) -> None:
        _check_period(self.period, "a throttle period")
        _check_per(self.per)


def _check_period(seconds: float, what: str) -> None:
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_PERIOD_SECONDS:
        raise ValueError(f"{what} must be within (0, {MAX_PERIOD_SECONDS:g}] seconds")


def _check_per(per: str) -> None:
    if not per or len(per) > 64 or per == "type":
        raise ValueError("per must be 'tenant' or a payload field name")


def job_key(kind: KeyKind, per: str, *, type_name: str, tenant: str, payload: Any) -> str:
    """The key an enqueue of ``type_name`` joins: its tenant's, or with ``per`` a payload
    field, that field's value's within the tenant (a missing field is ``null``)."""
    key = f"{kind.value}:{type_name}:tenant={tenant}"
    if per != "tenant":
        value = payload.get(per) if isinstance(payload, Mapping) else None
        key += f":{per}={'null' if value is None else value}"
    if len(key) <= MAX_KEY_CHARS:
        return key
    # Distinct long values stay distinct keys: a prefix and a digest of the whole.
    return key[:190] + "#" + hashlib.sha256(key.encode()).hexdigest()
