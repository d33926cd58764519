"""The outbox relay: claim due rows, publish them with confirms, delete the confirmed ones.

A batch lives in one transaction: ``FOR UPDATE SKIP LOCKED`` claims it (so replicas never
publish the same row at once), the messages go out with many confirms in flight, and only
the confirmed rows are deleted before the commit. A crash anywhere before the commit rolls
the claim back and the rows are published again: at least once, never lost.

A message the broker refuses (nacked, returned for want of a queue, its exchange missing)
is the broker's state, not the message: its row is retried with capped backoff until the
broker takes it, however long that is, and a return for a route this relay declares makes
it declare its topology again (throttled). Only a message that can never be published
(malformed, too large) is quarantined, and then at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from psycopg.rows import DictRow

from jobcore.amqp.connection import BROKER_ERRORS, broker_server
from jobcore.amqp.publisher import (
    BatchResult,
    ConfirmedPublisher,
    Failure,
    OutgoingMessage,
)
from jobcore.database.gateway import AsyncConn, Database, UnitOfWork
from jobcore.database.schema_version import SchemaWatch, check_schema_on
from jobcore.database.store import outbox_store
from jobcore.execution.preflight import check_relay_timeouts
from jobcore.execution.registry import load_job_modules
from jobcore.kernel.envelope import PUBLISHED_HEADER, published_header
from jobcore.kernel.errors import BrokerUnavailable, ConfigurationError, DatabaseUnavailable
from jobcore.kernel.priorities import WEIGHTS
from jobcore.kernel.retry import backoff_delay
from jobcore.kernel.settings import RelayOptions, Settings
from jobcore.kernel.startstop import Service, run_until_signalled
from jobcore.maintenance.table_vacuum import OUTBOX_SMALL_BYTES, OUTBOX_SMALL_EVERY, TableVacuum
from jobcore.telemetry.health import HealthServer
from jobcore.telemetry.otlp_metrics import metrics_pusher
from jobcore.telemetry.traces import tracing_enabled
from jobcore.usecases.backlog import BacklogGauges
from services.relay.low_water import FULL_LOOK_EVERY, UNBOUNDED_WINDOW, LowWaterMark
from services.relay.metrics import RelayMetrics
from services.relay.room import RECHECK_SECONDS, Grant, QueueRoom
from services.relay.tracing import PublishSpans

log = logging.getLogger(__name__)

# A LISTEN connection that hears nothing for this long is pinged, so one that died
# without a word (a cut network) is replaced instead of waited on forever.
LISTEN_PING_SECONDS = 30.0
PROBE_TIMEOUT = 2.0
DATABASE_RETRY_BASE = 0.2
DATABASE_RETRY_CAP = 5.0
# Only the relay holding the wake lease answers NOTIFYs (OUTBOX_TAKE_WAKE_LEASE), but the
# others poll, and a poll can claim the rows a NOTIFY announced. A relay that a NOTIFY
# woke for nothing waits this long (doubling with each such wake-up in a row, up to the
# cap) before it answers the next one, and the NOTIFYs meanwhile join one claim. A NOTIFY
# is never delayed on a relay whose last NOTIFY found rows, nor after a wait that ended
# without one (docs/scaling.md).
LOST_WAKEUP_BACKOFF_BASE = 0.001
LOST_WAKEUP_BACKOFF_CAP = 0.05
# With direct pickup (JOBCORE_DIRECT_PICKUP), an idle relay woken by a NOTIFY waits this
# long before it claims, so that an idle worker, woken by the same NOTIFY, takes the new
# rows first with its claim (services/worker/direct.py). A relay with rows left from
# its last claim does not wait: under load the rows are all the relays'.
DIRECT_PICKUP_GRACE = 0.005
# Every claim (few, fair or FIFO) reads only the rows due since the relay's low-water mark
# (OUTBOX_CLAIM_FEW, services/relay/low_water.py), so its cost does not grow with the dead
# index entries a pinned xmin horizon keeps; the relay looks unbounded this often, for a
# row whose writer broke the mark's rule, which waits at most this much longer.
UNBOUNDED_LOOK_EVERY = FULL_LOOK_EVERY
# Before it waits for work, the relay moves its low-water mark and reads its queues'
# depths if either would be due within this many seconds: the claim the next NOTIFY wakes
# then finds both fresh instead of doing them on its way (under a steady trickle, one
# claim in every LOOK_EVERY paid for the look's two statements, and one in every
# DEPTH_REUSE_SECONDS for a passive declare per queue). A relay that never waits (a
# backlog) does them on its claims' way, as before.
AHEAD_SECONDS = 0.5
# What declaring the topology again can raise: the broker holds it with other arguments,
# or the connection is gone (the publish path notices and reconnects).
REDECLARE_ERRORS: tuple[type[BaseException], ...] = (
    ConfigurationError,
    BrokerUnavailable,
    *BROKER_ERRORS,
)


class Relay(Service):
    name = "relay"

    def __init__(
        self,
        settings: Settings,
        db: Database,
        publisher: ConfirmedPublisher,
        *,
        options: RelayOptions,
        metrics: RelayMetrics,
    ) -> None:
        super().__init__()
        self.settings = settings
        self.db = db
        self.publisher = publisher
        # server.address / server.port of the publish spans.
        self._broker_server = broker_server(publisher.settings)
        self.options = options
        self.metrics = metrics
        self.room = QueueRoom(
            publisher.topology,
            publisher.queues,
            limit=options.queue_depth_limit,
            batch_size=options.batch_size,
            timeout=options.publish_timeout,
            on_full=lambda routing_key: metrics.queue_full.labels(queue=routing_key).inc(),
        )
        self.last_publish_at: datetime | None = None
        # Who published, in the jobs' `published` events.
        self.relay_id = f"{socket.gethostname()}:{os.getpid()}"
        self.totals = {"published": 0, "failed": 0, "quarantined": 0, "unconfirmed": 0}
        # Whether the last claim left nothing due: the next one first tries OUTBOX_CLAIM_FEW.
        self._drained = True
        # Claims that OUTBOX_CLAIM_FEW answered with rows (every due row fitted a batch).
        self.few_claims = 0
        # Monotonic time of the last claim that looked at every due row (None: none yet).
        self._unbounded_look_at: float | None = None
        # Where OUTBOX_CLAIM_FEW's range starts; one look at a time, whatever the lanes.
        self.low_water = LowWaterMark()
        self._looking = asyncio.Lock()
        self._wake = asyncio.Event()
        # True while the loop waits for work (nothing due, connected): shown on /healthz.
        self.idle = False
        self._database_down = False
        self._backlog: tuple[float, dict[str, Any]] | None = None
        # Monotonic time before which the topology is not declared again (throttle).
        self._next_declare_at = 0.0
        # NOTIFY wake-ups in a row whose drain claimed nothing (another replica had the
        # rows): the next one waits LOST_WAKEUP_BACKOFF_* before claiming.
        self._lost_wakeups = 0
        # Whether this relay holds the wake lease: its NOTIFYs wake it (OUTBOX_TAKE_WAKE_LEASE).
        self.answers_notifies = False
        # Frees the index pages of the rows this relay deleted, every so many of them.
        self.vacuum = TableVacuum(
            settings,
            "outbox",
            options.vacuum_every,
            owner="relay",
            small_every=OUTBOX_SMALL_EVERY,
            small_bytes=OUTBOX_SMALL_BYTES,
        )

    # -- the loop -----------------------------------------------------------------------

    async def run(self) -> None:
        listener = (
            asyncio.create_task(self._listen(), name="relay-listen") if self.listens else None
        )
        failures = 0
        # Whether the last wait ended without a NOTIFY (the poll interval, a scheduled row).
        polled = False
        try:
            while not self.stopping.is_set():
                if not await self.publisher.ensure_connected(self.stopping):
                    break
                self.metrics.broker_connected.set(1)
                # Cleared before claiming: a NOTIFY that arrives while we drain sets it
                # again and the wait below returns at once.
                notified = self._wake.is_set()
                self._wake.clear()
                # Idle, woken by an enqueue, with direct pickup: an idle worker takes the
                # new rows itself (services/worker/direct.py) if there is one, and what is
                # left is ours. A wake-up that then finds nothing is no lost one.
                yielded = notified and self.settings.direct_pickup and self._drained
                if yielded and await self.sleep(DIRECT_PICKUP_GRACE):
                    break
                try:
                    if polled and not notified and not await self._any_due():
                        # A quiet poll: one index probe instead of a room grant (a
                        # passive declare per queue) and a fair claim that finds nothing,
                        # every poll interval, on every replica (docs/scaling.md).
                        claimed = 0
                    else:
                        claimed = await self._drain()
                    if claimed:
                        self._lost_wakeups = 0
                    elif notified and not yielded:
                        self._lost_wakeups += 1
                    if self.stopping.is_set() or not self.publisher.connected:
                        self.metrics.broker_connected.set(0)
                        continue
                    await self._wait_for_work()
                    polled = not self._wake.is_set()
                    await self._after_lost_wakeups()
                except DatabaseUnavailable as exc:
                    failures += 1
                    self._report_database(exc)
                    await self.sleep(
                        backoff_delay(failures, base=DATABASE_RETRY_BASE, cap=DATABASE_RETRY_CAP)
                    )
                    continue
                failures = 0
                self._report_database(None)
        finally:
            if listener is not None:
                listener.cancel()
                await asyncio.gather(listener, return_exceptions=True)
            await self.room.close()
            await self.vacuum.close()
            await self.publisher.close()
            self.metrics.broker_connected.set(0)
            log.info("relay stopped", extra={**self.totals, "few_claims": self.few_claims})

    async def _drain(self) -> int:
        """Publish until the due rows run out (or their queues are full), the broker goes,
        or we are stopping; return the rows claimed.

        One batch first: a wake-up for a few rows costs one claim (the claim says whether
        it left rows due). Only a full batch (a backlog) starts the lanes, whose claims and
        commits overlap each other's confirms.
        """
        if self.options.overlap and self._drained and self.options.lanes > 1:
            claimed, more = await self._trickle()
        else:
            claimed, more = await self.relay_batch()
        if not more:
            return claimed
        full = min(self.options.batch_size, self.room.limit or self.options.batch_size)
        lanes = self.options.lanes if claimed >= full else 1
        results = await asyncio.gather(
            *(self._lane() for _ in range(lanes)), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return claimed + sum(r for r in results if isinstance(r, int))

    async def _trickle(self) -> tuple[int, bool]:
        """Batches under a steady trickle (the last claim left nothing due): a NOTIFY that
        arrives while a batch waits for its confirms and commit starts the next batch at
        once, up to ``lanes`` in flight, so a row waits for no other batch's round trips.
        Once a claim finds a backlog no more start here: the lanes take it, as overlapping
        claims measured no faster at saturation. Returns the rows claimed and whether more
        may be due."""
        in_flight: set[asyncio.Task[tuple[int, bool]]] = {
            asyncio.create_task(self.relay_batch(), name="relay-batch")
        }
        claimed, more = 0, False
        errors: list[BaseException] = []
        while in_flight:
            wake = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({*in_flight, wake}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                wake.cancel()
            for task in [t for t in in_flight if t.done()]:
                in_flight.discard(task)
                error = task.exception()
                if error is not None:
                    errors.append(error)
                    continue
                batch, batch_more = task.result()
                claimed += batch
                more = more or batch_more
            if (
                in_flight
                and self._wake.is_set()
                and not (more or errors or self.stopping.is_set())
                and self.publisher.connected
                and len(in_flight) < self.options.lanes
            ):
                # Cleared before claiming, as the run loop does: a NOTIFY after this
                # point announces rows this claim may miss, and claims again.
                self._wake.clear()
                in_flight.add(asyncio.create_task(self.relay_batch(), name="relay-batch"))
        if errors:
            raise errors[0]
        return claimed, more

    async def _lane(self) -> int:
        claimed = 0
        while not self.stopping.is_set() and self.publisher.connected:
            batch, more = await self.relay_batch()
            claimed += batch
            if not more:
                break
        return claimed

    async def _any_due(self) -> bool:
        # A standby leaves what is due to the lease holder and helps with a backlog.
        seconds = self.options.poll_interval
        started = time.monotonic()
        window = await self._probe_window()
        async with self.db.connection() as conn:
            row = await (
                outbox_store.any_overdue(conn, {"seconds": seconds, "window": window})
                if self.stands_by
                else outbox_store.any_due(conn, {"window": window})
            )
        due = row is not None and bool(row["due"])
        if window >= UNBOUNDED_WINDOW and not due and not self.stands_by:
            # Nothing due anywhere: as good an unbounded look as a claim's.
            self._unbounded_look_at = started
        return due

    async def _look_if_due(self) -> None:
        """Move the low-water mark if its look is due (one look at a time, whatever the
        lanes); each of its statements takes its own snapshot, outside any transaction."""
        if self.low_water.due() and not self._looking.locked():
            async with self._looking, self.db.connection() as conn:
                await self.low_water.look(conn)

    async def _probe_window(self) -> float:
        """How far back a probe for due rows reaches (OUTBOX_ANY_DUE, OUTBOX_ANY_OVERDUE):
        to the low-water mark, or everything when the unbounded look is due."""
        last = self._unbounded_look_at
        if last is None or time.monotonic() - last >= UNBOUNDED_LOOK_EVERY:
            return UNBOUNDED_WINDOW
        await self._look_if_due()
        return self.low_water.window()

    @property
    def stands_by(self) -> bool:
        """Listening, but another relay holds the wake lease (OUTBOX_TAKE_WAKE_LEASE)."""
        return self.listens and not self.answers_notifies

    async def _after_lost_wakeups(self) -> None:
        """Before claiming for a NOTIFY, the back-off of a relay whose last NOTIFY-woken
        drains found nothing (LOST_WAKEUP_BACKOFF_*); NOTIFYs meanwhile join this claim."""
        if not self._wake.is_set():
            # The wait ended without a NOTIFY (a poll, a scheduled row due): a quiet spell,
            # after which the next NOTIFY is answered at once by every relay.
            self._lost_wakeups = 0
        if not self._lost_wakeups:
            return
        delay = min(
            LOST_WAKEUP_BACKOFF_CAP, LOST_WAKEUP_BACKOFF_BASE * 2 ** (self._lost_wakeups - 1)
        )
        await self.sleep(delay)

    async def relay_batch(self) -> tuple[int, bool]:
        """Claim, publish and settle one batch in one transaction; return the rows claimed
        and whether more may be due."""
        if not self.options.fair_claim:
            return await self._claim_publish_settle(None)
        grant = await self.room.grant(self.publisher.connection)
        if grant.broker_error is not None and self.publisher.connected:
            # The connection answers no passive declare: treated like a publish that got
            # no confirm, it is dropped and the run loop connects again.
            await self.publisher.disconnect(grant.broker_error)
        try:
            if grant.empty:
                return 0, False
            return await self._claim_publish_settle(grant)
        finally:
            # After the commit: the confirmed messages count in the queues' depths now.
            await self.room.release(grant)

    async def _claim_publish_settle(self, grant: Grant | None) -> tuple[int, bool]:
        await self._look_if_due()
        # One window for the claims of this batch: when it is the unbounded look, the fair
        # claim that follows a few claim that found too many rows looks at every row too.
        window = self._claim_window()
        # BEGIN with the claim: one round trip less before the first publish.
        async with self.db.unit_of_work(begin_with_first_statement=True) as uow:
            rows = None
            if grant is None:
                rows = await outbox_store.claim_due(
                    uow, {"limit": self.options.batch_size, "window": window}
                )
            elif self._drained and grant.takes_whole(self.options.batch_size):
                # The last claim left nothing due, so few rows are likely: if they fit one
                # batch, fairness has nothing to share out (OUTBOX_CLAIM_FEW).
                rows = await outbox_store.claim_few(
                    uow, {"limit": self.options.batch_size, "window": window}
                )
                if rows:
                    self.few_claims += 1
            if rows is None:
                assert grant is not None  # claim_due answers rows
                routing_keys = list(grant.budgets)
                rows = await outbox_store.claim_fair(
                    uow,
                    {
                        "routing_keys": routing_keys,
                        "budgets": [grant.budgets[rk] for rk in routing_keys],
                        "other_budget": grant.other_budget,
                        "limit": self.options.batch_size,
                        "priorities": [int(p) for p in WEIGHTS],
                        "weights": list(WEIGHTS.values()),
                        "window": window,
                    },
                )
            if grant is not None:
                await self.room.keep(grant, Counter(row["routing_key"] for row in rows))
            if not rows:
                self._drained = True
                return 0, False
            limit = self.options.batch_size
            # The FIFO claim takes everything due up to the limit; the fair one says whether
            # it left rows due (OUTBOX_CLAIM_FAIR's more_due).
            more = len(rows) >= limit or (grant is not None and bool(rows[0]["more_due"]))
            self._drained = not more
            # Each message says when this transaction took its row and which relay this
            # is: the worker's claim keeps that on the job row as the job's `published`
            # event (jobcore.kernel.envelope.PUBLISHED_HEADER), not an event row.
            published = published_header(rows[0]["taken_at"], self.relay_id)
            messages = [
                OutgoingMessage(
                    row["exchange"],
                    row["routing_key"],
                    row["message_id"],
                    row["message_type"],
                    {**row["headers"], PUBLISHED_HEADER: published},
                    row["body"],
                )
                for row in rows
            ]
            spans = (
                PublishSpans(messages, server=self._broker_server) if tracing_enabled() else None
            )
            if spans is not None:
                messages = spans.messages
            result = await self.publisher.publish_batch(messages)
            if spans is not None:
                spans.end(result)
            gone = 0
            if result.confirmed:
                ids = [rows[i]["id"] for i in result.confirmed]
                deleted = await outbox_store.delete_published(
                    uow, {"ids": ids, "relay": self.relay_id}
                )
                assert deleted is not None  # a count answers one row
                gone = len(ids) - int(deleted["deleted"])
            quarantined = await self._record_failures(uow, rows, result) if result.failed else []
            await uow.commit()
        self._account(len(rows), result, gone, quarantined)
        self.vacuum.deleted(len(result.confirmed) - gone)
        recovered = sum(1 for i in result.confirmed if rows[i]["attempts"])
        if recovered:
            log.info(
                "outbox messages the broker had refused were published",
                extra={"messages": recovered},
            )
        # After the commit: the claimed rows are not held while the broker declares.
        missing = self._missing_route(messages, result)
        if missing is not None:
            await self._redeclare_topology(missing)
        return len(rows), more

    def _claim_window(self) -> float:
        """How far back a claim looks: to the low-water mark, or everything when the last
        unbounded look is too long ago (then this claim is the unbounded look)."""
        now = time.monotonic()
        last = self._unbounded_look_at
        if last is None or now - last >= UNBOUNDED_LOOK_EVERY:
            self._unbounded_look_at = now
            return UNBOUNDED_WINDOW
        return self.low_water.window(now)

    async def _record_failures(
        self, uow: UnitOfWork, rows: list[Any], result: BatchResult
    ) -> list[dict[str, Any]]:
        ids, errors, delays, quarantine = [], [], [], []
        first_failures: list[tuple[str, Failure, str]] = []
        for index, failure, error in result.failed:
            row = rows[index]
            attempts = row["attempts"] + 1
            ids.append(row["id"])
            errors.append(f"{failure}: {error}")
            delays.append(
                backoff_delay(
                    attempts,
                    base=self.options.retry_base_delay,
                    cap=self.options.retry_max_delay,
                )
            )
            quarantine.append(failure.quarantines(attempts, self.options.max_publish_attempts))
            self.metrics.failed.labels(reason=failure.value).inc()
            if attempts == 1 and not quarantine[-1]:
                first_failures.append((row["message_id"], failure, error))
        if first_failures:
            # Once per row, one line per batch (a deleted queue returns thousands): later
            # retries are visible in the rows themselves (`jobcore outbox list-failing`).
            message_id, failure, error = first_failures[0]
            log.warning(
                "the broker did not take outbox messages; retrying them until it does",
                extra={
                    "messages": len(first_failures),
                    "message_id": message_id,
                    "reason": failure,
                    "error": error,
                },
            )
        updated = await outbox_store.record_failures(
            uow, {"ids": ids, "errors": errors, "delays": delays, "quarantine": quarantine}
        )
        return [dict(row) for row in updated if row["quarantined"]]

    def _missing_route(self, messages: list[OutgoingMessage], result: BatchResult) -> str | None:
        """The first failure that declaring this relay's topology would cure, if any."""
        for index, failure, error in result.failed:
            message = messages[index]
            if failure.is_missing_route and self.publisher.declares_route(
                message.exchange, message.routing_key
            ):
                return error
        return None

    async def _redeclare_topology(self, reason: str) -> None:
        """Declare the exchanges, queues and bindings again: at most once per interval,
        however many messages come back. A failure is logged; the rows retry anyway."""
        now = time.monotonic()
        if now < self._next_declare_at:
            return
        self._next_declare_at = now + self.options.redeclare_interval
        try:
            await self.publisher.redeclare()
        except REDECLARE_ERRORS as exc:
            self.metrics.topology_declares.labels(result="failed").inc()
            log.warning(
                "declaring the topology again failed; the refused messages are retried anyway",
                extra={"error": f"{type(exc).__name__}: {exc}", "after": reason},
            )
            return
        self.metrics.topology_declares.labels(result="declared").inc()
        log.warning(
            "the broker returned a message for a route this relay declares; "
            "declared the topology again",
            extra={"after": reason},
        )

    def _account(
        self, claimed: int, result: BatchResult, gone: int, quarantined: list[dict[str, Any]]
    ) -> None:
        published = len(result.confirmed)
        self.metrics.batch_size.observe(claimed)
        if published:
            self.metrics.published.inc(published)
            self.metrics.confirm_latency.observe(result.confirm_seconds)
            self.last_publish_at = datetime.now(UTC)
        if gone:
            self.metrics.already_gone.inc(gone)
            log.warning("confirmed outbox rows were already gone", extra={"rows": gone})
        if result.unconfirmed:
            self.metrics.unconfirmed.inc(len(result.unconfirmed))
        for row in quarantined:
            self.metrics.quarantined.inc()
            log.error(
                "outbox message quarantined: it can never be published as it is",
                extra={
                    "outbox_id": row["id"],
                    "message_id": str(row["message_id"]),
                    "job_id": str(row["job_id"]) if row["job_id"] else None,
                    "attempts": row["attempts"],
                    "error": row["last_error"],
                },
            )
        self.totals["published"] += published
        self.totals["failed"] += len(result.failed)
        self.totals["quarantined"] += len(quarantined)
        self.totals["unconfirmed"] += len(result.unconfirmed)

    # -- waiting for work ----------------------------------------------------------------

    async def _wait_for_work(self) -> None:
        """Until a NOTIFY, the next scheduled row's due time, the poll interval, or a stop."""
        if self._wake.is_set():
            # A NOTIFY came while we drained: claim again without asking when the next
            # scheduled row is due (a round trip per batch under a steady trickle).
            return
        timeout = self.options.poll_interval
        # A scheduled row is the lease holder's to publish when it is due.
        row = None if self.stands_by else await self._fetch_one(outbox_store.seconds_until_next_due)
        if row is not None and row["seconds"] is not None:
            # A millisecond late rather than early, so the row is due when we claim.
            timeout = min(timeout, max(row["seconds"], 0.0) + 0.001)
        await self._ahead_of_the_next_claim()
        if self.room.throttled:
            # A full queue is not announced: look again soon while rows wait for room.
            window = await self._probe_window()
            due = await self._fetch_one(lambda conn: outbox_store.any_due(conn, {"window": window}))
            if due is not None and due["due"]:
                timeout = min(timeout, RECHECK_SECONDS)
        waiters = [
            asyncio.ensure_future(event.wait())
            for event in (self._wake, self.stopping, self.publisher.lost)
        ]
        self.idle = True
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.idle = False
            for waiter in waiters:
                waiter.cancel()

    async def _ahead_of_the_next_claim(self) -> None:
        """The low-water look and the queues' depths, when due within AHEAD_SECONDS."""
        soon = time.monotonic() + AHEAD_SECONDS
        if self.low_water.due(soon) and not self._looking.locked():
            async with self._looking, self.db.connection() as conn:
                await self.low_water.look(conn)
        if self.options.fair_claim:
            await self.room.read_ahead(self.publisher.connection, soon)

    @property
    def listens(self) -> bool:
        """Whether NOTIFYs wake this relay: not with --no-listen, nor behind PgBouncer
        without a direct URL to listen on; it then polls every options.poll_interval."""
        return self.options.listen and self.settings.listen_url is not None

    async def _listen(self) -> None:
        """Answer NOTIFYs while this relay holds the wake lease; reconnect (with backoff)
        whenever the LISTEN connection breaks.

        Only the relay holding the lease (``OUTBOX_TAKE_WAKE_LEASE``) LISTENs and sets the
        wake event; the others try for it every poll interval and poll meanwhile, so N
        relays cost one claim per NOTIFY, not N (docs/scaling.md).
        """
        failures = 0
        while not self.stopping.is_set():
            try:
                async with self.db.listen_connection() as conn:
                    try:
                        if failures:
                            log.info("listening for outbox notifications again")
                        failures = 0
                        if not await self._take_wake_lease(conn):
                            return  # stopping
                        await outbox_store.listen(conn)
                        # Rows committed before we listened sent no NOTIFY we heard.
                        self._wake.set()
                        while True:
                            async for _ in conn.notifies(timeout=LISTEN_PING_SECONDS):
                                self._wake.set()
                            await outbox_store.listener_ping(conn)
                    finally:
                        answered = self.answers_notifies
                        self.answers_notifies = False
                        if not conn.closed:
                            # Best effort: a pooled connection must not go back listening
                            # or holding the lease.
                            with contextlib.suppress(Exception):
                                await outbox_store.unlisten(conn)
                                if answered:
                                    await outbox_store.drop_wake_lease(conn)
            except Exception as exc:  # whatever broke it, polling covers meanwhile
                failures += 1
                if failures == 1:
                    log.warning(
                        "outbox LISTEN connection lost; polling until it is back",
                        extra={"error": f"{type(exc).__name__}: {exc}"},
                    )
                await self.sleep(
                    backoff_delay(failures, base=DATABASE_RETRY_BASE, cap=DATABASE_RETRY_CAP)
                )

    async def _take_wake_lease(self, conn: AsyncConn) -> bool:
        """Wait until this connection holds the wake lease (True), or we stop (False).

        The attempt every poll interval doubles as the connection's ping; the run loop
        polls meanwhile, so a relay without the lease still drains what is due.
        """
        announced = False
        while not self.stopping.is_set():
            row = await outbox_store.take_wake_lease(conn)
            if row is not None and row["held"]:
                self.answers_notifies = True
                if announced:
                    log.info("this relay answers outbox NOTIFYs now")
                return True
            if not announced:
                announced = True
                log.info("another relay answers outbox NOTIFYs; this one polls until it goes")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), timeout=self.options.poll_interval)
        return False

    def _report_database(self, error: DatabaseUnavailable | None) -> None:
        if error is not None and not self._database_down:
            self._database_down = True
            log.warning("database unavailable; retrying", extra={"error": str(error)})
        elif error is None and self._database_down:
            self._database_down = False
            log.info("database reachable again")

    async def _fetch_one(
        self, read: Callable[[AsyncConn], Awaitable[DictRow | None]]
    ) -> dict[str, Any] | None:
        async with self.db.connection() as conn:
            return await read(conn)

    # -- what operators see ----------------------------------------------------------------

    async def backlog(self) -> dict[str, Any]:
        now = time.monotonic()
        if (
            self._backlog is not None
            and now - self._backlog[0] < self.options.backlog_cache_seconds
        ):
            return self._backlog[1]
        row = await self._fetch_one(outbox_store.status)
        backlog = dict(row) if row else {}
        self._backlog = (now, backlog)
        return backlog

    async def probe(self) -> tuple[bool, dict[str, Any]]:
        details: dict[str, Any] = {
            "broker_connected": self.publisher.connected,
            "broker_connect_failures": self.publisher.connect_failures,
            "last_publish_at": self.last_publish_at.isoformat() if self.last_publish_at else None,
            "seconds_since_last_publish": (
                round((datetime.now(UTC) - self.last_publish_at).total_seconds(), 3)
                if self.last_publish_at
                else None
            ),
            "idle": self.idle,
            "listens": self.listens,
            "answers_notifies": self.answers_notifies,
            "totals": dict(self.totals),
        }
        database_ok = True
        try:
            # Bounded: a probe must answer before the orchestrator's probe timeout does.
            details["backlog"] = await asyncio.wait_for(self.backlog(), PROBE_TIMEOUT)
        except DatabaseUnavailable as exc:
            database_ok = False
            details["database_error"] = str(exc)
        except TimeoutError:
            database_ok = False
            details["database_error"] = f"no answer within {PROBE_TIMEOUT}s"
        details["database_reachable"] = database_ok
        return self.running and self.publisher.connected and database_ok, details

    async def metrics_text(self) -> str:
        self.metrics.broker_connected.set(1 if self.publisher.connected else 0)
        with contextlib.suppress(DatabaseUnavailable, TimeoutError):
            self.metrics.observe_backlog(await asyncio.wait_for(self.backlog(), PROBE_TIMEOUT))
        return self.metrics.render()


