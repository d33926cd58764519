"""A handler's transaction (``async with ctx.transaction() as tx:``) and its fence.

The worker acknowledges a delivery right after the claim and deduplicates claims, and it
records ``ctx.record_effect`` effects in the statement that records success. A handler's
writes to its *own* tables would still commit apart from that success: a worker dying
between the two would leave the writes in and the job running, and the next attempt would
write them again. ``ctx.transaction()`` closes that gap (as River's ``JobCompleteTx``
does): the handler writes on the transaction's connection, and when the block ends
without an error the worker records this attempt's success in the same transaction,
fenced by its lease token, then commits. Either both are committed or neither:

- the block raises: everything rolls back, and the attempt fails as any handler error;
- the lease was lost (the reaper gave the job to another attempt): the success statement
  matches no row, everything rolls back, and the block raises :class:`LeaseLost`;
- the worker dies anywhere before the commit: PostgreSQL rolls the transaction back and
  the job's lease expires, so the next attempt starts from nothing written;
- after the commit the job *is* succeeded (its result, effects, completion webhook and
  long-poll NOTIFY went with it); whatever the handler does afterwards cannot fail it.

:class:`Fence` is the same token for writes elsewhere (another database, an HTTP API that
takes a conditional request): docs/handlers.md, "Fencing writes to other stores".
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import DictRow

from jobcore.kernel.errors import LeaseLost

__all__ = ["Fence", "JobTransaction", "LeaseLost"]


@dataclass(frozen=True, slots=True)
class Fence:
    """What identifies one attempt of a job: a write conditional on ``lease_token`` (or on
    ``(job_id, attempt)`` being newer than what a store holds) cannot be made by a stale
    attempt."""

    job_id: uuid.UUID
    attempt: int
    lease_token: uuid.UUID


class JobTransaction:
    """A transaction on the jobcore database, committed with this attempt's success.

    ``connection`` is a psycopg 3 async connection (rows as dicts) inside the transaction:
    run your statements on it (``await tx.connection.execute(sql, params)``, or jobcore's
    named statements through :func:`jobcore.database.gateway.fetch_one`). Do not commit or roll back
    on it yourself (psycopg refuses ``commit()`` inside the block); raise to roll back. Nested
    ``async with tx.connection.transaction():`` blocks are savepoints.
    """

    def __init__(self, connection: psycopg.AsyncConnection[DictRow], fence: Fence) -> None:
        self.connection = connection
        self.fence = fence
        self.result: Any = None

    def set_result(self, result: Any) -> None:
        """The job's result (JSON), recorded with the success at the commit. A handler that
        uses a transaction sets its result here: it returns after the job has succeeded."""
        self.result = result
