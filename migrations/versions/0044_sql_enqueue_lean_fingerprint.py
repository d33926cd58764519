"""the SQL enqueue keeps a job's request fingerprint only when it has an idempotency key

Revision ID: 0044
Revises: 0043
Create Date: 2026-12-07 06:45:00.000000

``jobs.payload_fingerprint`` (a sha256 in hex, 65 bytes in every version of the row) is
read only to tell a replay of an idempotency key from another request under it. The
Python enqueue has stored it only for a job with a key since its statements changed
(jobcore.database.sql.jobs.enqueue, ``_KEPT_FINGERPRINT``); ``enqueue`` (SQL from any
language, migrations 0026, 0029, 0030) still stored it for every job. Its definition is
taken from the database and made again (CREATE OR REPLACE: the same function, its grants
kept), with both of its inserts of a job (the exact and the approximate admission)
keeping the fingerprint only with the key. The downgrade puts it back.

Rolling upgrade: a function replaced in a transaction; calls already running finish with
the definition they started with.
"""

from collections.abc import Sequence

from alembic import op

from jobcore.database.migration_steps import jobcore_schema, rewrite_function

revision: str = "0044"
down_revision: str | None = "0043"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# enqueue's signature (migration 0030).
ENQUEUE = (
    "enqueue(text, jsonb, text, text, text, text, text, timestamptz, interval, integer, text, text)"
)
# What each insert of a job writes for idempotency_key and payload_fingerprint.
KEPT = "v_idempotency_key, v_fingerprint,"
LEAN = "v_idempotency_key, CASE WHEN v_idempotency_key IS NOT NULL THEN v_fingerprint END,"
INSERTS = 2


def upgrade() -> None:
    op.execute(rewrite_function(revision, ENQUEUE, KEPT, LEAN, INSERTS, schema=jobcore_schema()))


def downgrade() -> None:
    op.execute(rewrite_function(revision, ENQUEUE, LEAN, KEPT, INSERTS, schema=jobcore_schema()))
