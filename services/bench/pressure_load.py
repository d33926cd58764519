"""The pressure scenario's instruments: an open-loop HTTP load, a bounded histogram, and a
tail of finished jobs that feeds it (services/bench/scenarios/pressure.py).

- :class:`Histogram` keeps latencies in log-spaced buckets (2 % apart, 0.1 ms to an hour):
  its memory is bounded by the bucket count, however many samples go in.
- :class:`OpenLoad` POSTs ``effect`` jobs at a rate paced against the wall clock: each tick
  it sends every job the elapsed time has made due (credit = rate × seconds), whether or
  not earlier requests have been answered, up to a bound of requests in flight (beyond
  it a due job is counted as shed by the generator, not sent late). A 503 or a lost
  connection is retried with the same Idempotency-Key after its Retry-After, as a client
  should, for up to ``GIVE_UP`` seconds. Counts go to the window that is current when the
  job was first due.
- :class:`Completions` reads the ledger of effects (``job_effects``, one row per job that
  succeeded) by id as it grows, joined to the jobs: completions per second, and each job's
  pickup latency (created → started) into the histogram of the window it was created in
  and of its second.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import psycopg

from jobcore.database.schema import HOT_TABLES
from services.bench.http import HOST

# 2 % apart from 0.1 ms: a percentile read from a bucket is within 2 % of the sample's.
BUCKET_GROWTH = 1.02
BUCKET_FLOOR = 1e-4
BUCKETS = int(math.log(3600 / BUCKET_FLOOR, BUCKET_GROWTH)) + 2
TICK = 0.01  # the generator's pacing tick, seconds
MAX_IN_FLIGHT = 512
GIVE_UP = 30.0  # seconds a job's request is retried before it is abandoned
# A request unanswered after this long hangs (the API's own timeouts are a few seconds).
HTTP_TIMEOUT = 15.0
RETRY_CAP = 1.0  # the longest Retry-After the generator waits (a shorter run sees more)
# An effect committed more than this after it was written may be missed by the tail (its
# id already passed); far longer than any transaction the worker holds.
SETTLE = 10.0
TAIL_BATCH = 20_000
APPLICATION = "bench-pressure"
MARK = f"/* {APPLICATION} */ "
WAIT_SAMPLE = 0.25  # seconds between two samples of pg_stat_activity


class Histogram:
    """Counts per log-spaced bucket; percentiles read from the buckets' upper edges."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts: Counter[int] = Counter()
        self.total = 0

    @staticmethod
    def bucket(seconds: float) -> int:
        if seconds <= BUCKET_FLOOR:
            return 0
        return min(BUCKETS - 1, int(math.log(seconds / BUCKET_FLOOR, BUCKET_GROWTH)) + 1)

    def add(self, seconds: float, count: int = 1) -> None:
        self.counts[self.bucket(seconds)] += count
        self.total += count

    def merge(self, other: Histogram) -> None:
        self.counts.update(other.counts)
        self.total += other.total

    def percentile(self, pct: float) -> float | None:
        """Seconds at or below which ``pct`` % of the samples lie (None: no samples)."""
        if not self.total:
            return None
        rank = max(1, math.ceil(pct / 100 * self.total))
        seen = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen >= rank:
                return BUCKET_FLOOR * BUCKET_GROWTH**index
        return None  # unreachable: the counts add up to the total

    def ms(self, pct: float) -> float | None:
        value = self.percentile(pct)
        return None if value is None else round(1000 * value, 1)


@dataclass
class WindowCounts:
    """What the generator saw of the jobs first due in one window."""

    offered: int = 0
    accepted: int = 0
    shed: int = 0  # due while MAX_IN_FLIGHT requests were in flight: never sent
    abandoned: int = 0  # never answered 202 within GIVE_UP seconds
    status_503: int = 0
    missing_retry_after: int = 0
    other_status: Counter[int] = field(default_factory=Counter)
    transport_errors: int = 0
    hangs: int = 0  # requests unanswered after HTTP_TIMEOUT
    http: Histogram = field(default_factory=Histogram)  # each request's answer time

    def as_dict(self, seconds: float) -> dict[str, Any]:
        return {
            "offered": self.offered,
            "offered_per_s": round(self.offered / seconds, 1) if seconds else 0.0,
            "accepted": self.accepted,
            "shed_by_generator": self.shed,
            "abandoned": self.abandoned,
            "answers_503": self.status_503,
            "503_without_retry_after": self.missing_retry_after,
            "other_answers": {str(k): v for k, v in sorted(self.other_status.items())},
            "transport_errors": self.transport_errors,
            "hangs_over_timeout": self.hangs,
            "http_p99_ms": self.http.ms(99),
            "http_max_ms": self.http.ms(100),
        }


class HttpError(Exception):
    """The connection failed or answered something that is not HTTP/1.1."""


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def exchange(self, request: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 "):
            raise HttpError(head[:40].decode(errors="replace"))
        status = int(head[9:12])
        headers: dict[bytes, bytes] = {}
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name:
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get(b"content-length", b"0"))
        body = await self.reader.readexactly(length) if length else b""
        return status, headers, body

    def close(self) -> None:
        self.writer.close()


