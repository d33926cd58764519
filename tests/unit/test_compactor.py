"""The compactor's pure rules (jobcore.maintenance.compactor): which tables pay for a
rewrite, and when the xmin horizon counts as pinned. Its work on a real database is in
tests/integration/worker/test_compactor.py."""

from __future__ import annotations

import dataclasses
from typing import Any

from jobcore.kernel.settings import Settings
from jobcore.maintenance.compactor import (
    LOCK_BACKOFF,
    LOCK_MISSES,
    Candidate,
    Compactor,
    CompactorConfig,
    candidates,
    need_bytes,
)

MIB = 1024 * 1024


def table(
    name: str, *, heap: int, index: int, live: int, width: int | None = 100
) -> dict[str, Any]:
    return {
        "name": name,
        "heap_bytes": heap,
        "index_bytes": index,
        "total_bytes": heap + index,
        "live": live,
        "row_width": width,
        "indexes": 2,
        "key_index": f"{name}_pkey",
    }


def test_a_table_well_above_what_its_live_rows_need_is_a_candidate_largest_first() -> None:
    config = CompactorConfig()
    rows = [
        # 10,000 rows of 100 bytes need about 1.3 MiB of heap and 0.8 MiB of index.
        table("outbox", heap=30 * MIB, index=10 * MIB, live=10_000),
        table("inbox", heap=3 * MIB, index=1 * MIB, live=10_000),  # about its need
        table("jobs", heap=80 * MIB, index=40 * MIB, live=10_000),
        table("job_events", heap=60 * MIB, index=0, live=10_000, width=None),  # never analyzed
        table("tenant_usage", heap=5 * MIB, index=0, live=0),  # bloated, but small change
    ]
    assert [c.name for c in candidates(rows, config)] == ["jobs", "outbox"]
    need = need_bytes(rows[0])
    assert need is not None
    assert 1.5 * MIB < need < 3 * MIB
    # Three times the need is the default ratio: just below it, no rewrite.
    near = table("outbox", heap=int(2.9 * need), index=0, live=10_000)
    assert candidates([near], config.replace(min_excess_bytes=1)) == []


def test_a_table_without_a_valid_primary_key_is_left_alone() -> None:
    row = table("outbox", heap=100 * MIB, index=0, live=10)
    row["key_index"] = None
    assert candidates([row], CompactorConfig()) == []


def compactor() -> Compactor:
    return Compactor(CompactorConfig(horizon_age=60), settings=Settings(), metrics=None)


def test_an_old_transaction_pins_the_horizon_a_young_one_does_not() -> None:
    c = compactor()
    assert c.pinned({"seconds": 61.0, "undated_xids": None, "next_xid": 1000}, 0.0) is not None
    assert c.pinned({"seconds": 5.0, "undated_xids": None, "next_xid": 1100}, 60.0) is None


def test_a_slot_pins_it_when_older_than_the_xids_used_in_the_horizon_age() -> None:
    c = compactor()
    # No rate measured yet: a slot's xmin cannot be dated, so it counts as a pin.
    assert c.pinned({"seconds": 0.0, "undated_xids": 50, "next_xid": 100_000}, 0.0) is not None
    # 100 XIDs a second: 60 s is 6,000 XIDs (plus the slack).
    young = {"seconds": 0.0, "undated_xids": 5_000, "next_xid": 106_000}
    assert c.pinned(young, 60.0) is None
    old = {"seconds": 0.0, "undated_xids": 20_000, "next_xid": 112_000}
    assert c.pinned(old, 120.0) is not None


def test_a_table_is_due_again_after_every_and_after_lock_misses_sooner() -> None:
    c = Compactor(CompactorConfig(every=1800), settings=Settings(), metrics=None)
    start = 10_000.0
    assert c.due("jobs", start)
    c.note("jobs", "done", start)
    assert not c.due("jobs", start + 1799)
    assert c.due("jobs", start + 1800)
    # A lock timeout: tried again next round, twice; the third in a row waits LOCK_BACKOFF.
    for miss in range(1, LOCK_MISSES):
        c.note("outbox", "lock_timeout", start)
        assert c.lock_misses["outbox"] == miss
        assert c.due("outbox", start)
    c.note("outbox", "lock_timeout", start)
    assert "outbox" not in c.lock_misses
    assert not c.due("outbox", start + LOCK_BACKOFF - 1)
    assert c.due("outbox", start + LOCK_BACKOFF)
    # Too slow: the table waits the whole `every`, as after a compaction.
    c.note("inbox", "too_slow", start)
    assert not c.due("inbox", start + LOCK_BACKOFF)


def test_a_table_too_large_to_rewrite_in_the_bound_waits_until_its_live_rows_halve() -> None:
    c = Compactor(CompactorConfig(every=1800), settings=Settings(), metrics=None)
    big = Candidate("jobs", 900 << 20, 900 << 20, 300 << 20, "jobs_pkey", None)
    assert c.fits(big)
    c.note("jobs", "too_slow", 10_000.0, big.need)
    # Due again after `every`, but a rewrite of as many live rows would roll back again.
    assert c.due("jobs", 10_000.0 + 1800)
    assert not c.fits(big)
    assert not c.fits(dataclasses.replace(big, need=(150 << 20) + 1))
    smaller = dataclasses.replace(big, need=150 << 20)
    assert c.fits(smaller)
    c.note("jobs", "done", 20_000.0, smaller.need)
    assert c.fits(big)  # a rewrite that ended in time: no memory of the slow one left
