"""The relay's low-water mark: the oldest ``available_at`` at which a live due outbox row
can be found now or later, so that the relay's claims (OUTBOX_CLAIM_FEW, OUTBOX_CLAIM_FAIR,
OUTBOX_CLAIM_DUE) start their ranges there instead of at their indexes' heads.

Why: the head of the index is where the relays delete. An entry of a published row stays
until VACUUM removes it, and a transaction that pins the xmin horizon (a long report, a
forgotten session) keeps VACUUM from removing any: a probe from the head visits every row
published since the pin began, a heap fetch each, and its cost grows with the pin.

The mark is a look of two statements, every :data:`LOOK_EVERY` seconds:

1. OUTBOX_OLDEST_WRITER: the start of the oldest other transaction that holds or awaits a
   lock to write the outbox (pg_locks). Its rows, once committed, have keys no older.
2. OUTBOX_OLDEST_LIVE, with a later snapshot, from the previous mark: the oldest due row
   committed, whoever holds it (a plain read), paused rows included.

The mark is the oldest of those two and of the look's own time, less :data:`SLACK`: a
writer that takes its lock after the look stamps its rows with its statement's start or
its transaction's (enqueue: ``statement_timestamp()``; the services' other writers run
transactions far shorter than the slack). Between looks the bounded claim's window is the
seconds back to the mark. A look whose writer's start cannot be read keeps the last mark.

The rule can be broken: a writer that stamps ``now()`` in a transaction that began more
than the slack before a look, takes its lock after that look and commits before the next
one, gives a row older than the mark. The relay's unbounded look (:data:`FULL_LOOK_EVERY`:
its claim, few, fair or FIFO, then looks at every due row) finds such a row: no row is
skipped for ever, and one written by a writer that follows the rule is found by the next
bounded claim after its commit.
"""

from __future__ import annotations

import time

from jobcore.database.gateway import Reader
from jobcore.database.store import outbox_store

# How often the relay looks for its mark; between looks the window grows by the time
# since the look.
LOOK_EVERY = 1.0
# Covers a writer that takes its lock just after a look (its statement began a little
# before), the gap between this process's clock and the server's, and jobcore's own
# writers that stamp their transaction's start (short transactions).
SLACK = 1.0
# The safety net: an unbounded look at least this often.
FULL_LOOK_EVERY = 60.0
UNBOUNDED_WINDOW = 1e9  # seconds: every due row


class LowWaterMark:
    """Where the relay's bounded claim starts: :meth:`window` seconds back from now."""

    def __init__(self) -> None:
        # Monotonic time of the last look and how many seconds before it the mark lies;
        # None until a look succeeded (every row is then in the window).
        self._looked_at: float | None = None
        self._back: float = UNBOUNDED_WINDOW
        self.looks = 0

    def window(self, now: float | None = None) -> float:
        """The seconds back from ``now`` (monotonic) to the mark."""
        if self._looked_at is None:
            return UNBOUNDED_WINDOW
        now = time.monotonic() if now is None else now
        return min(UNBOUNDED_WINDOW, self._back + max(0.0, now - self._looked_at))

    def due(self, now: float | None = None) -> bool:
        """Whether it is time for the next look."""
        now = time.monotonic() if now is None else now
        return self._looked_at is None or now - self._looked_at >= LOOK_EVERY

    async def look(self, conn: Reader) -> float:
        """Move the mark (two statements, each with its own snapshot: ``conn`` must not
        hold a REPEATABLE READ transaction); return the new window."""
        started = time.monotonic()
        writer = await outbox_store.oldest_writer(conn)
        if writer is None or writer["unknown"]:
            # A writer this role cannot date: the mark stays where it was.
            self.looks += 1
            return self.window()
        live = await outbox_store.oldest_live(conn, {"window": self.window(started)})
        back = max(
            0.0,
            writer["seconds"] or 0.0,
            (live["seconds"] or 0.0) if live is not None else 0.0,
        )
        self._back = back + SLACK
        self._looked_at = started
        self.looks += 1
        return self._back
