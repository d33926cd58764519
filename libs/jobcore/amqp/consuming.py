"""The loop every queue consumer shares: start, one task per delivery, stop, drain.

- **Start**: connect and consume; while the broker cannot be reached, try again every
  second (warned once) until it can or the service stops. Once consuming, the robust
  connection reconnects by itself (:mod:`jobcore.amqp.deliveries`).
- **Deliveries**: each runs in a task of its own, up to the prefetch at once. One that
  arrives once the service is stopping is left unacknowledged: the broker requeues it when
  the channel closes.
- **Stop**: no new deliveries are asked for; those in flight have the grace period to
  finish, then :meth:`DeliveryConsumer.grace_over` (the worker interrupts its handlers,
  which give their leases back), then they are cancelled. Unsettled ones stay
  unacknowledged, and closing the connection, last, hands them to another consumer.
"""

from __future__ import annotations

import asyncio
import logging
from abc import abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from jobcore.amqp.deliveries import Delivery, JobQueueConsumer
from jobcore.kernel.errors import BrokerUnavailable
from jobcore.kernel.startstop import Service

log = logging.getLogger(__name__)

T = TypeVar("T")

# Seconds between tries while the broker (or the database) is away.
RETRY_EVERY = 1.0
# Seconds cancelled deliveries may take to end before the connection closes under them.
CANCEL_WAIT = 5.0


class DeliveryConsumer(Service):
    """Consumes ``broker``'s queues with at most ``prefetch`` deliveries unsettled, as
    consumers of ``priority``; :meth:`handle` settles each delivery. ``grace``: the
    seconds deliveries in flight have to finish once stopping."""

    # What the consumer's log lines call it.
    label = "consumer"

    def __init__(
        self,
        broker: JobQueueConsumer,
        *,
        prefetch: int,
        grace: float,
        priority: int | None = None,
    ) -> None:
        super().__init__()
        self.broker = broker
        self.prefetch = prefetch
        self.priority = priority
        self.grace = grace
        # Between a successful start and the stop: what /readyz and /healthz report.
        self.consuming = False
        self._deliveries: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return len(self._deliveries)

    @abstractmethod
    async def handle(self, message: Delivery) -> None:
        """Settle ``message``, whatever goes wrong (its own task; cancelled at the end of
        the grace period)."""

    def received(self, message: Delivery) -> None:
        """A delivery arrived and will be handled (for metrics)."""

    async def started(self) -> None:
        """Consuming now."""

    async def stop_taking(self) -> None:
        """Stop what asks the broker for deliveries, before the consumers are cancelled
        (called again, as a safety net, when the loop ends)."""

    async def grace_over(self) -> None:
        """The grace period ended with deliveries still in flight; they are cancelled
        after this returns."""

    async def closed(self) -> None:
        """The broker connection is closed: release what else the consumer holds."""

    async def run(self) -> None:
        try:
            started = await self.retry_while_unavailable(
                self._start_consuming,
                BrokerUnavailable,
                f"{self.label}: broker unavailable; retrying",
            )
            if not started:
                return
            self.consuming = True
            await self.started()
            await self.stopping.wait()
            log.info(
                "%s stopping: no new deliveries", self.label, extra={"in_flight": self.in_flight}
            )
            self.consuming = False
            await self.stop_taking()
            await self.broker.stop_consuming()
            await self._drain()
        finally:
            self.consuming = False
            await self.stop_taking()
            await self.broker.close()
            await self.closed()

    async def _start_consuming(self) -> bool:
        await self.broker.start(self._on_delivery, prefetch=self.prefetch, priority=self.priority)
        return True

    async def _on_delivery(self, message: Delivery) -> None:
        if self.stopping.is_set():
            return  # left unacknowledged: the broker requeues it when the channel closes
        self.received(message)
        self.track(asyncio.create_task(self.handle(message), name=f"{self.name}-delivery"))

    def track(self, task: asyncio.Task[None]) -> None:
        """``task`` is work in flight: stopping waits for it through the grace period (then
        calls :meth:`grace_over`), and cancels it after."""
        self._deliveries.add(task)
        task.add_done_callback(self._deliveries.discard)

    async def wait_for_deliveries(self, timeout: float) -> None:
        """Until no delivery is in flight, for ``timeout`` seconds at the most."""
        if self._deliveries:
            await asyncio.wait(set(self._deliveries), timeout=timeout)

    async def _drain(self) -> None:
        """Let the deliveries in flight finish within the grace period, then end them."""
        await self.wait_for_deliveries(self.grace)
        if self._deliveries:
            await self.grace_over()
        left = set(self._deliveries)
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left, timeout=CANCEL_WAIT)

    async def retry_while_unavailable(
        self,
        operation: Callable[[], Awaitable[T]],
        unavailable: type[Exception] | tuple[type[Exception], ...],
        warning: str,
        extra: dict[str, Any] | None = None,
    ) -> T | None:
        """``operation``'s answer, tried again every second while it raises
        ``unavailable`` (warned once, with ``extra``); None if the service stops first.
        A delivery waits here rather than being requeued: every requeue counts toward the
        quorum queue's delivery limit, and would dead-letter good messages."""
        warned = False
        while True:
            try:
                return await operation()
            except unavailable as exc:
                if not warned:
                    log.warning(warning, extra={**(extra or {}), "error": str(exc)})
                    warned = True
            if await self.sleep(RETRY_EVERY):
                return None
