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
  kept at most the concurrency (:meth:`~jobcore.kernel.settings.Settings.job_prefetch`): a
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
:class:`~services.worker.readiness.ConsumerReadiness` reports the stall on ``/readyz``.

The claim, the payload, the handler and the outcome are the execution core's
(:class:`jobcore.execution.executor.JobExecutor`): the consumer turns a delivery into a
:class:`~jobcore.execution.claims.ClaimRequest`, claims it in a batch, and settles the
delivery between the core's steps.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout
from pydantic import BaseModel

from jobcore.amqp.connection import broker_server
from jobcore.amqp.consuming import DeliveryConsumer
from jobcore.amqp.deliveries import Delivery, JobQueueConsumer
from jobcore.amqp.topology import Topology
from jobcore.database.store import JobNoteUndeliverableParams, job_store
from jobcore.execution.claims import ClaimAnswer, ClaimedJob, ClaimRequest, Unclaimed
from jobcore.execution.executor import PAYLOAD_UNREADABLE, JobExecutor
from jobcore.execution.outcomes import undeliverable_note
from jobcore.execution.registry import InvalidPayloadError, Registry
from jobcore.kernel.envelope import JobMessage, decode, read_published
from jobcore.kernel.errors import (
    DatabaseUnavailable,
    JobcoreError,
    PoisonMessage,
    TransientConflict,
    UnknownJobType,
)
from jobcore.kernel.settings import MAX_CONSUMER_PRIORITY, Settings
from services.worker.batching import Batcher
from services.worker.connections import HeldConnections
from services.worker.direct import DirectPickup
from services.worker.intake import Intake
from services.worker.metrics import WorkerMetrics
from services.worker.readiness import ConsumerReadiness
from services.worker.tracing import delivery_failed, process_span

log = logging.getLogger(__name__)


# After the handlers' grace period, how long giving back the remaining leases may take.
RELEASE_TIMEOUT = 5.0


