"""The stores: the one way into the database. Only this package imports the statements
(:mod:`jobcore.database.sql`; an import contract in pyproject.toml says so). Use cases, maintenance,
services and the testing kit call a store; a store method runs one statement (or one
pipelined round trip) through the gateway (:mod:`jobcore.database.gateway`) on the caller's session,
unit of work or connection, with the statement's typed parameters, and returns its rows.

Each table has one store that runs what is done to it, except that a job's statements also
write the rows that go with it (its outbox message, events, gates, webhook deliveries,
its tenant's usage), all through :class:`JobStore`:

- :class:`JobStore` (:mod:`~jobcore.database.store.jobs`): ``jobs``, and the rows written
  with a job.
- :class:`OutboxStore` (:mod:`~jobcore.database.store.outbox`): ``outbox``, the relay's cycle, its
  wake-ups and the operators' statements.
- :class:`InboxStore` (:mod:`~jobcore.database.store.inbox`): ``inbox`` retention.
- :class:`ApiKeyStore` (:mod:`~jobcore.database.store.api_keys`): ``api_keys``.
- :class:`TenantStore` (:mod:`~jobcore.database.store.tenants`): ``tenant_quotas``, ``tenant_usage``
  and its deltas.
- :class:`ScheduleStore` (:mod:`~jobcore.database.store.schedules`): ``schedules``.
- :class:`GateStore`, :class:`JobKeyStore` and :class:`FlowPauseStore`
  (:mod:`~jobcore.database.store.gates`): ``job_gates`` and ``job_keys`` retention,
  ``flow_pauses``.
- :class:`AuditLogStore` (:mod:`~jobcore.database.store.audit_log`): ``audit_log``.
- :class:`BatchStore` (:mod:`~jobcore.database.store.batches`): ``batches``, and a member's
  batch column.
- :class:`MaintenanceLeaseStore` (:mod:`~jobcore.database.store.leases`): ``maintenance_leases``.
- :class:`JobEventStore` (:mod:`~jobcore.database.store.job_events`): the read of ``job_events``.
- :class:`WebhookDeliveryStore`, :class:`WebhookEndpointStore` and
  :class:`WebhookSecretStore` (:mod:`~jobcore.database.store.webhook_deliveries`):
  ``webhook_deliveries``, ``webhook_endpoints``, ``tenant_webhook_secrets``.
- :class:`JobTypeStore` (:mod:`~jobcore.database.store.job_types`): ``job_type_registry``, the
  workers' job types that ``jobcore.enqueue()`` checks against.
- :class:`WorkflowStore` (:mod:`~jobcore.database.store.workflows`): ``workflows``, their
  steps and edges.
- :class:`LedgerStore` (:mod:`~jobcore.database.store.ledger`): the demo's ledger tables.
- :class:`ConsoleStore` (:mod:`~jobcore.database.store.console`): the console's reads across tables.
- :class:`DatabaseStore` (:mod:`~jobcore.database.store.database`): the database itself (health,
  planner statistics, the running transaction's lock timeout).

Each store is stateless: one instance (``job_store``, ``outbox_store``, ...) serves every
caller. :class:`Query` is here for the testing kit's own checks (harness tables, not the
product's).
"""

