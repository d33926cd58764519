"""jobcore_enqueue stamps its outbox row with its statement's start

Revision ID: 0035
Revises: 0029
Create Date: 2026-12-06 13:55:00.000000

The relay's claim starts its range of ``outbox_due_idx`` at a low-water mark
(services/relay/low_water.py), which counts on an outbox row's ``available_at`` being no
older than the start of the statement that wrote it when the writer took its lock on the
outbox after the relay's look. ``jobcore_enqueue`` runs in the caller's transaction,
which may have begun long before: it stamped ``coalesce(run_at, now())``, the
transaction's start, and such a row could commit below the mark and wait for the relay's
unbounded look (a minute). It now stamps ``greatest(run_at, statement_timestamp())`` and
the same instant as the row's ``created_at``, as jobcore.database.sql.jobs.enqueue's
JOB_INSERT and JOB_INSERT_APPROXIMATE do (MESSAGE_DUE): a job due at once is still a
"ready" row to the fair claim (available_at <= created_at), and a run_at in the past is
due at once as before.

Same signature: CREATE OR REPLACE keeps the grants. The text is revision 0029's with the
two outbox inserts changed; the downgrade puts 0029's back.
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0035"
down_revision: str | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Each appears twice in 0029's function: the exact and the approximate admission's insert.
COLUMNS_BEFORE = """                    tenant, available_at, priority
                )"""
COLUMNS_AFTER = """                    tenant, available_at, priority, created_at
                )"""
VALUES_BEFORE = "job.id, job.tenant, coalesce(v_due, now()), job.priority"
VALUES_AFTER = (
    "job.id, job.tenant, greatest(v_due, statement_timestamp()), job.priority,\n"
    "                       statement_timestamp()"
)


def _previous() -> ModuleType:
    """Revision 0029, whose function this one changes and the downgrade restores."""
    path = Path(__file__).with_name("0029_sql_admission.py")
    spec = importlib.util.spec_from_file_location("jobcore_migration_0029", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def enqueue_definition() -> str:
    """0029's function, its outbox rows stamped with the statement's start."""
    previous: str = _previous().ENQUEUE
    if previous.count(COLUMNS_BEFORE) != 2 or previous.count(VALUES_BEFORE) != 2:
        raise RuntimeError("revision 0029's jobcore_enqueue is not the text this one changes")
    return previous.replace(COLUMNS_BEFORE, COLUMNS_AFTER).replace(VALUES_BEFORE, VALUES_AFTER)


def _verbatim(statement: str) -> sa.TextClause:
    """``statement`` as SQLAlchemy runs it unchanged: its colons are not bind parameters."""
    return sa.text(statement.replace(":", "\\:"))


def _replace(definition: str) -> None:
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.execute(_verbatim(definition))
    # CREATE OR REPLACE keeps the function's grants; PUBLIC had none, and gets none.
    op.execute(f"REVOKE EXECUTE ON FUNCTION {_previous().SIGNATURE} FROM PUBLIC")


def upgrade() -> None:
    _replace(enqueue_definition())


def downgrade() -> None:
    _replace(_previous().ENQUEUE)
