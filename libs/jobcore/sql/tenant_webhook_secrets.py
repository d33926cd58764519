"""Statements on ``tenant_webhook_secrets``: each tenant's webhook signing secret."""

from __future__ import annotations

from typing import TypedDict

from jobcore.sql import Query


class WebhookSecretEnsureParams(TypedDict):
    secret: str
    tenant: str


# Created on first need. When two first needs race, ON CONFLICT waits for the other's
# commit and inserts nothing; the second branch then reads the winner's secret (a new
# statement sees it), so the caller runs this again when it returns no row.
WEBHOOK_SECRET_ENSURE = Query[WebhookSecretEnsureParams](
    "webhook_secret_ensure",
    "The tenant's signing secret, created if it has none.",
    """
    WITH created AS (
        INSERT INTO tenant_webhook_secrets (tenant, secret)
        VALUES (%(tenant)s, %(secret)s)
        ON CONFLICT (tenant) DO NOTHING
        RETURNING secret, created_at, rotated_at
    )
    SELECT secret, created_at, rotated_at, true AS created FROM created
    UNION ALL
    SELECT secret, created_at, rotated_at, false FROM tenant_webhook_secrets
    WHERE tenant = %(tenant)s
    LIMIT 1
    """,
)


class WebhookSecretRotateParams(TypedDict):
    secret: str
    tenant: str


WEBHOOK_SECRET_ROTATE = Query[WebhookSecretRotateParams](
    "webhook_secret_rotate",
    "Give a tenant a new signing secret (created if it had none).",
    """
    INSERT INTO tenant_webhook_secrets (tenant, secret) VALUES (%(tenant)s, %(secret)s)
    ON CONFLICT (tenant) DO UPDATE SET secret = excluded.secret, rotated_at = now()
    RETURNING secret, created_at, rotated_at, true AS created
    """,
)
