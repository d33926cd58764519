"""workflows.idempotency_key: POST /workflows replays a retried request

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-06 17:00:00.000000

A client that sent `POST /workflows` and lost the answer could not tell whether the
workflow was written; sending it again made a second one. As `POST /jobs/{type}` does, the
request may now carry an `Idempotency-Key`: the workflow keeps it with a fingerprint of
the request (`request_fingerprint`), and a unique index per tenant makes the insert of a
second workflow under a key already taken write nothing (`ON CONFLICT DO NOTHING`), so two
requests racing with one key make one workflow whichever commits first. The key lives as
long as its workflow (the pruner removes both). Two nullable columns: no table rewrite;
the index is built CONCURRENTLY (no lock that stops the settles, which update workflow
rows). Code of the previous revision works unchanged on the new schema (it lists its
columns, and writes no key).
"""

from collections.abc import Sequence

from alembic import op

from jobcore.database.migration_steps import create_indexes_concurrently, drop_indexes_concurrently

revision: str = "0036"
down_revision: str | None = "0035"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {
    "workflows_idempotency_uidx": "(tenant, idempotency_key) WHERE idempotency_key IS NOT NULL",
}


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    # IF NOT EXISTS: the columns commit before the index is built outside the transaction,
    # so a build that fails (its lock_timeout) leaves them, and the rerun must get past them.
    op.execute("ALTER TABLE workflows ADD COLUMN IF NOT EXISTS idempotency_key text")
    op.execute("ALTER TABLE workflows ADD COLUMN IF NOT EXISTS request_fingerprint text")
    create_indexes_concurrently(INDEXES, table="workflows", unique=True)


def downgrade() -> None:
    drop_indexes_concurrently(INDEXES)
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.drop_column("workflows", "request_fingerprint")
    op.drop_column("workflows", "idempotency_key")