def build_publisher(
    settings: Settings, options: RelayOptions, metrics: RelayMetrics | None = None
) -> ConfirmedPublisher:
    queues = load_job_modules(settings.job_modules).queues()
    return ConfirmedPublisher(
        settings,
        queues=queues,
        max_message_size=options.max_message_bytes,
        publish_timeout=options.publish_timeout,
        connect_timeout=options.connect_timeout,
        reconnect_base=options.reconnect_base_delay,
        reconnect_cap=options.reconnect_max_delay,
        on_reconnect=metrics.reconnects.inc if metrics else None,
    )


class _WithoutConnectionNoise(logging.Filter):
    """aiormq logs every failed connection attempt and every broker-side close as an
    error; the publisher logs each state change once instead (with the same reason)."""

    REPEATS = ("error when creating transport", "Unexpected connection close from remote")

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.REPEATS)


async def serve(settings: Settings, options: RelayOptions) -> int:
    """`jobcore relay`: the relay and its health server until SIGTERM; the exit code."""
    check_relay_timeouts(
        settings,
        publish_timeout=options.publish_timeout,
        connect_timeout=options.connect_timeout,
    )
    logging.getLogger("aiormq.connection").addFilter(_WithoutConnectionNoise())
    metrics = RelayMetrics()
    db = Database(
        settings,
        min_size=1,
        # A connection per lane, the LISTEN connection, and one for probes and waits.
        max_size=max(settings.db_pool_max, options.lanes + 3),
        name="jobcore-relay",
        # The claims and the delete (marked generic_plan) are planned once per connection:
        # planned anew, the fair claim took more than twice as long a run
        # (docs/bench/measurements.md, "Plans").
        generic_plans=True,
        # The schema is checked on the first connection too: the database may have been
        # down when `jobcore relay` checked it (SchemaWatch).
        first_check=check_schema_on,
    )
    watch = SchemaWatch(db)
    await db.open()
    try:
        # PostgreSQL may be starting too: the relay waits for it (JOBCORE_DB_CONNECT_TIMEOUT),
        # then checks the schema on that first connection before any claim.
        await db.wait_reachable(
            settings.db_connect_timeout,
            waiting=lambda exc: log.warning(
                "relay waiting for the database", extra={"error": exc.message}
            ),
        )
    except BaseException:
        await db.close()
        raise
    try:
        relay = Relay(
            settings,
            db,
            build_publisher(settings, options, metrics),
            options=options,
            metrics=metrics,
        )
        # Open jobs per queue and RabbitMQ queue depths, read when /metrics is scraped.
        backlog = BacklogGauges(
            metrics.registry,
            db,
            relay.publisher.topology,
            relay.publisher.queues,
            lambda: relay.publisher.connection,
        )

        async def metrics_text() -> str:
            await backlog.refresh()
            return await relay.metrics_text()

        health = HealthServer(
            "relay",
            settings.health_host,
            options.health_port,
            relay.probe,
            metrics_text,
        )
        await health.start()
        log.info(
            "relay starting",
            extra={
                "health_port": await _bound_port(health),
                "batch_size": options.batch_size,
                "lanes": options.lanes,
                "listen": relay.listens,
                "poll_interval": options.poll_interval,
                "database_pooler": settings.database_pooler,
            },
        )
        # Metrics over OTLP too when the environment asks; stopped after the relay.
        export = metrics_pusher("jobcore-relay", metrics_text)
        services = [watch, health, *([export] if export else []), relay]
        code = await run_until_signalled(services, settings.shutdown_grace)
    finally:
        await db.close()
    refusal = watch.refusal()
    if refusal is not None:
        raise refusal  # the command's one line (a schema it must not run against)
    return code


async def _bound_port(health: HealthServer, timeout: float = 5.0) -> int | None:
    """The health server's port once it listens (port 0 picks one; operators need to know)."""
    deadline = time.monotonic() + timeout
    # uvicorn binds in its own task and offers no event for it: poll, bounded by the deadline.
    while time.monotonic() < deadline:
        if health.port is not None or not health.running:
            break
        await asyncio.sleep(0.01)
    return health.port
