"""the SQL enqueue gives a job's first message the job's own id

Revision ID: 0046
Revises: 0045
Create Date: 2026-12-07 16:10:00.000000

Since revision 0045's code, the Python enqueue gives a job's first message the job's id,
and the claim leaves ``jobs.published_message_id`` NULL for such a message (16 bytes less
in each version of the row from the claim on; jobcore.database.sql.jobs.run,
``_KEEP_PUBLISH``). ``enqueue`` (SQL from any language) still minted a message id of its
own, so its jobs kept the column set. Its definition is made again with the message id
taken from the job's (migration_steps.rewrite_function), once: both of its inserts of a
job (the exact and the approximate admission) use the one variable. The downgrade mints
an id again; jobs already claimed keep what their claim wrote, which every revision since
0045 reads.

Rolling upgrade: a function replaced in a transaction; calls already running finish with
the definition they started with. A worker of a revision before 0045 keeps the job's id
in ``published_message_id``, as it did for every message.
"""

from collections.abc import Sequence

from alembic import op

from jobcore.database.migration_steps import jobcore_schema, rewrite_function

revision: str = "0046"
down_revision: str | None = "0045"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# enqueue's signature (migration 0030).
ENQUEUE = (
    "enqueue(text, jsonb, text, text, text, text, text, timestamptz, interval, integer, text, text)"
)
MINTED = "v_message_id := gen_random_uuid();"
THE_JOBS = "v_message_id := v_id;"


def upgrade() -> None:
    op.execute(rewrite_function(revision, ENQUEUE, MINTED, THE_JOBS, 1, schema=jobcore_schema()))


def downgrade() -> None:
    op.execute(rewrite_function(revision, ENQUEUE, THE_JOBS, MINTED, 1, schema=jobcore_schema()))
