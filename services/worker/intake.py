"""Intake: a worker takes deliveries only while a handler slot could start one.

Every worker consumes its job queues at a consumer priority of its own
(``JOBCORE_WORKER_CONSUMER_PRIORITY``, else a random one), so RabbitMQ sends a queue's
messages to one worker while it has room, not a slice of them to each: a trickle is
claimed and recorded in that worker's batches, instead of in N batches a fraction the
size, each costing a statement, a commit and a process wake-up (docs/scaling.md).

A delivery is acknowledged once its claim commits, so a worker whose every slot runs a
long handler still has prefetch room, and under priorities it would go on taking the
queue's messages, to wait there, while other workers idle. So when every slot has been
busy with a running handler for ``PAUSE_AFTER`` the worker cancels its consumers (the
messages stay in the queue for the others) and consumes again as soon as a slot frees.
Jobs shorter than that never pause a worker (a worker of concurrency 1 would otherwise
pay a cancel and a consume per job); the deliveries sent before the pause stay its own,
as any prefetched delivery would, and the prefetch bounds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from jobcore.amqp.deliveries import CONSUME_TIMEOUT, JobQueueConsumer

log = logging.getLogger(__name__)

# Seconds every slot must stay busy before the worker stops taking deliveries.
PAUSE_AFTER = 0.1
# Seconds between attempts to consume again while the broker does not take it.
RESUME_RETRY = 1.0
# Seconds a stop waits for a pause or a resume under way (each bounded by its timeout).
STOP_WAIT = CONSUME_TIMEOUT + 1.0


class Intake:
    def __init__(
        self, broker: JobQueueConsumer, slots: int, *, pause_after: float = PAUSE_AFTER
    ) -> None:
        self.broker = broker
        self.slots = slots
        self.pause_after = pause_after
        self.running = 0
        self.pauses = 0
        self._changed = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Follow the slots from now on (the broker is consuming)."""
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self._follow(), name="worker-intake")

    async def stop(self) -> None:
        """Stop following; a pause or resume under way finishes first, so no consumer is
        left half made or half cancelled for the caller's stop_consuming."""
        task, self._task = self._task, None
        if task is None:
            return
        self._stopping = True
        self._changed.set()
        done, _ = await asyncio.wait({task}, timeout=STOP_WAIT)
        if not done:
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

    async def _changes_within(self, seconds: float | None) -> bool:
        """Wait for a change of the slots (or a stop), at most ``seconds``; whether one came."""
        try:
            await asyncio.wait_for(self._changed.wait(), seconds)
        except TimeoutError:
            return False
        self._changed.clear()
        return True

    async def _follow(self) -> None:
        while not self._stopping:
            try:
                await self._step()
            except Exception:
                log.exception("the worker's intake failed a step; trying again")
                await self._changes_within(RESUME_RETRY)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                # aiormq hands a call the reason its connection closed, which may be a
                # CancelledError that is not ours: the reconnect is awaited, then retried.
                log.info("the broker connection closed under the worker's intake; retrying")
                await self._changes_within(RESUME_RETRY)

    async def _step(self) -> None:
        if not self.full:
            if await self.broker.resume():
                await self._changes_within(None)
            else:  # the broker is away: try again after a while, or on a change
                await self._changes_within(RESUME_RETRY)
        elif not self.broker.consuming:
            await self._changes_within(None)
        elif not await self._changes_within(self.pause_after) and self.full and not self._stopping:
            log.debug("every handler slot busy: no more deliveries until one frees")
            await self.broker.pause()
            self.pauses += 1
