"""The webhooks consumer settles every message too: one whose outcome cannot be recorded
(an error no code path expects) is requeued and sent again, not held until the channel
closes."""

from __future__ import annotations

import httpx

from jobcore.database.gateway import Database
from jobcore.database.sql.inbox import WEBHOOKS_CONSUMER
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from services.worker.app import Worker
from tests.integration.webhooks.support import delivery_in, receiving
from tests.integration.webhooks.test_delivery import enqueue_with_callback
from tests.integration.worker.support import InboxRefusal, OutboxPump, running_pump


async def test_a_webhook_whose_outcome_cannot_be_recorded_is_requeued_and_sent_again(
    hsettings: Settings,
    db: Database,
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    broker_cleanup: None,
) -> None:
    refusal = InboxRefusal(db, WEBHOOKS_CONSUMER)
    await refusal.start()
    worker = Worker(hsettings, health=False)
    async with receiving() as receiver, running_pump(OutboxPump(hsettings, db)):
        await worker.start()
        try:
            job_id = await enqueue_with_callback(api_client, auth, receiver.url())

            async def refused_twice() -> bool:
                return await refusal.refusals() >= 2

            # Sent, its outcome refused, requeued, sent again: not held after the first.
            await eventually(refused_twice, timeout=30, what="the message to come back")
            await refusal.stop()
            delivery = await eventually(
                delivery_in(db, job_id, "delivered"), timeout=30, what="the delivery"
            )
        finally:
            await worker.stop()
    # At least once: every refused record was a request that went out.
    assert len(receiver.requests) >= 3
    assert {r.headers["webhook-id"] for r in receiver.requests} == {str(delivery["id"])}
    assert delivery["attempts"] == 1  # refused records are no attempts
    assert worker.metrics.counts["delivery_errors.webhook"] >= 2
