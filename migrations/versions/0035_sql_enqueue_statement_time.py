"""jobcore.enqueue stamps its outbox row with its statement's start

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-06 13:55:00.000000

The relay's claim starts its range of ``outbox_due_idx`` at a low-water mark
(services/relay/low_water.py), which counts on an outbox row's ``available_at`` being no
older than the start of the statement that wrote it when the writer took its lock on the
outbox after the relay's look. ``enqueue`` (jobcore's schema) runs in the caller's transaction,
which may have begun long before: it stamped ``coalesce(run_at, now())``, the
transaction's start, and such a row could commit below the mark and wait for the relay's
unbounded look (a minute). It now stamps ``greatest(run_at, statement_timestamp())`` and
the same instant as the row's ``created_at``, as jobcore.database.sql.jobs.enqueue's
JOB_INSERT and JOB_INSERT_APPROXIMATE do (MESSAGE_DUE): a job due at once is still a
"ready" row to the fair claim (available_at <= created_at), and a run_at in the past is
due at once as before.

Same signature: CREATE OR REPLACE keeps the grants. The definition is the function's as
the database has it (pg_get_functiondef: revision 0029's body, which 0030 moved into
jobcore's schema and renamed), with the two outbox inserts changed; the downgrade changes
them back.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from jobcore.database.migration_steps import jobcore_schema

revision: str = "0035"
down_revision: str | None = "0034"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ARGUMENTS = "text, jsonb, text, text, text, text, text, timestamptz, interval, integer, text, text"
# Each appears twice in the function: the exact and the approximate admission's insert.
COLUMNS_BEFORE = """                    tenant, available_at, priority
                )"""
COLUMNS_AFTER = """                    tenant, available_at, priority, created_at
                )"""
VALUES_BEFORE = "job.id, job.tenant, coalesce(v_due, now()), job.priority"
VALUES_AFTER = (
    "job.id, job.tenant, greatest(v_due, statement_timestamp()), job.priority,\n"
    "                       statement_timestamp()"
)


def _swap(pairs: Sequence[tuple[str, str]]) -> str:
    """A block that replaces the function by its definition as the database has it, with
    each pair's first text (found twice: the exact and the approximate admission's insert)
    changed to its second. Done in the server, so an offline migration (the SQL the lint
    reads) does the same."""
    schema = jobcore_schema()
    changes = "".join(
        f"""
        IF (length(definition) - length(replace(definition, {_literal(before)}, '')))
           / length({_literal(before)}) <> 2 THEN
            RAISE EXCEPTION 'the SQL enqueue is not the text revision 0035 changes';
        END IF;
        definition := replace(definition, {_literal(before)}, {_literal(after)});"""
        for before, after in pairs
    )
    return f"""
    DO $swap$
    DECLARE
        routine regprocedure := to_regprocedure('{schema}.enqueue({ARGUMENTS})');
        definition text;
    BEGIN
        IF routine IS NULL THEN
            RAISE EXCEPTION '{schema}.enqueue is missing';
        END IF;
        definition := pg_get_functiondef(routine);{changes}
        EXECUTE definition;
        -- CREATE OR REPLACE keeps the function's grants; PUBLIC had none, and gets none.
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', routine);
    END
    $swap$
    """


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _verbatim(statement: str) -> sa.TextClause:
    """``statement`` as SQLAlchemy runs it unchanged: its colons are not bind parameters."""
    return sa.text(statement.replace(":", "\\:"))


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(_verbatim(_swap([(COLUMNS_BEFORE, COLUMNS_AFTER), (VALUES_BEFORE, VALUES_AFTER)])))


def downgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(_verbatim(_swap([(COLUMNS_AFTER, COLUMNS_BEFORE), (VALUES_AFTER, VALUES_BEFORE)])))