class OpenLoad:
    """POSTs ``effect`` jobs at ``rate`` per second, open loop (see the module docstring)."""

    def __init__(self, port: int, api_key: str, rate: float) -> None:
        self.port = port
        self.api_key = api_key
        self.rate = rate
        self.window = 0  # the index of the current window: where counts go
        self.windows: dict[int, WindowCounts] = {}
        self.sent_per_second: Counter[int] = Counter()
        self.in_flight = 0
        self._idle: list[Connection] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._stop = asyncio.Event()
        self._sequence = 0

    def counts(self, window: int) -> WindowCounts:
        return self.windows.setdefault(window, WindowCounts())

    async def run(self, until: float) -> None:
        """Paces the load until :meth:`stop` or the wall clock reaches ``until``."""
        last = time.time()
        credit = 0.0
        while not self._stop.is_set() and last < until:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), TICK)  # the pacing tick
            now = time.time()
            credit += self.rate * (now - last)
            last = now
            due = int(credit)
            credit -= due
            counts = self.counts(self.window)
            for _ in range(due):
                counts.offered += 1
                self.sent_per_second[int(now)] += 1
                if self.in_flight >= MAX_IN_FLIGHT:
                    counts.shed += 1
                    continue
                self.in_flight += 1
                task = asyncio.create_task(self._job(counts))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        await self.drain()

    def stop(self) -> None:
        self._stop.set()

    async def drain(self) -> None:
        """Wait for the requests in flight (each bounded by GIVE_UP), close connections."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=GIVE_UP + HTTP_TIMEOUT + 5)
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    def _request(self, key: str, n: int) -> bytes:
        body = b'{"n":%d}' % (n % 2**31)
        head = (
            f"POST /jobs/effect HTTP/1.1\r\nHost: {HOST}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"Authorization: Bearer {self.api_key}\r\nIdempotency-Key: {key}\r\n\r\n"
        )
        return head.encode() + body

    async def _job(self, counts: WindowCounts) -> None:
        self._sequence += 1
        request = self._request(f"pressure-{uuid.uuid4()}", self._sequence)
        deadline = time.monotonic() + GIVE_UP
        try:
            while True:
                wait = await self._attempt(request, counts)
                if wait is None:
                    return
                if time.monotonic() + wait >= deadline:
                    counts.abandoned += 1
                    return
                await asyncio.sleep(wait)  # the answer's Retry-After, capped
        finally:
            self.in_flight -= 1

    async def _attempt(self, request: bytes, counts: WindowCounts) -> float | None:
        """One try; None when the job is settled (accepted, or refused for good), else
        how long to wait before the next."""
        started = time.monotonic()
        # A kept-alive connection the server closed meanwhile (uvicorn closes one idle
        # for 5 s) fails before any answer: tried again at once on a new one, as HTTP
        # clients do, and not counted as a transport error.
        reused = bool(self._idle)
        for fresh in (False, True) if reused else (True,):
            conn: Connection | None = None
            try:
                if fresh:
                    conn = Connection(
                        *await asyncio.wait_for(
                            asyncio.open_connection(HOST, self.port), HTTP_TIMEOUT
                        )
                    )
                else:
                    conn = self._idle.pop()
                status, headers, _ = await asyncio.wait_for(conn.exchange(request), HTTP_TIMEOUT)
                break
            except TimeoutError:
                counts.hangs += 1
                if conn is not None:
                    conn.close()
                return 0.2
            except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError):
                if conn is not None:
                    conn.close()
                if fresh:
                    counts.transport_errors += 1
                    return 0.2
            except (OSError, asyncio.LimitOverrunError, HttpError):
                counts.transport_errors += 1
                if conn is not None:
                    conn.close()
                return 0.2
        else:  # unreachable: the try on a fresh connection breaks or returns
            return 0.2
        counts.http.add(time.monotonic() - started)
        self._idle.append(conn)
        if status == 202:
            counts.accepted += 1
            return None
        if status == 503:
            counts.status_503 += 1
            retry_after = headers.get(b"retry-after")
            if not retry_after:
                counts.missing_retry_after += 1
                return RETRY_CAP
            try:
                return min(RETRY_CAP, max(0.05, float(retry_after)))
            except ValueError:
                return RETRY_CAP
        counts.other_status[status] += 1
        return None


@dataclass
class Window:
    """A phase or the recovery after one: wall-clock bounds (time.time())."""

    name: str
    kind: str  # "phase" or "recovery"
    start: float
    end: float = 0.0

    @property
    def seconds(self) -> float:
        return max(1e-9, self.end - self.start)


TAIL = f"""
/* {APPLICATION} */
SELECT e.id, extract(epoch FROM e.recorded_at)::float AS recorded,
       extract(epoch FROM j.created_at)::float AS created,
       extract(epoch FROM j.started_at)::float AS started
