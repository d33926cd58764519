"""The start/stop contract every long-running loop shares (relay, consumer, reaper, ...).

``start`` twice is one start; ``stop`` before ``start`` or twice is safe. ``stop`` asks the
loop to finish (``stopping`` is set), waits up to the grace period, then cancels it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from abc import ABC, abstractmethod
from collections.abc import Sequence

log = logging.getLogger(__name__)


class Service(ABC):
    name: str = "service"

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @abstractmethod
    async def run(self) -> None:
        """The loop. Return soon after ``self.stopping`` is set."""

    async def start(self) -> None:
        if self._task is None:
            self.stopping.clear()
            self._task = asyncio.create_task(self.run(), name=self.name)

    async def stop(self, grace: float) -> None:
        task = self._task
        if task is None:
            return
        self.stopping.set()
        if not task.done():
            done, _ = await asyncio.wait({task}, timeout=grace)
            if not done:
                log.warning("%s did not stop within %.1fs; cancelling it", self.name, grace)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.error("%s stopped with an error", self.name, exc_info=task.exception())

    async def wait(self) -> None:
        """Until the loop ends (raises what it raised)."""
        if self._task is not None:
            await self._task

    async def sleep(self, seconds: float) -> bool:
        """Sleep unless stopping; return True if the service is stopping."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), timeout=max(0.0, seconds))
        return self.stopping.is_set()


async def run_until_signalled(services: Sequence[Service], grace: float) -> int:
    """Start the services, run until SIGTERM/SIGINT or until one ends, then stop them all.

    Returns the process exit code: 0 after a signal, 1 if a service ended on its own.
    """
    loop = asyncio.get_running_loop()
    signalled = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled.set)
    try:
        for service in services:
            await service.start()
        waiters = {asyncio.create_task(s.wait(), name=f"wait-{s.name}") for s in services}
        signal_task = asyncio.create_task(signalled.wait(), name="signal")
        done, _ = await asyncio.wait(waiters | {signal_task}, return_when=asyncio.FIRST_COMPLETED)
        code = 0 if signal_task in done else 1
        if code:
            for task in done:
                if task.exception() is not None:
                    log.error("service failed", exc_info=task.exception())
        for service in reversed(services):
            await service.stop(grace)
        for task in waiters | {signal_task}:
            task.cancel()
        await asyncio.gather(*waiters, signal_task, return_exceptions=True)
        return code
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
