"""The names of the tables jobcore owns, without SQLAlchemy.

What a serving process needs of its schema at run time is names: the analyzer's ANALYZE
list, the backlog's dead-tuple figures. Importing :mod:`jobcore.database.schema` for them
would load SQLAlchemy into every replica, a tenth of its modules at start-up; the metadata
there stays the contract, and tests/unit/test_table_names.py keeps the two lists equal.
"""

from __future__ import annotations

# Every table of jobcore's schema, alphabetically.
TABLES = (
    "api_keys",
    "audit_log",
    "batch_callbacks",
    "batches",
    "flow_pauses",
    "inbox",
    "job_effects",
    "job_events",
    "job_gates",
    "job_key_joins",
    "job_keys",
    "job_type_registry",
    "jobs",
    "ledger_accounts",
    "ledger_entries",
    "maintenance_leases",
    "outbox",
    "schedules",
    "tenant_quotas",
    "tenant_usage",
    "tenant_usage_deltas",
    "tenant_webhook_secrets",
    "webhook_deliveries",
    "webhook_endpoints",
    "workflow_edges",
    "workflow_jobs",
    "workflows",
)

# The tables every job writes to and deletes from (or updates) on its way through: their
# dead rows are what a held xmin horizon lets pile up (docs/bench/pressure/report.md).
HOT_TABLES = (
    "jobs",
    "outbox",
    "inbox",
    "job_events",
    "job_effects",
    "job_gates",
    "tenant_usage",
    "tenant_usage_deltas",
)
