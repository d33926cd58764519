"""The pressure bench's latency histogram: percentiles within its 2 % buckets of the exact
ones, and memory bounded by its bucket count however many samples go in."""

from __future__ import annotations

import random

from services.bench.measure import percentile
from services.bench.pressure_load import BUCKET_GROWTH, BUCKETS, Histogram


def test_percentiles_are_within_a_bucket_of_the_exact_ones() -> None:
    draw = random.Random(7)
    samples = [draw.lognormvariate(-4, 1.5) for _ in range(20_000)]
    histogram = Histogram()
    for sample in samples:
        histogram.add(sample)
    for pct in (50, 95, 99, 100):
        exact = percentile(samples, pct)
        found = histogram.percentile(pct)
        assert found is not None
        assert exact / BUCKET_GROWTH**2 <= found <= exact * BUCKET_GROWTH**2, (pct, exact, found)


def test_memory_is_bounded_by_the_buckets() -> None:
    histogram = Histogram()
    for i in range(200_000):
        histogram.add(i * 1e-5)  # 0 to 2 s, every 10 µs: 200,000 distinct values
    histogram.add(10**9)  # beyond the last bucket: counted in it
    histogram.add(-1.0)  # below the first
    assert len(histogram.counts) <= BUCKETS
    assert histogram.total == 200_002


def test_merged_histograms_count_both_and_an_empty_one_has_no_percentile() -> None:
    first, second = Histogram(), Histogram()
    first.add(0.001, 3)
    second.add(1.0)
    first.merge(second)
    assert first.total == 4
    median, most = first.ms(50), first.ms(100)
    assert median is not None
    assert median < 1.1
    assert most is not None
    assert most >= 1000
    assert Histogram().percentile(50) is None
