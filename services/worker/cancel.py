"""Hears cancel requests (``NOTIFY jobcore_cancel, '<job id>'``) and interrupts handlers;
with direct pickup, on the same connection, the enqueues' outbox NOTIFYs too
(``on_outbox``: services/worker/direct.py).

The API sets ``cancel_requested_at`` on a running job and notifies; this listener
interrupts the handler at once if this worker runs the job. A NOTIFY can be missed (the
connection was down), so heartbeats also read ``cancel_requested_at``: the listener is
the fast path, never the only one.

Behind PgBouncer in transaction mode with no direct URL to listen on
(``JOBCORE_LISTEN_DATABASE_URL``), LISTEN hears nothing: the listener polls instead,
every ``JOBCORE_NOTIFY_POLL_INTERVAL``, asking which of the jobs this worker runs have a
cancel request (one primary-key probe per running job, no query while none runs). A
heartbeat alone would take up to a third of the job type's lease.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Collection

from jobcore.database.gateway import Database
from jobcore.database.store import job_store, outbox_store
from jobcore.kernel.channels import OUTBOX_CHANNEL
from jobcore.kernel.errors import DatabaseUnavailable
from jobcore.kernel.startstop import Service

log = logging.getLogger(__name__)

# How long one wait for notifications lasts before the loop checks whether to stop.
POLL_SECONDS = 0.5


class CancelListener(Service):
    name = "worker-cancel-listener"

    def __init__(
        self,
        db: Database,
        on_cancel: Callable[[uuid.UUID], object],
        running: Callable[[], Collection[uuid.UUID]] = tuple,
        on_outbox: Callable[[], object] | None = None,
    ) -> None:
        super().__init__()
        self.db = db
        self.on_cancel = on_cancel
        # Called on each outbox NOTIFY (an enqueue committed), when given.
        self.on_outbox = on_outbox
        # The jobs this worker runs now (what the polling mode asks about).
        self.running_jobs = running
        self.listening = False
        self.polling = db.settings.listen_url is None

    async def run(self) -> None:
        if self.polling:
            await self._poll()
        else:
            await self._listen()

    async def _listen(self) -> None:
        trouble_logged = False
        while not self.stopping.is_set():
            try:
                async with self.db.listen_connection() as conn:
                    await job_store.listen_cancel(conn)
                    if self.on_outbox is not None:
                        await outbox_store.listen(conn)
                    self.listening = True
                    if trouble_logged:
                        log.info("listening for cancel requests again")
                        trouble_logged = False
                    try:
                        while not self.stopping.is_set():
                            async for notify in conn.notifies(timeout=POLL_SECONDS):
                                if notify.channel == OUTBOX_CHANNEL:
                                    if self.on_outbox is not None:
                                        self.on_outbox()
                                else:
                                    self._dispatch(notify.payload)
                    finally:
                        self.listening = False
                        if not conn.closed:
                            # The pool must not hand out a connection that still listens.
                            with contextlib.suppress(Exception):
                                await job_store.unlisten_cancel(conn)
                                if self.on_outbox is not None:
                                    await outbox_store.unlisten(conn)
            except DatabaseUnavailable as exc:
                if not trouble_logged:
                    log.warning(
                        "cancel listener disconnected; retrying (heartbeats still see cancels)",
                        extra={"error": str(exc)},
                    )
                    trouble_logged = True
                if await self.sleep(1.0):
                    return

    async def _poll(self) -> None:
        interval = self.db.settings.notify_poll_interval
        log.info("no LISTEN connection: polling for cancel requests", extra={"every": interval})
        trouble_logged = False
        while not await self.sleep(interval):
            ids = list(self.running_jobs())
            if not ids:
                continue
            try:
                async with self.db.connection() as conn:
                    rows = await job_store.cancel_requested(conn, {"ids": ids})
            except DatabaseUnavailable as exc:
                if not trouble_logged:
                    log.warning(
                        "polling for cancel requests failed; retrying (heartbeats still "
                        "see cancels)",
                        extra={"error": str(exc)},
                    )
                    trouble_logged = True
                continue
            trouble_logged = False
            for row in rows:
                self.on_cancel(row["id"])

    def _dispatch(self, payload: str) -> None:
        try:
            job_id = uuid.UUID(payload.strip())
        except ValueError:
            log.warning(
                "ignoring a cancel request that is not a job id", extra={"payload": payload}
            )
            return
        self.on_cancel(job_id)
