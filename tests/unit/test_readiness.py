"""When a consumer counts as unable to make progress (/readyz), and when it recovers."""

from services.worker.readiness import ERROR_STREAK, ConsumerReadiness


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_delivery_waiting_longer_than_the_limit_with_nothing_served_is_a_stall() -> None:
    clock = Clock()
    progress = ConsumerReadiness(10.0, clock=clock)
    clock.now += 3600  # idle for an hour: not a stall, nothing waits
    assert progress.trouble() is None
    with progress.waiting():
        clock.now += 10.0
        assert progress.trouble() is None  # counted from when it started waiting
        clock.now += 0.5
        reason = progress.trouble()
        assert reason is not None
        assert reason.startswith("1 deliveries waiting for the database")
        progress.progressed()  # another delivery's claim went through
        assert progress.trouble() is None
        clock.now += 10.5
        assert progress.trouble() is not None
    assert progress.trouble() is None  # nothing waits any more


def test_the_oldest_waiting_delivery_counts() -> None:
    clock = Clock()
    progress = ConsumerReadiness(5.0, clock=clock)
    with progress.waiting():
        clock.now += 4.0
        with progress.waiting():
            clock.now += 2.0
            assert progress.trouble() == "2 deliveries waiting for the database, none served for 6s"


def test_unexpected_errors_in_a_row_are_trouble_until_progress_or_quiet() -> None:
    clock = Clock()
    progress = ConsumerReadiness(10.0, clock=clock)
    for _ in range(ERROR_STREAK - 1):
        progress.failed()
    assert progress.trouble() is None
    progress.failed()
    assert progress.trouble() == f"the last {ERROR_STREAK} deliveries ended in unexpected errors"
    progress.progressed()
    assert progress.trouble() is None

    for _ in range(ERROR_STREAK):
        progress.failed()
    clock.now += 10.0
    assert progress.trouble() is not None
    clock.now += 0.1  # no error for longer than the limit: green by itself
    assert progress.trouble() is None
