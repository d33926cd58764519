"""The webhooks' tables, a store each:

- :class:`WebhookDeliveryStore`, ``webhook_deliveries`` (:mod:`jobcore.sql.webhook_deliveries`):
  the webhook worker's attempt (read, record) and the operators' list and redelivery.
  Deliveries are created by the statements that end a job (:class:`jobcore.store.JobStore`).
- :class:`WebhookEndpointStore`, ``webhook_endpoints`` (:mod:`jobcore.sql.webhook_endpoints`):
  each tenant's default endpoint per job type.
- :class:`WebhookSecretStore`, ``tenant_webhook_secrets``
  (:mod:`jobcore.sql.tenant_webhook_secrets`): each tenant's signing secret.
"""

from __future__ import annotations

from psycopg.rows import DictRow

from jobcore.db import Reader, fetch_all, fetch_one
from jobcore.sql.tenant_webhook_secrets import (
    WEBHOOK_SECRET_ENSURE,
    WEBHOOK_SECRET_ROTATE,
    WebhookSecretEnsureParams,
    WebhookSecretRotateParams,
)
from jobcore.sql.webhook_deliveries import (
    WEBHOOK_DELIVERY_GET_FOR_ATTEMPT,
    WEBHOOK_DELIVERY_LIST,
    WEBHOOK_DELIVERY_LIST_FOR_JOB,
    WEBHOOK_DELIVERY_RECORD_ATTEMPT,
    WEBHOOK_DELIVERY_REDELIVER,
    WEBHOOK_MESSAGE_TYPE,
    WebhookDeliveryGetForAttemptParams,
    WebhookDeliveryListForJobParams,
    WebhookDeliveryListParams,
    WebhookDeliveryRecordAttemptParams,
    WebhookDeliveryRedeliverParams,
)
from jobcore.sql.webhook_endpoints import (
    WEBHOOK_ENDPOINT_DELETE,
    WEBHOOK_ENDPOINT_LIST,
    WEBHOOK_ENDPOINT_SET,
    WebhookEndpointDeleteParams,
    WebhookEndpointListParams,
    WebhookEndpointSetParams,
)

__all__ = [
    "WEBHOOK_MESSAGE_TYPE",
    "WebhookDeliveryGetForAttemptParams",
    "WebhookDeliveryListForJobParams",
    "WebhookDeliveryListParams",
    "WebhookDeliveryRecordAttemptParams",
    "WebhookDeliveryRedeliverParams",
    "WebhookDeliveryStore",
    "WebhookEndpointDeleteParams",
    "WebhookEndpointListParams",
    "WebhookEndpointSetParams",
    "WebhookEndpointStore",
    "WebhookSecretEnsureParams",
    "WebhookSecretRotateParams",
    "WebhookSecretStore",
    "webhook_delivery_store",
    "webhook_endpoint_store",
    "webhook_secret_store",
]


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

    async def list_deliveries(self, on: Reader, params: WebhookDeliveryListParams) -> list[DictRow]:
        """Deliveries, newest first, of one job and/or in one status when given."""
        return await fetch_all(on, WEBHOOK_DELIVERY_LIST(params))

    async def list_for_job(
        self, on: Reader, params: WebhookDeliveryListForJobParams
    ) -> list[DictRow]:
        """A tenant's job's deliveries, oldest first (one row of NULL delivery columns for
        its job without deliveries; none for no such job)."""
        return await fetch_all(on, WEBHOOK_DELIVERY_LIST_FOR_JOB(params))

    async def redeliver(self, on: Reader, params: WebhookDeliveryRedeliverParams) -> DictRow | None:
        """Make a delivery pending again, with an outbox message for a new attempt now;
        None if there is no such delivery."""
        return await fetch_one(on, WEBHOOK_DELIVERY_REDELIVER(params))


class WebhookEndpointStore:
    __slots__ = ()

    async def set(self, on: Reader, params: WebhookEndpointSetParams) -> DictRow | None:
        """Make ``url`` the tenant's default endpoint for a job type (an upsert)."""
        return await fetch_one(on, WEBHOOK_ENDPOINT_SET(params))

    async def list_endpoints(self, on: Reader, params: WebhookEndpointListParams) -> list[DictRow]:
        return await fetch_all(on, WEBHOOK_ENDPOINT_LIST(params))

    async def delete(self, on: Reader, params: WebhookEndpointDeleteParams) -> DictRow | None:
        """Remove the tenant's default endpoint for a job type; None if it had none."""
        return await fetch_one(on, WEBHOOK_ENDPOINT_DELETE(params))


class WebhookSecretStore:
    __slots__ = ()

    async def ensure(self, on: Reader, params: WebhookSecretEnsureParams) -> DictRow | None:
        """The tenant's signing secrets, created with ``secret`` if it has none; None when
        a concurrent creation won the race (run it again)."""
        return await fetch_one(on, WEBHOOK_SECRET_ENSURE(params))

    async def rotate(self, on: Reader, params: WebhookSecretRotateParams) -> DictRow | None:
        """Make ``secret`` the tenant's current one, the replaced one signing for
        ``overlap`` seconds more."""
        return await fetch_one(on, WEBHOOK_SECRET_ROTATE(params))


webhook_delivery_store = WebhookDeliveryStore()
webhook_endpoint_store = WebhookEndpointStore()
webhook_secret_store = WebhookSecretStore()
