"""the first publish and the end of a job are kept on the job row, not in event rows

Revision ID: 0041
Revises: 0040
Create Date: 2026-12-06 20:00:00.000000

After 0040 a job published once that succeeded on its first claim still wrote two
job_events rows: `published` (by the relay, when it deleted the confirmed outbox row) and
`finished` (by the statement that ended it). About 490 heap and 140 index bytes per job,
a third of jobcore's bytes per job, and their share of the WAL. Neither is needed:

- The end. `finished` and `cancelled` (status, error) say what the job row says once it
  has ended: status, finished_at, attempts, last_error (the event kept its first 300
  characters, which the readers cut alike). The statements that end jobs write no row for
  it any more (DONE_EVENTS); the readers list it from the job row
  (jobcore.kernel.jobevents.with_job_row). Its `at` is now finished_at, the start of the
  ending transaction, where the row said the moment it was written (the same
  transaction, a few microseconds later). A workflow step retried in place (its only way
  out of an end) carries the end it leaves in its `revived` event (``detail.finish``).
  The reaper's and a workflow cancel's ends still write their rows (rare paths).

- The publish. The relay must not update the job row (a row version per job); the
  worker's claim updates it anyway. So the relay says in each message's headers when it
  took the row (its claiming transaction's start, which dated the event) and which relay
  it is (``x-jobcore-published``), and the claim of the job's first attempt keeps the
  first publish it is handed on the job row: ``published_at``, ``published_by``,
  ``published_message_id`` (about 45 bytes on a row version written anyway). The relay
  writes its `published` row only for a publish the job row will not hold: a message of
  a later attempt, a job that already holds one, a job ended or claimed by something
  else. A first publish that is confirmed before any claim writes no row: the claim takes
  it. The broker's confirm time (``detail.confirmed_at``) is dropped for that publish:
  the worker cannot know it (its delivery often comes before the confirm reaches the
  relay), and it is a relay measure, not a fact about the job; the rows still written
  keep it.

  A first publish whose message a worker receives without claiming the job (its queue
  paused, its job ended, another copy claimed it) is written as a row by that claim
  statement. One whose message no worker ever receives (lost, dead-lettered by the
  broker, or waiting in a queue nobody consumes) is not on the timeline. Its `where`
  still says it: a pending job with no message in the outbox reads "published ...,
  waiting ... for a worker to take it from queue Q", which is what a user debugging a
  stuck job needs (the message left the outbox, no worker took it); a republish by the
  sweeper is its own `republished` row, and the publish of that message is listed once
  received.

Rolling upgrade: three nullable columns without a default rewrite nothing. A relay of
the previous revision writes every `published` row and no header, so a new worker keeps
nothing; a worker of the previous revision ignores the header, and a new relay's first
publish it claims is then missing from the timeline: upgrade workers before relays. Old
workers still write `finished` rows, and the readers list a job row's end only when no
such row follows its last reopening. The downgrade writes the rows back.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0041"
down_revision: str | None = "0040"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Short: queued behind a long transaction on jobs, the ALTER would queue every enqueue
    # and claim behind itself; failing, `jobcore migrate` is run again.
    op.execute("SET LOCAL lock_timeout = '5s'")
    op.add_column("jobs", sa.Column("published_at", postgresql.TIMESTAMP(timezone=True)))
    op.add_column("jobs", sa.Column("published_by", sa.Text()))
    op.add_column("jobs", sa.Column("published_message_id", postgresql.UUID(as_uuid=True)))


def downgrade() -> None:
    # The ends carried by the `revived` events of workflow steps retried in place.
    op.execute(
        "INSERT INTO job_events (job_id, at, kind, attempt, detail) "
        "SELECT job_id, (detail->'finish'->>'at')::timestamptz, "
        "CASE WHEN detail->'finish'->>'status' = 'cancelled' THEN 'cancelled' "
        "ELSE 'finished' END, (detail->'finish'->>'attempt')::int, "
        "jsonb_strip_nulls(jsonb_build_object('status', detail->'finish'->'status', "
        "'error', detail->'finish'->'error')) "
        "FROM job_events WHERE kind = 'revived' AND detail ? 'finish'"
    )
    op.execute(
        "UPDATE job_events SET detail = detail - 'finish' "
        "WHERE kind = 'revived' AND detail ? 'finish'"
    )
    # The end of each ended job, unless a row already says it (since its last reopening).
    op.execute(
        "INSERT INTO job_events (job_id, at, kind, attempt, detail) "
        "SELECT id, finished_at, CASE WHEN status = 'cancelled' THEN 'cancelled' "
        "ELSE 'finished' END, attempts, "
        "jsonb_strip_nulls(jsonb_build_object('status', status, 'error', "
        "CASE WHEN status <> 'succeeded' THEN left(last_error, 300) END)) "
        "FROM jobs WHERE status IN ('succeeded', 'failed', 'cancelled') "
        "AND finished_at IS NOT NULL AND NOT EXISTS ("
        "SELECT 1 FROM job_events WHERE job_events.job_id = jobs.id "
        "AND job_events.kind IN ('finished', 'cancelled') "
        "AND job_events.at >= coalesce((SELECT max(r.at) FROM job_events AS r "
        "WHERE r.job_id = jobs.id AND r.kind = 'revived'), '-infinity'))"
    )
    # The first publish each job row keeps, unless a row already says it.
    op.execute(
        "INSERT INTO job_events (job_id, at, kind, attempt, detail) "
        "SELECT id, published_at, 'published', 1, "
        "jsonb_build_object('relay', published_by, 'message_id', published_message_id) "
        "FROM jobs WHERE published_at IS NOT NULL AND NOT EXISTS ("
        "SELECT 1 FROM job_events WHERE job_events.job_id = jobs.id "
        "AND job_events.kind = 'published' AND job_events.at = jobs.published_at)"
    )
    op.drop_column("jobs", "published_message_id")
    op.drop_column("jobs", "published_by")
    op.drop_column("jobs", "published_at")
