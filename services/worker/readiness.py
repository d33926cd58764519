"""Whether a consumer makes progress: what turns a worker's ``/readyz`` red, and back.

A consumer cannot make progress when either holds:

- **stalled**: a delivery has waited for its database work (the claim; for webhooks, the
  read or the record) for longer than ``stall_after`` seconds, and no such work has
  succeeded for as long. Only a delivery that holds a handler slot counts, so one queued
  behind long-running jobs is not a stall. The database is unreachable or hangs.
- **failing**: the last :data:`ERROR_STREAK` deliveries all ended in an unexpected error
  (each one requeued), with no progress in between, the last within ``stall_after``.

Both clear by themselves: the first as soon as a claim succeeds (or no delivery waits),
the second as soon as a delivery makes progress or ``stall_after`` seconds after the last
error (a message that keeps failing is dead-lettered by the broker at its delivery limit,
so the errors stop coming).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator

# Unexpected errors in a row, with no progress between them, that mean "failing": more
# than a couple of bad messages arriving together, few enough to show a broken path fast.
ERROR_STREAK = 5


class ConsumerReadiness:
    def __init__(self, stall_after: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_after = stall_after
        self._clock = clock
        self._tokens = itertools.count()
        # Deliveries waiting for their database work now, and since when.
        self._waiting: dict[int, float] = {}
        self.last_progress = clock()
        self.error_streak = 0
        self.last_error_at: float | None = None

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """A delivery waits for its database work while inside this block."""
        token = next(self._tokens)
        self._waiting[token] = self._clock()
        try:
            yield
        finally:
            del self._waiting[token]

    def progressed(self) -> None:
        """A claim (or other database work for a delivery) succeeded, or a delivery was
        settled for good."""
        self.last_progress = self._clock()
        self.error_streak = 0

    def failed(self) -> None:
        """A delivery ended in an unexpected error."""
        self.error_streak += 1
        self.last_error_at = self._clock()

    def trouble(self) -> str | None:
        """Why the consumer cannot make progress now, or None while it can."""
        now = self._clock()
        if self._waiting:
            since = max(min(self._waiting.values()), self.last_progress)
            if now - since > self.stall_after:
                return (
                    f"{len(self._waiting)} deliveries waiting for the database, "
                    f"none served for {now - since:.0f}s"
                )
        if (
            self.error_streak >= ERROR_STREAK
            and self.last_error_at is not None
            and now - self.last_error_at <= self.stall_after
        ):
            return f"the last {self.error_streak} deliveries ended in unexpected errors"
        return None
