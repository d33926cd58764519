"""The consumer: deliveries in, one claim transaction each, acknowledged after it commits.

Why the acknowledgement comes after the claim commits, and why the lease protects the job:

- The inbox row and the claim commit together, *then* the delivery is acknowledged. A
  crash before the commit leaves the job pending and the delivery unacknowledged, so
  RabbitMQ redelivers it and the next worker claims it. A crash after the commit but
  before the ack makes RabbitMQ redeliver a message the inbox already holds: it is
  acknowledged with no effect. Either way nothing is lost and nothing runs twice.
- Acknowledging right after the claim, not after the handler, means no delivery stays
  unacknowledged while a long job runs (RabbitMQ closes channels whose deliveries outlive
  ``consumer_timeout``), and prefetch bounds waiting deliveries, not running jobs. It is
  kept at most the concurrency (:meth:`~jobcore.settings.Settings.job_prefetch`): a
  waiting delivery is requeued when the worker stops, and every requeue counts toward
  the queue's delivery limit.
- A claim batch's commit makes many deliveries of a channel ackable at once: their acks
  go out together, as one ``multiple`` ack where the channel allows
  (:class:`~jobcore.amqp.deliveries.ChannelAcks`). One never covers a delivery whose
  claim has not committed: a delivery still waiting, or being requeued or dead-lettered,
  ends the run of tags a multiple ack settles.
- From then on the *lease* protects the job: a worker that dies stops heartbeating, the
  lease expires, and the reaper returns the job to pending with a new message. Every
  write the old worker might still attempt is fenced by its lease token and is dropped.

Every delivery is settled, whatever goes wrong. An unexpected error before the claim
commits requeues it (after a pause that grows with its redeliveries): it counts toward the
queue's delivery limit, past which the broker dead-letters it and the job is found again
by the database's side. One after the claim committed acknowledges it (the claim is the
record now) and ends the attempt as a retryable failure with that error. A settle that
fails because the channel is gone needs nothing: the broker requeues what the closed
channel held. While the database is unreachable a delivery is held, not requeued, and
:class:`~services.worker.progress.Progress` reports the stall on ``/readyz``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout
from pydantic import BaseModel

from jobcore.amqp.connection import broker_server
from jobcore.amqp.consuming import DeliveryConsumer
from jobcore.amqp.deliveries import Delivery, JobQueueConsumer
from jobcore.amqp.topology import Topology
from jobcore.enqueue import trace_headers_of
from jobcore.envelope import JobMessage, decode
from jobcore.errors import (
    DatabaseUnavailable,
    JobcoreError,
    PoisonMessage,
    UnknownJobType,
)
from jobcore.outcomes import undeliverable_note
from jobcore.registry import InvalidPayloadError, JobType, Registry
from jobcore.results import ResultNotFound
from jobcore.settings import MAX_CONSUMER_PRIORITY, Settings
from jobcore.store import (
    JOBS_CONSUMER,
    JobClaimManyParams,
    JobNoteUndeliverableParams,
    job_store,
)
from services.worker.batching import Batcher
from services.worker.claims import Claim
from services.worker.connections import HeldConnections, TransientConflict
from services.worker.intake import Intake
from services.worker.metrics import WorkerMetrics
from services.worker.progress import Progress
from services.worker.runner import JobRunner
from services.worker.tracing import delivery_failed, process_span

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    message_id: uuid.UUID
    job_id: uuid.UUID
    job_type: str
    attempt: int
    lease_token: uuid.UUID
    lease: float
    # Its type declares a concurrency or rate limit here: its job likely has a key (only
    # how the claim is sent depends on it; the key is read from the job row).
    limited: bool = False


# After the handlers' grace period, how long giving back the remaining leases may take.
RELEASE_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class Taken:
    """A delivery whose claim statement committed, with what it answered."""

    message_id: uuid.UUID
    envelope: JobMessage
    job_type: JobType[Any]
    row: dict[str, Any]


class Consumer(DeliveryConsumer):
    name = "worker-consumer"
    label = "worker"

    def __init__(
        self,
        settings: Settings,
        connections: HeldConnections,
        runner: JobRunner,
        *,
        registry: Registry,
        queues: Iterable[str],
        concurrency: int,
        worker_id: str,
        metrics: WorkerMetrics,
    ) -> None:
        consumed = sorted(set(queues))
        super().__init__(
            JobQueueConsumer(settings, consumed),
            prefetch=settings.job_prefetch(concurrency),
            grace=settings.shutdown_grace,
            priority=consumer_priority(settings),
        )
        self.settings = settings
        self.connections = connections
        self.runner = runner
        self.registry = registry
        self.queues = consumed
        self.worker_id = worker_id
        self.metrics = metrics
        topology = Topology.from_settings(settings)
        self._queue_of = {topology.queue_name(queue): queue for queue in self.queues}
        metrics.consuming(self.queues)
        # server.address / server.port of the process spans.
        self._broker_server = broker_server(settings)
        self.claims: Batcher[ClaimRequest, dict[str, Any]] = Batcher(self._claim_batch)
        self._slots = asyncio.Semaphore(concurrency)
        self.intake = Intake(self.broker, concurrency)
        self.progress = Progress(settings.worker_stall_after)

    @property
    def broker_connected(self) -> bool:
        return self.broker.connected

    async def started(self) -> None:
        self.intake.start()
        log.info(
            "worker consuming",
            extra={
                "queues": self.queues,
                "worker_id": self.worker_id,
                "consumer_priority": self.priority,
            },
        )

    async def stop_taking(self) -> None:
        await self.intake.stop()

    async def grace_over(self) -> None:
        """Give back the leases of the jobs still running."""
        log.info(
            "grace period over; giving back the leases of running jobs",
            extra={"running": len(self.runner.running)},
        )
        self.runner.release_all()
        await self.wait_for_deliveries(RELEASE_TIMEOUT)

    async def closed(self) -> None:
        await self.claims.close()

    # --- one delivery ----------------------------------------------------------------------

    def received(self, message: Delivery) -> None:
        self.metrics.delivered(self._queue_of.get(message.queue, message.queue))

    async def handle(self, message: Delivery) -> None:
        # Claim only once a handler slot is free: a claimed job's lease is already running.
        async with self._slots:
            if self.stopping.is_set():
                return
            with process_span(message, self._broker_server):
                try:
                    with self.progress.waiting():
                        taken = await self._take(message)
                except Exception as exc:
                    delivery_failed(type(exc).__qualname__, str(exc))
                    await self._requeue_after_error(message)
                    return
                if taken is None:
                    return
                claim: Claim | None = None
                try:
                    claim = self._claim_of(taken)
                    payload = await self._start(message, taken, claim)
                except Exception as exc:
                    delivery_failed(type(exc).__qualname__, str(exc))
                    await self._ack_after_error(message, claim, exc)
                    return
                if claim is not None and payload is not None:
                    self.intake.handler_started()
                    try:
                        await self.runner.run(claim, payload)
                    finally:
                        self.intake.handler_ended()

    async def _take(self, message: Delivery) -> Taken | None:
        """Decode and claim: the claim commits last. None when the delivery is done with
        (settled, or left for the broker to requeue when the worker stops)."""
        try:
            envelope = decode(message.body)
            message_id = uuid.UUID(str(message.message_id))
            if message.message_type is not None and message.message_type != envelope.type:
                raise PoisonMessage(
                    f"message type {message.message_type!r} disagrees with its body "
                    f"({envelope.type!r})"
                )
        except (PoisonMessage, ValueError) as exc:
            await self._dead_letter(message, "bad_envelope", str(exc))
            return None
        try:
            job_type = self.registry.get(envelope.type)
        except UnknownJobType as exc:
            await self._note_undeliverable(envelope, exc)
            await self._dead_letter(message, "unknown_type", str(exc), envelope)
            return None
        row = await self._claim(message_id, envelope, job_type)
        if row is None:
            return None  # stopping while the database was away: the broker redelivers
        if row.get("resumed"):
            log.info(
                "the claim's first try committed unanswered; running the job it claimed",
                extra={"message_id": str(message_id), "job_id": str(envelope.job_id)},
            )
        return Taken(message_id, envelope, job_type, row)

    @staticmethod
    def _claim_of(taken: Taken) -> Claim | None:
        """The job this worker now holds the lease of, if the claim took one."""
        row = taken.row
        if not row["fresh"] or row["id"] is None:
            return None
        return Claim(
            job_id=row["id"],
            job_type=taken.job_type,
            raw_payload=row["payload"],
            attempt=row["attempts"],
            max_attempts=row["max_attempts"],
            lease_token=row["lease_token"],
            cancel_requested=row["cancel_requested_at"] is not None,
            trace_headers=trace_headers_of(row),
            message_id=taken.message_id,
            created_at=row["created_at"],
            due_at=row["due_at"],
            payload_ref=row.get("payload_ref"),
            store_give_backs=row.get("store_give_backs", 0),
        )

    async def _start(
        self, message: Delivery, taken: Taken, claim: Claim | None
    ) -> BaseModel | None:
        """After the claim: settle the delivery; the validated payload if the job runs."""
        if claim is None:
            held_reason = taken.row.get("held_reason")
            if held_reason is not None:
                self.metrics.held(held_reason)
                log.debug(
                    "job held by its gate; message acknowledged, the job waits",
                    extra={**_fields(message, taken.envelope), "held_reason": held_reason},
                )
            elif not taken.row["fresh"]:
                self.metrics.duplicate()
                log.debug("duplicate message acknowledged", extra=_fields(message, taken.envelope))
            elif taken.row["parked"]:
                # Its queue or type is paused: the job waits in the outbox, attempt unburnt.
                self.metrics.parked()
                log.info(
                    "queue or job type paused; message parked in the outbox",
                    extra=_fields(message, taken.envelope),
                )
            else:
                self.metrics.skipped()
                log.info(
                    "job not claimable; message acknowledged with no effect",
                    extra={
                        **_fields(message, taken.envelope),
                        "status": taken.row["status_before"],
                    },
                )
            await self._ack(message)
            return None
        try:
            raw_payload = await self.runner.load_payload(claim)
        except (OSError, ResultNotFound) as exc:
            # The object store is away (not the job's fault: it goes back to pending without
            # consuming an attempt, like a result the store could not take), or the object
            # is gone, the local directory unreadable (this attempt fails, retried later).
            await self._ack(message)
            await self.runner.after_store_error(claim, exc, during="reading the payload")
            return None
        try:
            payload: BaseModel = taken.job_type.validate_payload(raw_payload)
        except InvalidPayloadError as exc:
            await self.runner.fail_invalid_payload(claim, exc)
            await self._dead_letter(message, "invalid_payload", str(exc), taken.envelope)
            return None
        await self._ack(message)
        return payload

    async def _requeue_after_error(self, message: Delivery) -> None:
        """Before the claim committed: nothing happened, so the message goes back to its
        queue, after a pause that grows with its redeliveries."""
        self.progress.failed()
        self.metrics.delivery_error("before_claim")
        log.exception(
            "unexpected error before the claim; the delivery is requeued",
            extra={**_fields(message, None), "delivery_count": message.delivery_count},
        )
        await self.sleep(message.requeue_pause())  # stopping ends it: requeued at once
        if not await message.requeue() and not message.settled:
            log.debug("requeue failed; the broker requeues it when the channel closes")

    async def _ack_after_error(
        self, message: Delivery, claim: Claim | None, exc: Exception
    ) -> None:
        """After the claim committed: the claim is the record now, so the delivery is
        acknowledged (a redelivery would only meet the inbox) and a claimed job's attempt
        ends as a retryable failure with this error."""
        self.progress.failed()
        self.metrics.delivery_error("after_claim")
        log.exception(
            "unexpected error after the claim; the delivery is acknowledged",
            extra=_fields(message, None),
        )
        await self._ack(message)
        if claim is not None:
            await self.runner.fail_attempt(claim, exc, during="starting the job")

    async def _note_undeliverable(self, envelope: JobMessage, exc: UnknownJobType) -> None:
        """Tell the job's pollers why it stays pending (best effort: the message is kept in
        the dead-letter queue whether or not this is written)."""
        error = undeliverable_note(envelope.attempt, exc)
        params: JobNoteUndeliverableParams = {
            "job_id": envelope.job_id,
            "type": envelope.type,
            "attempt": envelope.attempt,
            "error": error,
        }
        try:
            async with self.connections.connection() as conn:
                await job_store.note_undeliverable(conn, params)
        except JobcoreError as exc_db:
            log.info("could not note the undeliverable job", extra={"error": str(exc_db)})
        except psycopg.DataError as exc_data:
            # The database refused a value taken from this message (the statement carries
            # nothing else): left to escape, the error would requeue the poison message at
            # every delivery, until the broker's delivery limit dead-lettered it.
            log.warning(
                "the database refused the note on the undeliverable job",
                extra={"job_id": str(envelope.job_id), "error": str(exc_data)},
            )

    async def _claim(
        self, message_id: uuid.UUID, envelope: JobMessage, job_type: JobType[Any]
    ) -> dict[str, Any] | None:
        # The lease token is drawn once, before the first try: a retry whose first try
        # committed unanswered finds the job running under it, and takes it as its own
        # (JOB_CLAIM_MANY's `resumed`) instead of reading its own inbox row as a duplicate.
        request = ClaimRequest(
            message_id=message_id,
            job_id=envelope.job_id,
            job_type=envelope.type,
            attempt=envelope.attempt,
            lease_token=uuid.uuid4(),
            lease=job_type.lease,
            limited=job_type.concurrency is not None or job_type.rate is not None,
        )
        failures = 0
        warned = False
        while True:
            try:
                return await self.claims.submit(request)
            except (DatabaseUnavailable, TransientConflict) as exc:
                failures += 1
                # A held connection that went stale fails at once: try again at once, on a
                # fresh one. A pool that found no connection in db_connect_timeout already
                # waited, and the database is down: say so now rather than after a 2nd wait.
                if failures == 1 and not isinstance(exc.__cause__, PoolTimeout):
                    continue
                # Hold the delivery (unacknowledged) rather than requeue it: requeues count
                # towards the quorum queue's delivery limit and would dead-letter good jobs.
                if not warned:
                    warned = True
                    log.warning(
                        "database unavailable; holding the delivery until it is back",
                        extra={"message_id": str(message_id), "error": str(exc)},
                    )
                if await self.sleep(1.0):
                    return None

    async def _claim_batch(self, requests: Sequence[ClaimRequest]) -> list[dict[str, Any]]:
        """The batch's claims, one statement per round of distinct message ids (one round
        unless a message came twice); a request repeated (its message and token) is a
        duplicate the 2nd time."""
        rows: dict[tuple[uuid.UUID, uuid.UUID], dict[str, Any]] = {}
        async with self.connections.connection() as conn:
            for round_ in _claim_rounds(requests):
                params: JobClaimManyParams = {
                    "consumer": JOBS_CONSUMER,
                    "exchange": self.broker.topology.jobs_exchange,
                    "worker_id": self.worker_id,
                    "message_ids": [r.message_id for r in round_],
                    "job_ids": [r.job_id for r in round_],
                    "types": [r.job_type for r in round_],
                    "attempts": [r.attempt for r in round_],
                    "lease_tokens": [r.lease_token for r in round_],
                    "leases": [r.lease for r in round_],
                }
                # Every claim locks the gate rows of its jobs' concurrency and rate keys
                # first, read from the job rows (written at enqueue), not from this worker's
                # registry: a worker deployed before a type's limit still takes the lock and
                # counts behind it. The claim then counts from a snapshot every other claim
                # of those keys committed before. One round trip: BEGIN, lock, claim and
                # COMMIT pipelined. Jobs whose rows name no key are claimed first, by one
                # statement that locks nothing (most batches: that statement is the whole
                # claim).
                claimed = await job_store.claim(conn, params, keyed=any(r.limited for r in round_))
                by_message = {row["message_id"]: row for row in claimed}
                for r in round_:
                    rows[r.message_id, r.lease_token] = dict(by_message[r.message_id])
        self.progress.progressed()
        answers: list[dict[str, Any]] = []
        answered: set[tuple[uuid.UUID, uuid.UUID]] = set()
        for request in requests:
            key = (request.message_id, request.lease_token)
            row = dict(rows[key])
            if key in answered:
                row.update(fresh=False, id=None)
            answered.add(key)
            answers.append(row)
        return answers

    async def _ack(self, message: Delivery) -> None:
        if message.settled:
            return
        if not await message.ack():
            # The claim is committed; the redelivery this causes hits the inbox.
            log.debug("ack failed; the redelivery will be deduplicated")

    async def _dead_letter(
        self,
        message: Delivery,
        reason: str,
        error: str,
        envelope: JobMessage | None = None,
    ) -> None:
        self.metrics.dead_lettered(reason)
        delivery_failed(reason, error)
        log.warning(
            "poison message sent to the dead-letter queue",
            extra={**_fields(message, envelope), "reason": reason, "error": error},
        )
        if await message.dead_letter():
            self.progress.progressed()
        else:
            log.debug("reject failed; the message will be redelivered and rejected again")


def _claim_rounds(requests: Sequence[ClaimRequest]) -> list[list[ClaimRequest]]:
    """The batch's distinct requests (message and lease token) in rounds, each holding a
    message at most once: the claim statement takes distinct message ids.

    Two requests for one message with different tokens are a redelivery and a retry whose
    first try may have committed unanswered. Sent in the same statement, one would have
    to be dropped, and dropping the retry loses the job: the redelivery finds the message
    received and is a duplicate, the retry never resumes, and the job runs with no handler
    until the reaper takes it back, an attempt burnt. In rounds, each committing before the
    next, whichever comes first sees the other's doing: the retry whose try committed is
    resumed, in any order, and every other request for that message is a duplicate; if
    none committed, the first round's claims the job and the later ones are duplicates."""
    rounds: list[list[ClaimRequest]] = []
    seen: dict[uuid.UUID, set[uuid.UUID]] = {}
    for request in requests:
        tokens = seen.setdefault(request.message_id, set())
        if request.lease_token in tokens:
            continue  # the same request again: answered as a duplicate
        if len(tokens) == len(rounds):
            rounds.append([])
        rounds[len(tokens)].append(request)
        tokens.add(request.lease_token)
    return rounds


def consumer_priority(settings: Settings) -> int:
    """This worker's consumer priority: the setting, else a random one for the process
    (any order of the workers concentrates a trickle; equal ones share it round-robin)."""
    if settings.worker_consumer_priority is not None:
        return settings.worker_consumer_priority
    return random.randint(1, MAX_CONSUMER_PRIORITY)


def _fields(message: Delivery, envelope: JobMessage | None) -> dict[str, Any]:
    fields: dict[str, Any] = {"message_id": message.message_id}
    if envelope is not None:
        fields.update(job_id=str(envelope.job_id), job_type=envelope.type)
        fields["attempt"] = envelope.attempt
    return fields
