"""The enqueue use case: one job, a batch, or a job in the caller's own transaction, each
from an :class:`~jobcore.usecases.enqueue.submit.EnqueueRequest`.

- :mod:`.submit`: the entry: the request (its fields checked, its fingerprint computed
  when it is built), and enqueueing one, many or coalesced requests;
- :mod:`.write_one`: writing one job and its outbox message in one statement, and what
  the answer means (created, replayed, a unique key taken, a quota refused);
- :mod:`.write_many`: writing a batch of one type in one statement, an outcome per item;
- :mod:`.in_transaction`: ``enqueue_in`` / ``enqueue_in_sync`` on the application's own
  SQLAlchemy session or psycopg connection;
- :mod:`.scheduled`: a schedule's jobs (a tick's, or one now by hand), which maintenance's
  scheduler is handed as its ``EnqueueTick``;
- :mod:`.wakeups`: one relay wake-up for the enqueues that committed meanwhile.
"""
