"""When a failed job runs again: exponential backoff with full jitter, as pure code.

The ceiling doubles with every failed attempt (``base * 2**(attempt - 1)``, capped), and
the delay is drawn uniformly from ``[0, ceiling]`` ("full jitter"): retries of jobs that
failed together (a dependency went down) spread out instead of hammering it in waves.
"""

from __future__ import annotations

import random
from collections.abc import Callable

# 2**64 overflows nothing in Python, but there is no point computing past the cap.
_MAX_EXPONENT = 62


def backoff_ceiling(attempt: int, *, base: float, cap: float) -> float:
    """The largest delay after failed attempt number ``attempt`` (1 = the first run)."""
    if attempt < 1:
        raise ValueError("attempt numbers start at 1")
    if base <= 0 or cap <= 0:
        raise ValueError("base and cap must be positive")
    return min(cap, base * 2.0 ** min(attempt - 1, _MAX_EXPONENT))


def backoff_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    rng: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait before the attempt after ``attempt``: uniform in [0, ceiling].

    ``rng`` returns a float in [0, 1); tests pass their own to pin the draw.
    """
    return backoff_ceiling(attempt, base=base, cap=cap) * rng()
