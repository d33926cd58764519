"""Statements on ``webhook_endpoints``: a tenant's default endpoint per job type."""

from __future__ import annotations

from typing import TypedDict

from jobcore.database.sql import Query

# --- default endpoints -------------------------------------------------------------------


class WebhookEndpointSetParams(TypedDict):
    tenant: str
    type: str
    url: str


WEBHOOK_ENDPOINT_SET = Query[WebhookEndpointSetParams](
    "webhook_endpoint_set",
    "Set a tenant's default endpoint for a job type ('*': any).",
    """
    INSERT INTO jobcore.webhook_endpoints (tenant, job_type, url)
    VALUES (%(tenant)s, %(type)s, %(url)s)
    ON CONFLICT (tenant, job_type) DO UPDATE SET url = excluded.url, updated_at = now()
    RETURNING tenant, job_type, url, created_at, updated_at
    """,
)


class WebhookEndpointListParams(TypedDict):
    tenant: str | None


WEBHOOK_ENDPOINT_LIST = Query[WebhookEndpointListParams](
    "webhook_endpoint_list",
    "Default endpoints, optionally of one tenant.",
    """
    SELECT tenant, job_type, url, created_at, updated_at FROM jobcore.webhook_endpoints
    WHERE %(tenant)s::text IS NULL OR tenant = %(tenant)s
    ORDER BY tenant, job_type
    """,
)


class WebhookEndpointDeleteParams(TypedDict):
    tenant: str
    type: str


WEBHOOK_ENDPOINT_DELETE = Query[WebhookEndpointDeleteParams](
    "webhook_endpoint_delete",
    "Remove a tenant's default endpoint for a job type.",
    """
    DELETE FROM jobcore.webhook_endpoints WHERE tenant = %(tenant)s AND job_type = %(type)s
    RETURNING tenant, job_type, url
    """,
)
