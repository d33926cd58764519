"""Long-poll waiters: ``GET /jobs/{id}?wait=`` parks on an asyncio event, not on a
database connection.

One LISTEN connection per API process (its own, outside the pool: it is held for the
process's life) hears ``jobcore_job_done`` — sent in the same statement that makes a job
terminal — and sets the events of that job's waiters. It also hears
``jobcore_job_progress`` (sent when a worker writes a running job's progress, at most a
few times a second per job), which wakes only the waiters that asked for progress
(``?on=progress``). A waiter holds no connection while
it waits: it reads the job once (a short pooled checkout) after registering, so a NOTIFY
that arrives after that read wakes it, and once more after waking or when its wait ends.
Re-reads are batched (:class:`JobReads`): waiters woken together — jobs finishing in a
burst — share one checkout and one statement instead of queueing for the pool one by one.

A NOTIFY can be missed (the listener was reconnecting): every waiter is woken to re-read
when the listener (re)connects, waiters re-read every :data:`FALLBACK_POLL_SECONDS` while
it is down, and each wait ends with a read, so a missed notification costs at most the
rest of one wait, never a hang.

Behind PgBouncer in transaction mode with no direct URL to listen on
(``JOBCORE_LISTEN_DATABASE_URL``), LISTEN hears nothing, so there is no listener: every
``JOBCORE_NOTIFY_POLL_INTERVAL`` all parked waiters are woken together and re-read in one
batched statement (per :data:`MAX_READ_BATCH` waiters), none while nobody waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterator

import psycopg
from prometheus_client import CollectorRegistry, Gauge
from psycopg.rows import DictRow

from jobcore.database.gateway import Database
from jobcore.kernel.channels import JOB_PROGRESS_CHANNEL
from jobcore.kernel.settings import Settings
from jobcore.kernel.startstop import Service
from jobcore.usecases.waiting import WaitedJob, listen_for_jobs, read_waited_jobs

log = logging.getLogger(__name__)

APPLICATION_NAME = "jobcore-api-listener"
# How often the listener loop looks up from its notifications (to stop, or to ping).
NOTIFY_TIMEOUT = 1.0
# A listener that heard nothing for this long checks its connection is still alive.
PING_SECONDS = 30.0
PING_TIMEOUT = 5.0
RECONNECT_BASE = 0.2
RECONNECT_CAP = 5.0
# While the listener is down, waiters re-read their job this often.
FALLBACK_POLL_SECONDS = 1.0
# Most jobs one re-read statement asks for.
MAX_READ_BATCH = 500


class JobReads:
    """Re-reads of waited-for jobs, batched: whatever is asked while one statement runs
    goes out together in the next (one at a time, so a lone wake-up is read at once)."""

    def __init__(self) -> None:
        self._queue: list[tuple[WaitedJob, asyncio.Future[DictRow | None]]] = []
        self._draining: asyncio.Task[None] | None = None

    async def read(self, db: Database, tenant: str, job_id: uuid.UUID) -> DictRow | None:
        """The tenant's job as it is now (None if the tenant has no such job)."""
        future: asyncio.Future[DictRow | None] = asyncio.get_running_loop().create_future()
        self._queue.append(((tenant, job_id), future))
        if self._draining is None or self._draining.done():
            self._draining = asyncio.create_task(self._drain(db), name="long-poll-reads")
        return await future

    async def _drain(self, db: Database) -> None:
        while self._queue:
            batch, self._queue = self._queue[:MAX_READ_BATCH], self._queue[MAX_READ_BATCH:]
            wanted = list({key for key, _ in batch})
            try:
                async with db.connection() as conn:
                    rows = await read_waited_jobs(conn, wanted)
            except Exception as exc:  # each waiter answers it (a 503 for DatabaseUnavailable)
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for key, future in batch:
                if not future.done():
                    future.set_result(rows.get(key))