from jobcore.database.sql import (
    CompletionParams,
    OutboxMessageParams,
    OutboxMessagesParams,
    Query,
    Statement,
)
from jobcore.database.store.api_keys import ApiKeyStore, api_key_store
from jobcore.database.store.audit_log import AuditLogStore, audit_log_store
from jobcore.database.store.batches import (
    BatchCancelPendingParams,
    BatchInsertParams,
    BatchPruneParams,
    BatchStore,
    batch_store,
)
from jobcore.database.store.console import ConsoleJobSearchParams, ConsoleStore, console_store
from jobcore.database.store.database import DatabaseStore, database_store
from jobcore.database.store.gates import (
    FlowPauseStore,
    GateStore,
    JobKeyStore,
    PauseKind,
    flow_pause_store,
    gate_store,
    job_key_store,
)
from jobcore.database.store.inbox import JOBS_CONSUMER, WEBHOOKS_CONSUMER, InboxStore, inbox_store
from jobcore.database.store.job_events import JobEventStore, job_event_store
from jobcore.database.store.job_types import JobTypeStore, job_type_store
from jobcore.database.store.jobs import (
    CANCEL_CHANNEL,
    JobClaimFromOutboxParams,
    JobClaimManyParams,
    JobEditParams,
    JobFencedParams,
    JobFilesKeptParams,
    JobGateParams,
    JobHeartbeatParams,
    JobInsertManyParams,
    JobInsertParams,
    JobKeyParams,
    JobListAllTenantsParams,
    JobListParams,
    JobNoteUndeliverableParams,
    JobProgressSetParams,
    JobPruneCountParams,
    JobReapExpiredParams,
    JobReleaseHeldParams,
    JobReleaseParams,
    JobRepublishStaleParams,
    JobResumeTokensParams,
    JobRetryParams,
    JobSnoozeParams,
    JobStore,
    JobSucceedManyParams,
    job_store,
)
from jobcore.database.store.leases import (
    MaintenanceLeaseParams,
    MaintenanceLeaseStore,
    maintenance_lease_store,
)
from jobcore.database.store.ledger import LedgerStore, ledger_store
from jobcore.database.store.outbox import (
    OutboxRequeueParams,
    OutboxRowParams,
    OutboxStore,
    outbox_store,
)
from jobcore.database.store.schedules import ScheduleAdvanceParams, ScheduleStore, schedule_store
from jobcore.database.store.tenants import QuotaDefaultParams, TenantStore, tenant_store
from jobcore.database.store.webhook_deliveries import (
    WEBHOOK_MESSAGE_TYPE,
    WebhookDeliveryRecordAttemptParams,
    WebhookDeliveryStore,
    WebhookEndpointStore,
    WebhookSecretStore,
    webhook_delivery_store,
    webhook_endpoint_store,
    webhook_secret_store,
)
from jobcore.database.store.workflows import WorkflowStore, workflow_store

__all__ = [
    "CANCEL_CHANNEL",
    "JOBS_CONSUMER",
    "WEBHOOKS_CONSUMER",
    "WEBHOOK_MESSAGE_TYPE",
    "ApiKeyStore",
    "AuditLogStore",
    "BatchCancelPendingParams",
    "BatchInsertParams",
    "BatchPruneParams",
    "BatchStore",
    "CompletionParams",
    "ConsoleJobSearchParams",
    "ConsoleStore",
    "DatabaseStore",
    "FlowPauseStore",
    "GateStore",
    "InboxStore",
    "JobClaimFromOutboxParams",
    "JobClaimManyParams",
    "JobEditParams",
    "JobEventStore",
    "JobFencedParams",
    "JobFilesKeptParams",
    "JobGateParams",
    "JobHeartbeatParams",
    "JobInsertManyParams",
    "JobInsertParams",
    "JobKeyParams",
    "JobKeyStore",
    "JobListAllTenantsParams",
    "JobListParams",
    "JobNoteUndeliverableParams",
    "JobProgressSetParams",
    "JobPruneCountParams",
    "JobReapExpiredParams",
    "JobReleaseHeldParams",
    "JobReleaseParams",
    "JobRepublishStaleParams",
    "JobResumeTokensParams",
    "JobRetryParams",
    "JobSnoozeParams",
    "JobStore",
    "JobSucceedManyParams",
    "JobTypeStore",
    "LedgerStore",
    "MaintenanceLeaseParams",
    "MaintenanceLeaseStore",
    "OutboxMessageParams",
    "OutboxMessagesParams",
    "OutboxRequeueParams",
    "OutboxRowParams",
    "OutboxStore",
    "PauseKind",
    "Query",
    "QuotaDefaultParams",
    "ScheduleAdvanceParams",
    "ScheduleStore",
    "Statement",
    "TenantStore",
    "WebhookDeliveryRecordAttemptParams",
    "WebhookDeliveryStore",
    "WebhookEndpointStore",
    "WebhookSecretStore",
    "WorkflowStore",
    "api_key_store",
    "audit_log_store",
    "batch_store",
    "console_store",
    "database_store",
    "flow_pause_store",
    "gate_store",
    "inbox_store",
    "job_event_store",
    "job_key_store",
    "job_store",
    "job_type_store",
    "ledger_store",
    "maintenance_lease_store",
    "outbox_store",
    "schedule_store",
    "tenant_store",
    "webhook_delivery_store",
    "webhook_endpoint_store",
    "webhook_secret_store",
    "workflow_store",
]
