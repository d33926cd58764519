"""Intake: a worker takes deliveries only while a handler slot could start one.

Every worker consumes its job queues at a consumer priority of its own
(``JOBCORE_WORKER_CONSUMER_PRIORITY``, else a random one), so RabbitMQ sends a queue's
messages to one worker while it has room, not a slice of them to each: a trickle is
claimed and recorded in that worker's batches, instead of in N batches a fraction the
size, each costing a statement, a commit and a process wake-up (docs/scaling.md).

A delivery is acknowledged once its claim commits, so a worker whose every slot runs a
long handler still has prefetch room, and under priorities it would go on taking the
queue's messages, to wait there, while other workers idle. So when every slot is busy
with a running handler the worker cancels its consumers (the messages stay in the queue
for the others) and consumes again as soon as a slot frees. The deliveries already sent
when it paused stay its own, as they would without pausing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from jobcore.amqp.deliveries import JobQueueConsumer

log = logging.getLogger(__name__)

# Seconds between attempts to consume again while the broker does not take it.
RESUME_RETRY = 1.0


class Intake:
    def __init__(self, broker: JobQueueConsumer, slots: int) -> None:
        self.broker = broker
        self.slots = slots
        self.running = 0
        self.pauses = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Follow the slots from now on (the broker is consuming)."""
        if self._task is None:
            self._task = asyncio.create_task(self._follow(), name="worker-intake")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def handler_started(self) -> None:
        self.running += 1
        if self.running >= self.slots:
            self._changed.set()

    def handler_ended(self) -> None:
        self.running -= 1
        if self.running == self.slots - 1:
            self._changed.set()

    @property
    def full(self) -> bool:
        return self.running >= self.slots

    async def _follow(self) -> None:
        retrying = False
        while True:
            if retrying:  # the broker is away: try again after a while, or on a change
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), RESUME_RETRY)
            else:
                await self._changed.wait()
            self._changed.clear()
            retrying = False
            if self.full:
                if self.broker.consuming:
                    self.pauses += 1
                    log.debug("every handler slot busy: no more deliveries until one frees")
                    await self.broker.pause()
            else:
                retrying = not await self.broker.resume()
