"""Listens for cancel requests (``NOTIFY jobcore_cancel, '<job id>'``) and interrupts handlers.

The API sets ``cancel_requested_at`` on a running job and notifies; this listener
interrupts the handler at once if this worker runs the job. A NOTIFY can be missed (the
connection was down, or PgBouncer in transaction mode drops LISTEN), so heartbeats also
read ``cancel_requested_at``: the listener is the fast path, never the only one.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable

from jobcore.db import Database, execute
from jobcore.errors import DatabaseUnavailable
from jobcore.service import Service
from jobcore.sql.jobs import JOB_CANCEL_LISTEN, JOB_CANCEL_UNLISTEN

log = logging.getLogger(__name__)

# How long one wait for notifications lasts before the loop checks whether to stop.
POLL_SECONDS = 0.5


class CancelListener(Service):
    name = "worker-cancel-listener"

    def __init__(self, db: Database, on_cancel: Callable[[uuid.UUID], object]) -> None:
        super().__init__()
        self.db = db
        self.on_cancel = on_cancel
        self.listening = False

    async def run(self) -> None:
        trouble_logged = False
        while not self.stopping.is_set():
            try:
                async with self.db.connection() as conn:
                    await execute(conn, JOB_CANCEL_LISTEN({}))
                    self.listening = True
                    if trouble_logged:
                        log.info("listening for cancel requests again")
                        trouble_logged = False
                    try:
                        while not self.stopping.is_set():
                            async for notify in conn.notifies(timeout=POLL_SECONDS):
                                self._dispatch(notify.payload)
                    finally:
                        self.listening = False
                        if not conn.closed:
                            # The pool must not hand out a connection that still listens.
                            with contextlib.suppress(Exception):
                                await execute(conn, JOB_CANCEL_UNLISTEN({}))
            except DatabaseUnavailable as exc:
                if not trouble_logged:
                    log.warning(
                        "cancel listener disconnected; retrying (heartbeats still see cancels)",
                        extra={"error": str(exc)},
                    )
                    trouble_logged = True
                if await self.sleep(1.0):
                    return

    def _dispatch(self, payload: str) -> None:
        try:
            job_id = uuid.UUID(payload.strip())
        except ValueError:
            log.warning(
                "ignoring a cancel request that is not a job id", extra={"payload": payload}
            )
            return
        self.on_cancel(job_id)
