"""tenant_webhook_secrets: the secret a rotation replaced, and until when it still signs

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 14:00:00.000000

Webhooks are signed the Standard Webhooks way from this release on. During a rotation's
overlap (JOBCORE_WEBHOOK_SECRET_OVERLAP) every webhook carries a signature by the new
secret and one by the secret it replaced, so receivers switch without a failed delivery.

Existing secrets are left as they are: those issued before this release are not Standard
Webhooks secrets (URL-safe base64 without padding), and they keep signing with the key
they always had, their UTF-8 bytes (jobcore.execution.completion_webhooks.signing_key). Nothing is
re-keyed. A downgrade keeps each tenant's current secret; the release before this one keys every
secret by its UTF-8 bytes, so receivers of a tenant given a Standard Webhooks secret
since then must be given that secret's UTF-8 bytes as their key.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("tenant_webhook_secrets", sa.Column("previous_secret", sa.Text(), nullable=True))
    op.add_column(
        "tenant_webhook_secrets",
        sa.Column("previous_expires_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_check_constraint(
        op.f("tenant_webhook_secrets_previous_check"),
        "tenant_webhook_secrets",
        "(previous_secret IS NULL) = (previous_expires_at IS NULL)",
    )


def downgrade() -> None:
    op.drop_constraint(
        op.f("tenant_webhook_secrets_previous_check"), "tenant_webhook_secrets", type_="check"
    )
    op.drop_column("tenant_webhook_secrets", "previous_expires_at")
    op.drop_column("tenant_webhook_secrets", "previous_secret")
