"""Many jobs' statements in one commit: claims and successes are batched.

A commit waits for the WAL to reach the disk, and on a busy machine that wait, not the
CPU, is what bounds a worker (more connections did not raise its throughput:
docs/bench/measurements.md, "Batched commits"). So claims — and, separately, successes —
go through a :class:`Batcher`: whatever was submitted while the previous batch was
committing goes out as the next batch. One batch is in flight at a time, so at low load
an item goes out at once (no timer, no added latency), and under load a batch holds
everything that queued up behind the last commit. Each caller still gets its own answer,
after the commit.

One batch at a time also means this worker never runs two batches that could lock the
same rows in opposite orders; a deadlock with another process (duplicate messages in two
workers' batches at once) is reported as :class:`TransientConflict`, which callers retry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from jobcore.kernel.groupcommit import GroupCommit

In = TypeVar("In")
Out = TypeVar("Out")

RunBatch = Callable[[Sequence[In]], Awaitable[Sequence[Out]]]


class Batcher(GroupCommit[In, Out]):
    """One batch in flight at a time; ``max_size`` items at most in a batch."""

    def __init__(self, run: RunBatch[In, Out], *, max_size: int = 200) -> None:
        super().__init__(run, max_items=max_size, name="batch")
