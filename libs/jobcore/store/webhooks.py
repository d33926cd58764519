"""The webhook worker's side of ``webhook_deliveries`` (:mod:`jobcore.sql.webhook_deliveries`):
:class:`WebhookDeliveryStore`. Deliveries are created by the statements that end a job
(:class:`jobcore.store.JobStore`)."""

from __future__ import annotations

from psycopg.rows import DictRow

from jobcore.db import AsyncConn, Session, fetch_one
from jobcore.sql.webhook_deliveries import (
    WEBHOOK_DELIVERY_GET_FOR_ATTEMPT,
    WEBHOOK_DELIVERY_RECORD_ATTEMPT,
    WEBHOOK_MESSAGE_TYPE,
    WebhookDeliveryGetForAttemptParams,
    WebhookDeliveryRecordAttemptParams,
)

__all__ = [
    "WEBHOOK_MESSAGE_TYPE",
    "WebhookDeliveryGetForAttemptParams",
    "WebhookDeliveryRecordAttemptParams",
    "WebhookDeliveryStore",
    "webhook_delivery_store",
]

Reader = Session | AsyncConn


class WebhookDeliveryStore:
    __slots__ = ()

    async def get_for_attempt(
        self, on: Reader, params: WebhookDeliveryGetForAttemptParams
    ) -> DictRow | None:
        return await fetch_one(on, WEBHOOK_DELIVERY_GET_FOR_ATTEMPT(params))

    async def record_attempt(
        self, on: Reader, params: WebhookDeliveryRecordAttemptParams
    ) -> DictRow | None:
        return await fetch_one(on, WEBHOOK_DELIVERY_RECORD_ATTEMPT(params))


webhook_delivery_store = WebhookDeliveryStore()
