"""fewer index entries per job: no index of every outbox message id, no status index entry
for a running job

Revision ID: 0042
Revises: 0041
Create Date: 2026-12-06 20:30:00.000000

Every index entry a job writes is WAL and index bytes, and a dead entry for VACUUM once the
row version goes (issue 49, "Cut the bytes per job"). Two entries per job went to indexes
that no statement needed for them:

- ``outbox_message_id_key``, UNIQUE (message_id): an entry per outbox row, at a random
  place (a fresh uuid), for a row deleted milliseconds later. Message ids are unique by
  construction (each writer makes a fresh uuid), and nothing relies on the constraint (no
  ON CONFLICT names it). The statements that looked a message up by its id alone (an
  outcome's retry, JOB_OUTCOME_WRITTEN; the key pruner) know its job and look it up by
  job now (outbox_job_idx); the operators' requeue and discard by message id find the
  quarantined row they name with ``outbox_quarantined_message_idx``, partial, which
  quarantined rows alone enter (none on the happy path).
- ``jobs_status_created_idx`` (status, created_at): an entry for every row version, three
  per job (pending, running, finished). It is ``jobs_status_created_not_running_idx`` now,
  the same without running jobs: the claim's row version writes it no entry. Statements
  that read running jobs across tenants read jobs_lease_expiry_idx (status = 'running'),
  which holds as many as the workers run; the counts of open jobs per queue
  (JOB_COUNT_OPEN_BY_QUEUE, CONSOLE_BACKLOG_BY_QUEUE) and the console's rates read each
  status from its own index.

A debounced enqueue's ``jobcore_job_key_join`` (migration 0034) looked the key's message
up by its id: it is replaced (same signature, grants kept) by one that names the key's
job too, and the downgrade puts 0034's back.

The new indexes are built CONCURRENTLY first, then the old ones dropped (the constraint
with a short lock_timeout: ALTER TABLE takes the outbox's lock for a moment; failing, the
next `jobcore migrate` runs it again). Rolling upgrade: the previous revision's code runs
against this schema unchanged, only some of its statements plan differently: its message
id lookups (an outcome's retry after a broken-off commit, the key pruner, operators naming
a row by message id) scan the outbox, and its counts of open jobs per queue and the
console's rates scan jobs, until it is replaced. Its hot path (enqueue, claim, outcomes,
the relay's claims) uses none of the dropped indexes. The downgrade builds both again and
makes the unique index the constraint it was.
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op

from jobcore.database.migration_steps import (
    LOCK_TIMEOUT,
    create_indexes_concurrently,
    drop_indexes_concurrently,
)

revision: str = "0042"
down_revision: str | None = "0041"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MESSAGE_KEY = "outbox_message_id_key"
OUTBOX_NEW = {"outbox_quarantined_message_idx": "(message_id) WHERE quarantined_at IS NOT NULL"}
JOBS_NEW = {"jobs_status_created_not_running_idx": "(status, created_at) WHERE status <> 'running'"}
JOBS_OLD = {"jobs_status_created_idx": "(status, created_at)"}



def _job_keys_revision() -> ModuleType:
    """Migration 0034, whose key function this revision changes (a module name that
    starts with a digit is loaded from its file)."""
    path = Path(__file__).with_name("0034_job_keys.py")
    spec = importlib.util.spec_from_file_location("jobcore_migration_0034", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BY_MESSAGE_ID = "WHERE outbox.message_id = v_key.message_id"
BY_JOB = "WHERE outbox.job_id = v_key.job_id AND outbox.message_id = v_key.message_id"


def _key_join(old: bool) -> sa.TextClause:
    """``jobcore_job_key_join`` as 0034 wrote it (``old``) or finding the key's message
    by its job, as CREATE OR REPLACE."""
    revision = _job_keys_revision()
    definition = revision.JOIN.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    assert definition.count(BY_MESSAGE_ID) == 1
    verbatim: sa.TextClause = revision._verbatim(
        definition if old else definition.replace(BY_MESSAGE_ID, BY_JOB)
    )
    return verbatim


_CONSTRAINT_EXISTS = sa.text(
    "SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = :name"
    " AND conrelid = to_regclass('outbox'))"
)


def _message_key_is_a_constraint() -> bool:
    """Whether outbox_message_id_key is (still, or again) the table's constraint; when
    writing SQL offline there is no database to ask, and the statement is written."""
    if op.get_context().as_sql:
        return False
    return bool(op.get_bind().execute(_CONSTRAINT_EXISTS, {"name": MESSAGE_KEY}).scalar())


def upgrade() -> None:
    create_indexes_concurrently(OUTBOX_NEW, table="outbox")
    create_indexes_concurrently(JOBS_NEW, table="jobs")
    op.execute(_key_join(old=False))
    # Short: queued behind a relay's open transaction, the ALTER would queue every enqueue
    # behind itself; failing, `jobcore migrate` is run again.
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    # No client relies on it: no statement names it in an ON CONFLICT, and every writer
    # makes a fresh uuid per row.
    op.execute(
        "-- squawk-ignore ban-drop-constraint\n"
        f"ALTER TABLE outbox DROP CONSTRAINT IF EXISTS {MESSAGE_KEY}"
    )
    drop_indexes_concurrently(JOBS_OLD)


def downgrade() -> None:
    create_indexes_concurrently(JOBS_OLD, table="jobs")
    create_indexes_concurrently({MESSAGE_KEY: "(message_id)"}, table="outbox", unique=True)
    if not _message_key_is_a_constraint():
        op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        op.execute(
            f"ALTER TABLE outbox ADD CONSTRAINT {MESSAGE_KEY} UNIQUE USING INDEX {MESSAGE_KEY}"
        )
    op.execute(_key_join(old=True))
    drop_indexes_concurrently([*JOBS_NEW, *OUTBOX_NEW])
