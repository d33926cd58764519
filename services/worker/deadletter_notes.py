"""Dead-letter notes: each message the broker dead-letters is noted on its job and counted.

The dead-letter exchange is a fanout feeding two queues: ``<prefix>.dead``, which
operators list and replay (`jobcore dlq`), and ``<prefix>.dead.notes``, whose copies every
worker consumes here, one message at a time per worker:

- reason ``rejected``: a worker rejected the message as poison, and already noted it on
  its job (where there is one) and counted it; the copy is acknowledged and nothing else.
- any other reason (``delivery_limit``, ``expired``, ``maxlen``): counted in
  ``jobcore_worker_broker_dead_letters_total{reason}`` and, for the message of a pending
  job's current attempt, noted on the job (:func:`jobcore.maintenance.stranded.note_dead_letter`).
  The sweeper publishes such a job again once it is stale.

A copy is acknowledged once its note committed; while the database is away it is held,
retried every second (a requeue would count towards the queue's delivery limit).
"""

from __future__ import annotations

import logging

from jobcore.amqp.consuming import DeliveryConsumer
from jobcore.amqp.deadletters import DeadLetter, DeadLetterNotesFeed, describe_parts
from jobcore.amqp.deliveries import Delivery
from jobcore.database.gateway import Database
from jobcore.kernel.errors import DatabaseUnavailable
from jobcore.kernel.settings import Settings
from jobcore.maintenance.stranded import REJECTED_BY_A_WORKER, note_dead_letter
from services.worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)

# Notes are rare and cheap: a few at once keep a burst of dead letters moving without
# taking more than a couple of the pool's connections.
PREFETCH = 4


class DeadLetterNotes(DeliveryConsumer):
    name = "worker-dead-letter-notes"
    label = "dead-letter notes"

    def __init__(self, settings: Settings, db: Database, metrics: WorkerMetrics) -> None:
        # Unfinished notes stay unacknowledged: the broker hands them to another worker.
        super().__init__(
            DeadLetterNotesFeed(settings), prefetch=PREFETCH, grace=settings.shutdown_grace
        )
        self.settings = settings
        self.db = db
        self.metrics = metrics

    async def handle(self, message: Delivery) -> None:
        try:
            await self._note_and_ack(message)
        except Exception:
            # Settled whatever happened, or it would hold a prefetch slot for good: the
            # notes queue has no dead-letter exchange, so this drops only the copy (the
            # original stays in the dead-letter queue, and the sweeper is the backstop).
            log.exception("unexpected error noting a dead letter; its copy is dropped")
            await message.dead_letter()

    async def _note_and_ack(self, message: Delivery) -> None:
        letter = describe_parts(
            message.headers,
            message.body,
            message_id=message.message_id,
            message_type=message.message_type,
        )
        if letter.reason == REJECTED_BY_A_WORKER:
            await message.ack()
            return
        noted = await self._note(letter)
        if noted is None:
            return  # stopping while the database was away: the broker redelivers it
        reason = letter.reason or "unknown"
        self.metrics.broker_dead_letter(reason)
        log.warning(
            "the broker dead-lettered a message",
            extra={
                "reason": reason,
                "message_id": letter.message_id,
                "message_type": letter.message_type,
                "job_id": letter.job_id,
                "attempt": letter.attempt,
                "queue": letter.queue,
                "noted_on_job": noted,
            },
        )
        await message.ack()

    async def _note(self, letter: DeadLetter) -> bool | None:
        """Whether a job took the note; None if stopping before the database answered."""

        async def note() -> bool:
            async with self.db.session() as session:
                return await note_dead_letter(session, letter)

        return await self.retry_while_unavailable(
            note,
            DatabaseUnavailable,
            "dead-letter notes: database unavailable; holding the message",
            {"message_id": letter.message_id},
        )