class Consumer(DeliveryConsumer):
    name = "worker-consumer"
    label = "worker"

    def __init__(
        self,
        settings: Settings,
        connections: HeldConnections,
        executor: JobExecutor,
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
        self.executor = executor
        self.registry = registry
        self.queues = consumed
        self.worker_id = worker_id
        self.metrics = metrics
        topology = Topology.from_settings(settings)
        self._queue_of = {topology.queue_name(queue): queue for queue in self.queues}
        metrics.consuming(self.queues)
        # server.address / server.port of the process spans.
        self._broker_server = broker_server(settings)
        self.claims: Batcher[ClaimRequest, ClaimAnswer] = Batcher(executor.claim)
        self._slots = asyncio.Semaphore(concurrency)
        self.intake = Intake(self.broker, concurrency)
        self.readiness = ConsumerReadiness(settings.worker_stall_after)
        # Heard through the cancel listener's connection (services/worker/app.py); the jobs
        # it claims are tracked as deliveries are, so stopping waits for them and gives back
        # their leases after the grace period.
        self.direct = (
            DirectPickup(
                executor,
                registry,
                self.queues,
                slots=self._slots,
                limit=concurrency,
                intake=self.intake,
                metrics=metrics,
                track=self.track,
            )
            if settings.direct_pickup
            else None
        )

    @property
    def broker_connected(self) -> bool:
        return self.broker.connected

    def outbox_notified(self) -> None:
        if self.direct is not None and self.consuming:
            self.direct.notified()

    async def started(self) -> None:
        self.intake.start()
        if self.direct is not None:
            self.direct.start()
        log.info(
            "worker consuming",
            extra={
                "queues": self.queues,
                "worker_id": self.worker_id,
                "consumer_priority": self.priority,
            },
        )

    async def stop_taking(self) -> None:
        if self.direct is not None:
            await self.direct.stop()
        await self.intake.stop()

    async def grace_over(self) -> None:
        """Give back the leases of the jobs still running."""
        log.info(
            "grace period over; giving back the leases of running jobs",
            extra={"running": len(self.executor.running)},
        )
        self.executor.release_all()
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
                    with self.readiness.waiting():
                        taken = await self._take(message)
                except Exception as exc:
                    delivery_failed(type(exc).__qualname__, str(exc))
                    await self._requeue_after_error(message)
                    return
                if taken is None:
                    return
                request, answer = taken
                job: ClaimedJob | None = None
                try:
                    if isinstance(answer, Unclaimed):
                        await self._settle_unclaimed(message, request, answer)
                        return
                    job = answer
                    payload = await self._start(message, job)
                except Exception as exc:
                    delivery_failed(type(exc).__qualname__, str(exc))
                    await self._ack_after_error(message, job, exc)
                    return
                if payload is not None:
                    self.intake.handler_started()
                    try:
                        await self.executor.run(job, payload)
                    finally:
                        self.intake.handler_ended()

    async def _take(self, message: Delivery) -> tuple[ClaimRequest, ClaimAnswer] | None:
        """Decode and claim: the claim commits last; the request and its answer. None when
        the delivery is done with (settled, or left for the broker to requeue when the
        worker stops)."""
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
            await self._note_undeliverable(envelope, exc, message_id, message.headers)
            await self._dead_letter(message, "unknown_type", str(exc), envelope)
            return None
        published_at, published_by = read_published(message.headers)
        request = ClaimRequest(
            message_id,
            envelope.job_id,
            job_type,
            envelope.attempt,
            published_at=published_at,
            published_by=published_by,
        )
        answer = await self._claim(request)
        if answer is None:
            return None  # stopping while the database was away: the broker redelivers
        if isinstance(answer, ClaimedJob) and answer.resumed:
            log.info(
                "the claim's first try committed unanswered; running the job it claimed",
                extra={"message_id": str(message_id), **answer.log_fields},
            )
        return request, answer

    async def _settle_unclaimed(
        self, message: Delivery, request: ClaimRequest, unclaimed: Unclaimed
    ) -> None:
        """No lease was taken: count why, and acknowledge the delivery."""
        fields = {
            "message_id": message.message_id,
            "job_id": str(request.job_id),
            "job_type": request.job_type.name,
            "attempt": request.attempt,
        }
        if unclaimed.reason == "held":
            self.metrics.held(unclaimed.detail or "")
            log.debug(
                "job held by its gate; message acknowledged, the job waits",
                extra={**fields, "held_reason": unclaimed.detail},
            )
        elif unclaimed.reason == "duplicate":
            self.metrics.duplicate()
            log.debug("duplicate message acknowledged", extra=fields)
        elif unclaimed.reason == "parked":
            # Its queue or type is paused: the job waits in the outbox, attempt unburnt.
            self.metrics.parked()
            log.info("queue or job type paused; message parked in the outbox", extra=fields)
        else:
            self.metrics.skipped()
            log.info(
                "job not claimable; message acknowledged with no effect",
                extra={**fields, "status": unclaimed.detail},
            )
        await self._ack(message)

    async def _start(self, message: Delivery, job: ClaimedJob) -> BaseModel | None:
        """After the claim: settle the delivery; the validated payload if the job runs."""
        try:
            payload = await self.executor.payload_of(job)
        except PAYLOAD_UNREADABLE as exc:
            # The object store is away (not the job's fault: it goes back to pending without
            # consuming an attempt, like a result the store could not take), or the object
            # is gone, the local directory unreadable (this attempt fails, retried later).
            await self._ack(message)
            await self.executor.end_unstarted(job, exc)
            return None
        except InvalidPayloadError as exc:
            await self.executor.end_unstarted(job, exc)
            await self._dead_letter(message, "invalid_payload", str(exc), job=job)
            return None
        await self._ack(message)
        return payload

    async def _requeue_after_error(self, message: Delivery) -> None:
        """Before the claim committed: nothing happened, so the message goes back to its
        queue, after a pause that grows with its redeliveries."""
        self.readiness.failed()
        self.metrics.delivery_error("before_claim")
        log.exception(
            "unexpected error before the claim; the delivery is requeued",
            extra={**_fields(message), "delivery_count": message.delivery_count},
        )
        await self.sleep(message.requeue_pause())  # stopping ends it: requeued at once
        if not await message.requeue() and not message.settled:
            log.debug("requeue failed; the broker requeues it when the channel closes")

    async def _ack_after_error(
        self, message: Delivery, job: ClaimedJob | None, exc: Exception
    ) -> None:
        """After the claim committed: the claim is the record now, so the delivery is
        acknowledged (a redelivery would only meet the inbox) and a claimed job's attempt
        ends as a retryable failure with this error."""
        self.readiness.failed()
        self.metrics.delivery_error("after_claim")
        log.exception(
            "unexpected error after the claim; the delivery is acknowledged",
            extra=_fields(message),
        )
        await self._ack(message)
        if job is not None:
            await self.executor.fail_attempt(job, exc, during="starting the job")

    async def _note_undeliverable(
        self,
        envelope: JobMessage,
        exc: UnknownJobType,
        message_id: uuid.UUID,
        headers: Mapping[str, Any],
    ) -> None:
        """Tell the job's pollers why it stays pending (best effort: the message is kept in
        the dead-letter queue whether or not this is written), with the message's publish
        when no claim will keep it (its headers: jobcore.kernel.envelope.PUBLISHED_HEADER)."""
        error = undeliverable_note(envelope.attempt, exc)
        published_at, published_by = read_published(headers)
        params: JobNoteUndeliverableParams = {
            "job_id": envelope.job_id,
            "type": envelope.type,
            "attempt": envelope.attempt,
            "error": error,
            "message_id": message_id,
            "published_at": published_at,
            "published_by": published_by,
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

    async def _claim(self, request: ClaimRequest) -> ClaimAnswer | None:
        """The claim's answer, tried again while the database is away (None: the worker
        stops meanwhile; the broker redelivers). The request keeps its lease token across
        tries, so a try that committed unanswered is resumed by the next."""
        failures = 0
        warned = False
        while True:
            try:
                answer = await self.claims.submit(request)
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
                        extra={"message_id": str(request.message_id), "error": str(exc)},
                    )
                if await self.sleep(1.0):
                    return None
            else:
                self.readiness.progressed()
                return answer

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
        *,
        job: ClaimedJob | None = None,
    ) -> None:
        self.metrics.dead_lettered(reason)
        delivery_failed(reason, error)
        log.warning(
            "poison message sent to the dead-letter queue",
            extra={**_fields(message, envelope, job), "reason": reason, "error": error},
        )
        if await message.dead_letter():
            self.readiness.progressed()
        else:
            log.debug("reject failed; the message will be redelivered and rejected again")


def consumer_priority(settings: Settings) -> int:
    """This worker's consumer priority: the setting, else a random one for the process
    (any order of the workers concentrates a trickle; equal ones share it round-robin)."""
    if settings.worker_consumer_priority is not None:
        return settings.worker_consumer_priority
    return random.randint(1, MAX_CONSUMER_PRIORITY)


def _fields(
    message: Delivery, envelope: JobMessage | None = None, job: ClaimedJob | None = None
) -> dict[str, Any]:
    fields: dict[str, Any] = {"message_id": message.message_id}
    if job is not None:
        fields.update(job.log_fields)
    elif envelope is not None:
        fields.update(job_id=str(envelope.job_id), job_type=envelope.type)
        fields["attempt"] = envelope.attempt
    return fields
