"""Statements that change ``inbox`` on their own: the pruner's. (The claim and a webhook
attempt insert their inbox row in the same statement as their main change:
:data:`jobcore.database.sql.jobs.run.JOB_CLAIM_MANY`,
:data:`jobcore.database.sql.webhook_deliveries.WEBHOOK_DELIVERY_RECORD_ATTEMPT`.)
"""

from __future__ import annotations

from typing import TypedDict

from jobcore.database.sql import Query

WEBHOOKS_CONSUMER = "webhooks"


JOBS_CONSUMER = "jobs"


class InboxPruneCountParams(TypedDict):
    keep: float


INBOX_PRUNE_COUNT = Query[InboxPruneCountParams](
    "inbox_prune_count",
    "Count inbox rows received longer ago than the inbox window.",
    """
    SELECT count(*) AS inbox FROM jobcore.inbox
    WHERE received_at < now() - make_interval(secs => %(keep)s)
    """,
)


class InboxPruneBatchParams(TypedDict):
    keep: float
    limit: int


# Inbox rows are only ever inserted: nothing else locks or moves them, so a row's ctid
# found by the subquery still names it in the same statement, and the delete is a TID scan
# (a join on the primary key was planned as a hash join over the whole inbox). A
# redelivery that arrives while its old row is being deleted waits for this commit, then
# inserts a new row and meets the claim's fence (jobcore.database.sql.jobs.run.JOB_CLAIM_MANY).
INBOX_PRUNE_BATCH = Query[InboxPruneBatchParams](
    "inbox_prune_batch",
    "Delete a batch of inbox rows older than the inbox window, oldest first.",
    """
    DELETE FROM jobcore.inbox
    WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM jobcore.inbox
        WHERE received_at < now() - make_interval(secs => %(keep)s)
        ORDER BY received_at
        LIMIT %(limit)s
    ))
    """,
)