class JobWaiters(Service):
    name = "api-job-waiters"

    def __init__(self, settings: Settings, *, registry: CollectorRegistry | None = None) -> None:
        super().__init__()
        self.settings = settings
        self._events: dict[uuid.UUID, set[asyncio.Event]] = {}
        # The subset of those events whose waiters also wake on progress.
        self._progress_events: dict[uuid.UUID, set[asyncio.Event]] = {}
        self.listening = False
        self._gauge = (
            Gauge(
                "jobcore_api_long_poll_waiters",
                "GET /jobs/{id}?wait= requests parked now, waiting for their job to end "
                "(holding no database connection).",
                registry=registry,
            )
            if registry is not None
            else None
        )
        self._count = 0
        self.reads = JobReads()
        # No LISTEN connection to be had: a ticker wakes every waiter instead.
        self.polling = settings.listen_url is None

    @property
    def waiting(self) -> int:
        """Requests parked now (between their reads, holding no connection)."""
        return self._count

    @contextlib.contextmanager
    def subscribe(self, job_id: uuid.UUID, *, progress: bool = False) -> Iterator[asyncio.Event]:
        """An event set when the job may have become terminal, or with ``progress`` also
        when its progress may have changed (re-read it to know)."""
        event = asyncio.Event()
        kinds = [self._events, self._progress_events] if progress else [self._events]
        for by_job in kinds:
            by_job.setdefault(job_id, set()).add(event)
        try:
            yield event
        finally:
            for by_job in kinds:
                events = by_job.get(job_id)
                if events is not None:
                    events.discard(event)
                    if not events:
                        del by_job[job_id]

    async def park(self, event: asyncio.Event, timeout: float) -> bool:
        """Wait for ``event`` at most ``timeout`` seconds (less while the listener is down);
        True if it was set. The caller re-reads the job either way."""
        if not self.listening and not self.polling:
            timeout = min(timeout, FALLBACK_POLL_SECONDS)
        self._count += 1
        if self._gauge is not None:
            self._gauge.inc()
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                await event.wait()
        except TimeoutError:
            return False
        finally:
            self._count -= 1
            if self._gauge is not None:
                self._gauge.dec()
        event.clear()
        return True

    def notify(self, job_id: uuid.UUID) -> None:
        for event in self._events.get(job_id, ()):
            event.set()

    def notify_progress(self, job_id: uuid.UUID) -> None:
        for event in self._progress_events.get(job_id, ()):
            event.set()

    def wake_all(self) -> None:
        for events in self._events.values():
            for event in events:
                event.set()

    # --- the listener ------------------------------------------------------------------

    async def run(self) -> None:
        if self.polling:
            await self._tick()
            return
        failures = 0
        try:
            while not self.stopping.is_set():
                try:
                    await self._listen()
                    failures = 0
                except (psycopg.Error, OSError, TimeoutError) as exc:
                    failures += 1
                    if failures == 1:
                        log.warning(
                            "long-poll listener disconnected; waiters poll until it is back",
                            extra={"error": str(exc).strip().splitlines()[0] if str(exc) else ""},
                        )
                if self.listening:
                    self.listening = False
                    self.wake_all()
                delay = min(RECONNECT_CAP, RECONNECT_BASE * 2 ** min(failures, 10))
                if await self.sleep(delay):
                    break
        finally:
            self.listening = False
            self.wake_all()

    async def _tick(self) -> None:
        """Wake every parked waiter each poll interval: woken together, their re-reads
        share statements (JobReads), and each waiter's wait still ends with a read."""
        interval = self.settings.notify_poll_interval
        log.info("no LISTEN connection: long-polls re-read their jobs", extra={"every": interval})
        try:
            while not await self.sleep(interval):
                if self._count:
                    self.wake_all()
        finally:
            self.wake_all()

    async def _listen(self) -> None:
        assert self.settings.listen_url is not None  # run() polls instead
        conn = await psycopg.AsyncConnection.connect(
            self.settings.listen_url,
            autocommit=True,
            application_name=APPLICATION_NAME,
            connect_timeout=max(1, int(self.settings.db_connect_timeout)),
        )
        try:
            await listen_for_jobs(conn)
            self.listening = True
            log.info("long-poll listener connected")
            # A job may have finished while nobody listened: everyone re-reads.
            self.wake_all()
            heard_at = time.monotonic()
            while not self.stopping.is_set():
                async for notify in conn.notifies(timeout=NOTIFY_TIMEOUT):
                    heard_at = time.monotonic()
                    self._dispatch(notify.payload, progress=notify.channel == JOB_PROGRESS_CHANNEL)
                if time.monotonic() - heard_at > PING_SECONDS:
                    # Silence may be a dead connection (a cut network): find out.
                    async with asyncio.timeout(PING_TIMEOUT):
                        await conn.execute("SELECT 1")
                    heard_at = time.monotonic()
        finally:
            self.listening = False
            with contextlib.suppress(Exception):
                await conn.close()

    def _dispatch(self, payload: str, *, progress: bool = False) -> None:
        try:
            job_id = uuid.UUID(payload.strip())
        except ValueError:
            log.warning("ignoring a job notification that is not a job id")
            return
        if progress:
            self.notify_progress(job_id)
        else:
            self.notify(job_id)
