"""Statements on ``tenant_webhook_secrets``: each tenant's webhook signing secret."""

from __future__ import annotations

from typing import TypedDict

from jobcore.database.sql import Query


class WebhookSecretEnsureParams(TypedDict):
    secret: str
    tenant: str


# Created on first need. When two first needs race, ON CONFLICT waits for the other's
# commit and inserts nothing; the second branch then reads the winner's secret (a new
# statement sees it), so the caller runs this again when it returns no row.
WEBHOOK_SECRET_ENSURE = Query[WebhookSecretEnsureParams](
    "webhook_secret_ensure",
    "The tenant's signing secrets (current, overlapping), created if it has none.",
    """
    WITH created AS (
        INSERT INTO jobcore.tenant_webhook_secrets (tenant, secret)
        VALUES (%(tenant)s, %(secret)s)
        ON CONFLICT (tenant) DO NOTHING
        RETURNING secret, created_at, rotated_at, previous_secret, previous_expires_at
    )
    SELECT secret, created_at, rotated_at, previous_secret, previous_expires_at,
           true AS created
    FROM created
    UNION ALL
    SELECT secret, created_at, rotated_at,
           CASE WHEN previous_expires_at > now() THEN previous_secret END,
           previous_expires_at, false
    FROM jobcore.tenant_webhook_secrets
    WHERE tenant = %(tenant)s
    LIMIT 1
    """,
)


class WebhookSecretRotateParams(TypedDict):
    overlap: float
    secret: str
    tenant: str


# The replaced secret keeps signing for ``overlap`` seconds (0: it stops now). A rotation
# during another's overlap replaces the secret that overlap was for: only the newest two
# ever sign.
WEBHOOK_SECRET_ROTATE = Query[WebhookSecretRotateParams](
    "webhook_secret_rotate",
    "Give a tenant a new signing secret (created if it had none); the old one overlaps.",
    """
    INSERT INTO jobcore.tenant_webhook_secrets (tenant, secret) VALUES (%(tenant)s, %(secret)s)
    ON CONFLICT (tenant) DO UPDATE SET
        secret = excluded.secret,
        rotated_at = now(),
        previous_secret = tenant_webhook_secrets.secret,
        previous_expires_at = now() + make_interval(secs => %(overlap)s)
    RETURNING secret, created_at, rotated_at, previous_expires_at, true AS created
    """,
)
