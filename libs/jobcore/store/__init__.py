"""The stores: one owner per table for what the rest of the code does to it.

:class:`JobStore` (:data:`job_store`) owns ``jobs`` and is the only importer of its
statements (:mod:`jobcore.sql.jobs`; an import contract in pyproject.toml says so);
:class:`OutboxStore` is the relay's side of ``outbox``, :class:`WebhookDeliveryStore` the
webhook worker's side of ``webhook_deliveries``. Services call a store or a use case
(:mod:`jobcore.usecases`), never :mod:`jobcore.sql` (another contract). A store method
runs one statement, or one pipelined round trip, through the gateway (:mod:`jobcore.db`)
on the caller's session, unit of work or connection, and returns its rows.
"""

from jobcore.sql import CompletionParams, OutboxMessageParams, Statement
from jobcore.sql.inbox import JOBS_CONSUMER, WEBHOOKS_CONSUMER
from jobcore.store.jobs import (
    CANCEL_CHANNEL,
    JobClaimManyParams,
    JobFencedParams,
    JobFilesKeptParams,
    JobGateParams,
    JobHeartbeatParams,
    JobInsertManyParams,
    JobInsertParams,
    JobListAllTenantsParams,
    JobListParams,
    JobNoteUndeliverableParams,
    JobProgressSetParams,
    JobPruneCountParams,
    JobReapExpiredParams,
    JobReleaseHeldParams,
    JobReleaseParams,
    JobRepublishStaleParams,
    JobRetryParams,
    JobStore,
    JobSucceedManyParams,
    job_store,
)
from jobcore.store.outbox import OutboxStore, outbox_store
from jobcore.store.webhooks import (
    WEBHOOK_MESSAGE_TYPE,
    WebhookDeliveryRecordAttemptParams,
    WebhookDeliveryStore,
    webhook_delivery_store,
)

__all__ = [
    "CANCEL_CHANNEL",
    "JOBS_CONSUMER",
    "WEBHOOKS_CONSUMER",
    "WEBHOOK_MESSAGE_TYPE",
    "CompletionParams",
    "JobClaimManyParams",
    "JobFencedParams",
    "JobFilesKeptParams",
    "JobGateParams",
    "JobHeartbeatParams",
    "JobInsertManyParams",
    "JobInsertParams",
    "JobListAllTenantsParams",
    "JobListParams",
    "JobNoteUndeliverableParams",
    "JobProgressSetParams",
    "JobPruneCountParams",
    "JobReapExpiredParams",
    "JobReleaseHeldParams",
    "JobReleaseParams",
    "JobRepublishStaleParams",
    "JobRetryParams",
    "JobStore",
    "JobSucceedManyParams",
    "OutboxMessageParams",
    "OutboxStore",
    "Statement",
    "WebhookDeliveryRecordAttemptParams",
    "WebhookDeliveryStore",
    "job_store",
    "outbox_store",
    "webhook_delivery_store",
]
