"""Relay wake-ups sent after enqueues commit, one NOTIFY for all that committed meanwhile.

A NOTIFY in the enqueue's own statement makes PostgreSQL hold a lock on the database from
that transaction's commit until its WAL reached the disk, so notifying commits flush one
after another and a tenant's usage row stays locked meanwhile. Under concurrency an
enqueue that runs on a session (its statement commits on its own) therefore calls
:meth:`RelayWakeups.wake` once it committed, and a task of this object sends
``OUTBOX_WAKE``: one NOTIFY for every enqueue that committed while the previous one was on
its way, sent after ``linger`` so that it gathers the commits of that moment.

An enqueue that is the process's only one in flight, with no wake-up on its way, still
NOTIFYs in its statement (:meth:`RelayWakeups.enqueuing` says which): alone it waits for
no other flush, and a wake-up after the commit would reach the relays later.

A wake-up is a hint. One that fails (the database is down) is dropped: the relays poll
every ``JOBCORE_RELAY_POLL_INTERVAL`` and find the rows anyway (the outbox row committed
with the job is what gets it published: docs/design.md, invariant 1). The measurements
behind the split and the linger are in docs/bench/measurements.md ("Relay wake-ups").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

from jobcore.db import Database
from jobcore.errors import DatabaseUnavailable, ServiceStateError
from jobcore.store import outbox_store

log = logging.getLogger(__name__)


# How long a wake-up waits for more enqueues to commit before it goes (see the module).
LINGER_SECONDS = 0.005


class RelayWakeups:
    def __init__(self, db: Database, *, linger: float = LINGER_SECONDS) -> None:
        self.db = db
        self.linger = linger
        self._wanted = False
        self._sending: asyncio.Task[None] | None = None
        self._enqueuing = 0
        self.sent = 0

    @contextlib.contextmanager
    def enqueuing(self) -> Iterator[bool]:
        """Around one enqueue statement on a session: whether that statement should NOTIFY
        itself (True: alone in flight, nothing being sent), else the caller calls
        :meth:`wake` once it committed a new job."""
        alone = self._enqueuing == 0 and self._sending is None
        self._enqueuing += 1
        try:
            yield alone
        finally:
            self._enqueuing -= 1

    def wake(self) -> None:
        """Have the relays woken for rows committed before this call."""
        self._wanted = True
        if self._sending is None:
            self._sending = asyncio.create_task(self._send(), name="relay-wakeups")

    async def _send(self) -> None:
        try:
            while self._wanted:
                await asyncio.sleep(self.linger)  # gathers the enqueues committing meanwhile
                self._wanted = False
                try:
                    async with self.db.session() as session:
                        await outbox_store.wake(session)
                    self.sent += 1
                except (DatabaseUnavailable, ServiceStateError) as exc:
                    log.debug("relay wake-up not sent; the relays poll", extra={"error": str(exc)})
        finally:
            self._sending = None

    async def close(self) -> None:
        """Send what is still wanted (within a second), then stop."""
        task = self._sending
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=1.0)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
