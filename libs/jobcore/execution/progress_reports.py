"""One running job's progress reports (``await ctx.progress(...)``), throttled.

A handler may report progress in a tight loop; each write is an UPDATE of the job row and
a NOTIFY every API process hears. So the latest report wins and is written at most once
per :data:`~jobcore.execution.progress.PROGRESS_FLUSH_INTERVAL` (the first at once), in the
background: reporting never waits for the database. Before the attempt's outcome is
written the executor flushes what is pending (:meth:`JobProgress.close`), so the last
report is never lost to the throttle. Progress is best effort: a write that fails is
logged once and the next report tries again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from jobcore.execution.progress import PROGRESS_FLUSH_INTERVAL

log = logging.getLogger(__name__)

WriteProgress = Callable[[float, str | None], Awaitable[None]]


class JobProgress:
    def __init__(
        self,
        write: WriteProgress,
        *,
        interval: float = PROGRESS_FLUSH_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        log_fields: dict[str, Any] | None = None,
    ) -> None:
        self._write = write
        self.interval = interval
        self._clock = clock
        self._log_fields = log_fields or {}
        self._pending: tuple[float, str | None] | None = None
        self._last_write: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._sleeping = False
        # Set while a flush waits for the loop: a loop task that has not started yet must
        # not begin a throttle sleep the flush would then wait out.
        self._hurry = False
        self._closed = False
        self._failure_logged = False
        self.writes = 0

    def report(self, fraction: float, message: str | None) -> None:
        """Note the latest progress; it is written within one interval (dropped once closed)."""
        if self._closed:
            return
        self._pending = (fraction, message)
        if self._task is None:
            self._task = asyncio.create_task(self._flush_loop(), name="job-progress")

    def _wait_before_next(self) -> float:
        if self._last_write is None:
            return 0.0
        return max(0.0, self._last_write + self.interval - self._clock())

    async def _flush_loop(self) -> None:
        try:
            while self._pending is not None:
                delay = self._wait_before_next()
                if delay > 0 and not self._hurry:
                    self._sleeping = True
                    try:
                        await asyncio.sleep(delay)  # the throttle: one write per interval
                    finally:
                        self._sleeping = False
                await self._write_pending()
        finally:
            self._task = None

    async def _write_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        self._last_write = self._clock()
        try:
            await self._write(*pending)
            self.writes += 1
        except Exception as exc:  # best effort: the job's outcome does not depend on it
            if not self._failure_logged:
                self._failure_logged = True
                log.warning(
                    "could not write the job's progress",
                    extra={**self._log_fields, "error": str(exc)},
                )

    async def flush(self) -> None:
        """Write what is pending now (waiting for a write in flight), past the throttle."""
        task = self._task
        if task is not None:
            self._hurry = True
            try:
                if self._sleeping:
                    task.cancel()
                # Waits without raising the task's cancellation (or taking on our own).
                await asyncio.wait([task])
            finally:
                self._hurry = False
        await self._write_pending()

    async def close(self) -> None:
        """The final flush: write what is pending; later reports are dropped."""
        self._closed = True
        await self.flush()

    def abandon(self) -> None:
        """Drop what is pending and stop (the attempt is over without a final flush)."""
        self._closed = True
        self._pending = None
        if self._task is not None:
            self._task.cancel()
