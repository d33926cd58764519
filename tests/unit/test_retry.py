"""Backoff with full jitter (jobcore.kernel.retry): bounds, growth, cap, and that it is jittered."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobcore.kernel.retry import backoff_ceiling, backoff_delay


def test_ceiling_doubles_per_attempt_until_the_cap() -> None:
    ceilings = [backoff_ceiling(n, base=1.0, cap=30.0) for n in range(1, 8)]
    assert ceilings == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_huge_attempt_numbers_stay_at_the_cap() -> None:
    assert backoff_ceiling(10_000, base=0.5, cap=600.0) == 600.0


def test_delay_spans_zero_to_the_ceiling() -> None:
    assert backoff_delay(3, base=1.0, cap=60.0, rng=lambda: 0.0) == 0.0
    assert backoff_delay(3, base=1.0, cap=60.0, rng=lambda: 0.5) == 2.0
    assert backoff_delay(3, base=1.0, cap=60.0, rng=lambda: 0.999999) == pytest.approx(4.0, 1e-5)


def test_delays_are_jittered_across_the_whole_range() -> None:
    rng = random.Random(7)
    draws = [backoff_delay(4, base=1.0, cap=60.0, rng=rng.random) for _ in range(2000)]
    assert min(draws) >= 0.0
    assert max(draws) <= 8.0
    # Full jitter: the draws cover the range, not a band near the ceiling.
    assert min(draws) < 0.1
    assert max(draws) > 7.9
    assert 3.5 < sum(draws) / len(draws) < 4.5
    assert len(set(draws)) == len(draws)


@given(
    attempt=st.integers(min_value=1, max_value=200),
    base=st.floats(min_value=0.001, max_value=100),
    cap=st.floats(min_value=0.001, max_value=10_000),
    draw=st.floats(min_value=0.0, max_value=0.999999),
)
def test_delay_never_exceeds_cap_or_ceiling(
    attempt: int, base: float, cap: float, draw: float
) -> None:
    delay = backoff_delay(attempt, base=base, cap=cap, rng=lambda: draw)
    assert 0.0 <= delay <= backoff_ceiling(attempt, base=base, cap=cap) <= cap


@pytest.mark.parametrize(("attempt", "base", "cap"), [(0, 1.0, 1.0), (1, 0.0, 1.0), (1, 1.0, -1.0)])
def test_bad_arguments_are_refused(attempt: int, base: float, cap: float) -> None:
    with pytest.raises(ValueError, match=r"start at 1|must be positive"):
        backoff_ceiling(attempt, base=base, cap=cap)
