"""The quota arithmetic (GCRA rate limit, caps, header values) and the CLI's quota values,
as pure code with Hypothesis."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobcore.kernel.quotas import MAX_RATE, MIN_RATE, RateLimit, under_cap
from jobcore.usecases.quotas import InvalidQuota, check_quota
from services.cli.tenants import (
    InvalidValue,
    format_count,
    format_rate,
    parse_count,
    parse_rate,
)

rates = st.floats(min_value=0.01, max_value=10_000, allow_nan=False, allow_infinity=False)
bursts = st.integers(min_value=1, max_value=1000)
# Increasing request times (seconds), as gaps from the previous one.
gaps = st.lists(
    st.floats(min_value=0, max_value=5, allow_nan=False, allow_infinity=False), max_size=200
)


def replay(limit: RateLimit, times: list[float]) -> list[bool]:
    tat: float | None = None
    admitted = []
    for now in times:
        ok, tat = limit.admit(tat, now)
        admitted.append(ok)
    return admitted


def timeline(start: float, gap_list: list[float]) -> list[float]:
    times, now = [], start
    for gap in gap_list:
        now += gap
        times.append(now)
    return times


@given(rates, bursts, gaps)
def test_no_window_admits_more_than_the_burst_plus_what_the_rate_refills(
    rate: float, burst: int, gap_list: list[float]
) -> None:
    limit = RateLimit(rate, burst)
    times = timeline(1_000.0, gap_list)
    admitted = [t for t, ok in zip(times, replay(limit, times), strict=True) if ok]
    for i, start in enumerate(admitted):
        for j in range(i, len(admitted)):
            window = admitted[j] - start
            assert j - i + 1 <= burst + math.floor(window * rate + 1e-6)


@given(rates, bursts)
def test_a_full_bucket_admits_exactly_the_burst_at_once(rate: float, burst: int) -> None:
    limit = RateLimit(rate, burst)
    assert replay(limit, [50.0] * (burst + 3)) == [True] * burst + [False] * 3


@given(rates, bursts, gaps)
def test_remaining_is_what_would_be_admitted_now_and_retry_after_is_enough(
    rate: float, burst: int, gap_list: list[float]
) -> None:
    limit = RateLimit(rate, burst)
    tat: float | None = None
    now = 10.0
    for gap in gap_list:
        now += gap
        _, tat = limit.admit(tat, now)
    state = limit.state(tat, now)
    probe_tat, admitted_now = tat, 0
    while admitted_now <= burst:
        ok, probe_tat = limit.admit(probe_tat, now)
        if not ok:
            break
        admitted_now += 1
    assert state.remaining == admitted_now
    if admitted_now == 0:
        assert state.retry_after >= 1
        assert limit.admit(tat, now + state.retry_after)[0]
    else:
        assert state.retry_after == 0
    # After `reset` seconds the whole burst is available again.
    assert limit.state(tat, now + state.reset).remaining == burst


@given(rates, bursts, st.floats(min_value=0, max_value=1e6, allow_nan=False))
def test_headers_follow_the_draft_syntax(rate: float, burst: int, now: float) -> None:
    limit = RateLimit(rate, burst)
    _, tat = limit.admit(None, now)
    assert re.fullmatch(rf'"enqueue";q={burst};w=[1-9]\d*', limit.policy_header())
    assert re.fullmatch(r'"enqueue";r=\d+;t=\d+', limit.state(tat, now).header())


@given(st.integers(min_value=0, max_value=10**6), st.integers(min_value=0, max_value=10**6))
def test_a_cap_admits_below_it_and_zero_is_no_cap(used: int, cap: int) -> None:
    assert under_cap(used, cap) == (cap == 0 or used < cap)


def test_an_unlimited_rate_admits_everything() -> None:
    assert replay(RateLimit(0, 1), [1.0] * 1000) == [True] * 1000


@given(
    st.one_of(
        st.just(0.0),
        st.floats(min_value=MIN_RATE, max_value=MAX_RATE, allow_nan=False, allow_infinity=False),
    )
)
def test_a_shown_rate_reads_back_and_is_accepted(rate: float) -> None:
    shown = format_rate(rate)
    parsed = parse_rate(shown)
    assert parsed is not None
    assert math.isclose(parsed, rate, rel_tol=1e-9)
    check_quota("enqueue_rate", parsed)


@given(st.floats(min_value=1e-300, max_value=MIN_RATE * 0.999))
def test_a_rate_too_slow_to_hold_is_refused(rate: float) -> None:
    with pytest.raises(InvalidQuota):
        check_quota("enqueue_rate", rate)


@given(
    st.integers(min_value=0, max_value=10**6),
    st.sampled_from([("s", 1), ("min", 60), ("h", 3600)]),
)
def test_rates_per_unit(n: int, unit: tuple[str, int]) -> None:
    assert parse_rate(f"{n}/{unit[0]}") == pytest.approx(n / unit[1])


@given(st.integers(min_value=0, max_value=10**9))
def test_a_shown_count_reads_back(n: int) -> None:
    assert parse_count("--max-unfinished", format_count(n)) == n


def test_words() -> None:
    assert (parse_rate("default"), parse_count("--x", "DEFAULT")) == (None, None)
    assert (parse_rate("unlimited"), parse_count("--x", "unlimited")) == (0, 0)


@given(st.text(max_size=20))
def test_anything_else_is_refused_or_a_valid_value(text: str) -> None:
    for parse in (parse_rate, lambda t: parse_count("--x", t)):
        try:
            value = parse(text)
        except InvalidValue as exc:
            message = str(exc)
        else:
            assert value is None or (value >= 0 and math.isfinite(value))
            continue
        assert "\n" not in message
