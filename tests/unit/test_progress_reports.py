"""Progress reports: their bounds, the throttle (latest wins, one write per interval, a final
flush), and what a context outside a worker does with progress, fences and transactions."""

from __future__ import annotations

import asyncio
import math
import uuid

import pytest
from pydantic import BaseModel

from jobcore.execution.progress import PROGRESS_MESSAGE_MAX_CHARS, checked_progress
from jobcore.execution.progress_reports import JobProgress
from jobcore.execution.registry import JobContext
from jobcore.kernel.errors import ServiceStateError


class Recorder:
    def __init__(self, *, fail: bool = False) -> None:
        self.writes: list[tuple[float, str | None]] = []
        self.fail = fail

    async def __call__(self, fraction: float, message: str | None) -> None:
        if self.fail:
            raise RuntimeError("database away")
        self.writes.append((fraction, message))


class FrozenClock:
    """Time stands still: once one write went out, the next is always an interval away."""

    def __call__(self) -> float:
        return 1000.0


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.mark.parametrize(
    ("fraction", "message"),
    [(0, None), (1, None), (0.5, ""), (1.0, "x" * PROGRESS_MESSAGE_MAX_CHARS), (0.25, "é ✓")],
)
def test_progress_within_bounds_is_kept(fraction: float, message: str | None) -> None:
    assert checked_progress(fraction, message) == (float(fraction), message)


@pytest.mark.parametrize(
    ("fraction", "message"),
    [
        (-0.01, None),
        (1.01, None),
        (math.nan, None),
        (math.inf, None),
        (True, None),
        ("0.5", None),
        (0.5, "x" * (PROGRESS_MESSAGE_MAX_CHARS + 1)),
        (0.5, "nul \x00 here"),
        (0.5, "lone \udce9 surrogate"),
        (0.5, 42),
    ],
)
def test_progress_out_of_bounds_is_refused(fraction: object, message: object) -> None:
    with pytest.raises(ValueError, match="progress"):
        checked_progress(fraction, message)  # type: ignore[arg-type]


async def test_the_first_report_goes_out_at_once_and_the_latest_wins_after() -> None:
    recorder = Recorder()
    progress = JobProgress(recorder, interval=60.0, clock=FrozenClock())
    progress.report(0.1, "first")
    await settle()
    assert recorder.writes == [(0.1, "first")]
    for i in range(100):
        progress.report(0.2 + i / 1000, f"step {i}")
    await settle()
    assert recorder.writes == [(0.1, "first")]  # the rest waits for the interval
    await progress.close()
    assert recorder.writes == [(0.1, "first"), (0.2 + 99 / 1000, "step 99")]
    progress.report(0.9, "too late")
    await settle()
    assert len(recorder.writes) == 2
    assert progress.writes == 2


async def test_reports_within_one_interval_are_written_once_it_has_passed() -> None:
    recorder = Recorder()
    progress = JobProgress(recorder, interval=0.05)
    progress.report(0.1, None)
    await settle()
    progress.report(0.2, None)
    progress.report(0.3, None)

    async def written() -> None:
        while len(recorder.writes) < 2:
            await asyncio.sleep(0.01)

    await asyncio.wait_for(written(), timeout=10)
    assert recorder.writes == [(0.1, None), (0.3, None)]
    await progress.close()
    assert len(recorder.writes) == 2  # nothing was pending


async def test_a_failing_write_does_not_reach_the_handler() -> None:
    recorder = Recorder(fail=True)
    progress = JobProgress(recorder, interval=60.0, clock=FrozenClock())
    progress.report(0.1, None)
    await settle()
    progress.report(0.2, None)
    await progress.close()
    assert recorder.writes == []
    assert progress.writes == 0


async def test_close_right_after_a_report_writes_it_without_waiting_out_the_throttle() -> None:
    # The report's loop task has not started when close() comes: it must not begin the
    # interval's sleep (60 s here) that the close would then wait for.
    recorder = Recorder()
    progress = JobProgress(recorder, interval=60.0, clock=FrozenClock())
    progress.report(0.1, None)
    await settle()
    progress.report(0.2, "done")
    async with asyncio.timeout(10):  # not wait_for: its task would let the loop start first
        await progress.close()
    assert recorder.writes == [(0.1, None), (0.2, "done")]


async def test_abandoned_progress_writes_nothing_more() -> None:
    recorder = Recorder()
    progress = JobProgress(recorder, interval=60.0, clock=FrozenClock())
    progress.report(0.1, None)
    await settle()
    progress.report(0.2, None)
    progress.abandon()
    await progress.close()
    assert recorder.writes == [(0.1, None)]


class Payload(BaseModel):
    pass


async def _no_heartbeat() -> None:
    return None


def _context(**kwargs: object) -> JobContext[Payload]:
    return JobContext(
        job_id=uuid.uuid4(),
        job_type="t",
        payload=Payload(),
        attempt=2,
        max_attempts=3,
        idempotency_key="k",
        heartbeat=_no_heartbeat,
        **kwargs,  # type: ignore[arg-type]
    )


async def test_a_context_outside_a_worker_checks_progress_but_has_no_fence_or_transaction() -> None:
    ctx = _context()
    await ctx.progress(0.5, "fine")  # nowhere to go: dropped
    with pytest.raises(ValueError, match="progress"):
        await ctx.progress(2.0)
    with pytest.raises(ServiceStateError):
        _ = ctx.fence
    with pytest.raises(ServiceStateError):
        ctx.transaction()


async def test_a_workers_context_hands_reports_on_and_names_its_fence() -> None:
    reports: list[tuple[float, str | None]] = []
    token = uuid.uuid4()
    ctx = _context(lease_token=token, report_progress=lambda f, m: reports.append((f, m)))
    await ctx.progress(1, "done")
    assert reports == [(1.0, "done")]
    assert (ctx.fence.job_id, ctx.fence.attempt, ctx.fence.lease_token) == (ctx.job_id, 2, token)


def test_the_schema_bounds_a_progress_message_as_the_handler_context_does() -> None:
    # Two copies, so that the execution layer loads no schema (and no SQLAlchemy dialect)
    # with a job type: the check constraint must refuse exactly what ctx.progress refuses.
    from jobcore.database import schema

    assert schema.PROGRESS_MESSAGE_MAX_CHARS == PROGRESS_MESSAGE_MAX_CHARS
