"""leaner job rows: a batch's flag in a boolean, and no copy of the job's id as its message's

Revision ID: 0045
Revises: 0044
Create Date: 2026-12-07 09:45:00.000000

Every job of ``POST /jobs/{type}/batch`` stored ``{"batch": true}`` in
``jobs.accepted_detail``: 21 bytes of JSON, 24 with alignment, in each of the row's three
versions, for one bit. It is now ``accepted_in_batch`` (true, else NULL), written by the
batch statement (jobcore.database.sql.jobs.enqueue, ``_MANY_ACCEPTED``) and folded back
into the `accepted` event's detail by the timeline's read, so the timeline shows what it
showed. Jobs written before, and by the previous revision's API during a rolling upgrade,
keep the key in their JSON, which the read shows as it is.

The same revision of the code gives an enqueued job's first message the job's own id, and
the claim leaves ``published_message_id`` NULL for it (jobcore.database.sql.jobs.run,
``_KEEP_PUBLISH``; the timeline's reader says the job's id): no schema change, but the
previous revision reads the column as it is.

A nullable column without a default rewrites nothing. The downgrade writes the key back
into the JSON of the jobs that have the column set, and the job's id into
``published_message_id`` where a publish is kept without one, so the previous revision's
timeline loses nothing. Rolling upgrade: the API first (docs/how-to/upgrade.md).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0045"
down_revision: str | None = "0044"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Short: queued behind a long transaction on jobs, the ALTER would queue every enqueue
    # and claim behind itself; failing, `jobcore migrate` is run again.
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.add_column("jobs", sa.Column("accepted_in_batch", sa.Boolean()))


def downgrade() -> None:
    op.execute(
        "UPDATE jobs SET accepted_detail = "
        """coalesce(accepted_detail, '{}'::jsonb) || '{"batch": true}'::jsonb """
        "WHERE accepted_in_batch"
    )
    op.execute(
        "UPDATE jobs SET published_message_id = id "
        "WHERE published_at IS NOT NULL AND published_message_id IS NULL"
    )
    op.drop_column("jobs", "accepted_in_batch")