FROM jobcore.job_effects e JOIN jobcore.jobs j ON j.id = e.job_id
WHERE e.id > %(after)s ORDER BY e.id LIMIT {TAIL_BATCH}
"""


class Completions:
    """The tail of the effects ledger (see the module docstring); survives the database
    going away (it reconnects every half second until stopped)."""

    def __init__(self, database_url: str, windows: list[Window]) -> None:
        self.database_url = database_url
        self.windows = windows
        self.per_second: Counter[int] = Counter()  # completions by second finished
        self.pickup: dict[int, Histogram] = {}  # by window index (created in it)
        self.pickup_by_second: dict[int, Histogram] = {}  # by second created
        # Release instants (pool exhaustion) -> the first finish of a job created after.
        self.first_after: dict[float, float | None] = {}
        self.reconnects = 0
        self._watermark = 0
        self._seen: set[int] = set()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    def _window_of(self, at: float) -> int | None:
        for index in range(len(self.windows) - 1, -1, -1):
            window = self.windows[index]
            if window.start <= at and (not window.end or at < window.end):
                return index
        return None

    def _take(self, rows: list[tuple[int, float, float, float | None]], now: float) -> None:
        settled_to = self._watermark
        for effect_id, recorded, created, started in rows:
            if effect_id not in self._seen:
                self._seen.add(effect_id)
                self._count(recorded, created, started)
            # Past a settled row, a gap is an id whose transaction rolled back (or, later
            # than SETTLE allows, one not committed yet: missed, the rate's error only).
            if recorded < now - SETTLE:
                settled_to = max(settled_to, effect_id)
        self._watermark = settled_to
        self._seen = {i for i in self._seen if i > settled_to}

    def _count(self, recorded: float, created: float, started: float | None) -> None:
        self.per_second[int(recorded)] += 1
        if started is not None:
            pickup = max(0.0, started - created)
            window = self._window_of(created)
            if window is not None:
                self.pickup.setdefault(window, Histogram()).add(pickup)
            self.pickup_by_second.setdefault(int(created), Histogram()).add(pickup)
        for release, first in self.first_after.items():
            if created >= release and (first is None or recorded < first):
                self.first_after[release] = recorded

    async def run(self, interval: float = 0.5) -> None:
        while not self._stop.is_set():
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.database_url,
                    autocommit=True,
                    application_name=APPLICATION,
                    connect_timeout=5,
                ) as conn:
                    while not self._stop.is_set():
                        await self.poll(conn)
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._stop.wait(), interval)
            except psycopg.Error:
                self.reconnects += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 0.5)  # reconnect pacing

    async def poll(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Read everything past the watermark (in batches of TAIL_BATCH, bounded)."""
        for _ in range(100):
            cur = await conn.execute(TAIL, {"after": self._watermark})
            rows = await cur.fetchall()
            self._take(rows, time.time())
            if len(rows) < TAIL_BATCH:
                return


SIZES = (
    MARK
    + """
SELECT s.relname AS name, s.n_live_tup AS live, s.n_dead_tup AS dead,
       pg_table_size(s.relid) AS table_bytes, pg_indexes_size(s.relid) AS index_bytes
FROM pg_stat_user_tables s WHERE s.schemaname = 'jobcore' AND s.relname = ANY(%(tables)s)
"""
)
WAITS = (
    MARK
    + """
SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU') AS event, count(*) AS n
FROM pg_stat_activity
WHERE datname = current_database() AND state = 'active' AND backend_type = 'client backend'
  AND application_name NOT LIKE 'bench-%%' AND pid <> pg_backend_pid()
GROUP BY 1
"""
)


async def connect(url: str, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(
        url, application_name=APPLICATION, connect_timeout=5, **kwargs
    )


@dataclass
class Monitor:
    """Samples what the database shows, on connections of its own that reconnect."""

    url: str
    windows: list[Window]
    sample_every: float
    sizes: list[tuple[float, dict[str, dict[str, int]]]] = field(default_factory=list)
    waits: dict[int, Counter[str]] = field(default_factory=dict)
    wait_samples: Counter[int] = field(default_factory=Counter)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    def stop(self) -> None:
        self._stop.set()

    async def _resilient(self, every: float, step: Any) -> None:
        while not self._stop.is_set():
            try:
                async with await connect(self.url, autocommit=True) as conn:
                    while not self._stop.is_set():
                        await step(conn)
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._stop.wait(), every)
            except psycopg.Error:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 0.5)  # reconnect pacing

    async def _sizes(self, conn: psycopg.AsyncConnection[Any]) -> None:
        cur = await conn.execute(SIZES, {"tables": list(HOT_TABLES)})
        rows = await cur.fetchall()
        self.sizes.append(
            (
                time.time(),
                {
                    name: {"live": live, "dead": dead, "table": tb, "index": ib}
                    for name, live, dead, tb, ib in rows
                },
            )
        )

    async def _waits(self, conn: psycopg.AsyncConnection[Any]) -> None:
        index = len(self.windows) - 1
        cur = await conn.execute(WAITS)
        counter = self.waits.setdefault(index, Counter())
        for event, n in await cur.fetchall():
            counter[event] += n
        self.wait_samples[index] += 1

    async def run(self) -> None:
        await asyncio.gather(
            self._resilient(self.sample_every, self._sizes),
            self._resilient(WAIT_SAMPLE, self._waits),
        )
