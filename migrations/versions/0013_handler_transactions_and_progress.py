"""handler transactions and progress: the jobs' progress columns, and the example ledger

Revision ID: 0013
Revises: 0011
Create Date: 2026-12-01 14:00:00.000000

- ``jobs.progress_fraction``, ``progress_message``, ``progress_attempt``,
  ``progress_updated_at``: what a running handler last reported (``ctx.progress``),
  written by its worker under its lease. Nullable without a default, so adding them
  rewrites nothing. Their check constraints are added ``NOT VALID`` and validated
  afterwards: the validation scans the table under a lock that lets reads and writes go
  on, instead of holding enqueues and claims for the whole scan.
- ``ledger_accounts`` and ``ledger_entries``: the tables of the example job type
  ``credit_account`` (jobcore.examples.jobtypes), which credits an account on its handler's
  transaction (``ctx.transaction()``). Entries go with their job (ON DELETE CASCADE) when
  the pruner deletes it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PROGRESS_MESSAGE_MAX_CHARS = 500  # jobcore.execution.progress, as of this revision


def upgrade() -> None:
    op.add_column("jobs", sa.Column("progress_fraction", sa.Float(), nullable=True))
    op.add_column("jobs", sa.Column("progress_message", sa.Text(), nullable=True))
    op.add_column("jobs", sa.Column("progress_attempt", sa.Integer(), nullable=True))
    op.add_column(
        "jobs", sa.Column("progress_updated_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.execute(
        "ALTER TABLE jobs ADD CONSTRAINT jobs_progress_fraction_check "
        "CHECK (progress_fraction >= 0 AND progress_fraction <= 1) NOT VALID"
    )
    op.execute(
        "ALTER TABLE jobs ADD CONSTRAINT jobs_progress_message_check "
        f"CHECK (char_length(progress_message) <= {PROGRESS_MESSAGE_MAX_CHARS}) NOT VALID"
    )
    op.execute("ALTER TABLE jobs VALIDATE CONSTRAINT jobs_progress_fraction_check")
    op.execute("ALTER TABLE jobs VALIDATE CONSTRAINT jobs_progress_message_check")

    op.create_table(
        "ledger_accounts",
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("account", sa.Text(), nullable=False),
        sa.Column("balance_cents", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("tenant", "account", name=op.f("ledger_accounts_pkey")),
    )
    op.create_table(
        "ledger_entries",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("tenant", sa.Text(), nullable=False),
        sa.Column("account", sa.Text(), nullable=False),
        sa.Column("amount_cents", sa.BigInteger(), nullable=False),
        sa.Column("job_id", sa.UUID(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("ledger_entries_job_id_fkey"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("ledger_entries_pkey")),
    )
    op.create_index("ledger_entries_job_id_idx", "ledger_entries", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ledger_entries_job_id_idx", table_name="ledger_entries")
    op.drop_table("ledger_entries")
    op.drop_table("ledger_accounts")
    op.drop_constraint("jobs_progress_message_check", "jobs", type_="check")
    op.drop_constraint("jobs_progress_fraction_check", "jobs", type_="check")
    op.drop_column("jobs", "progress_updated_at")
    op.drop_column("jobs", "progress_attempt")
    op.drop_column("jobs", "progress_message")
    op.drop_column("jobs", "progress_fraction")
