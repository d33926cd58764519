"""The export_csv handler streams its file to the result store: its peak memory is a few
chunks, however large the file (it used to build the whole CSV in memory, twice)."""

from __future__ import annotations

import tracemalloc
import uuid
from pathlib import Path

from jobcore.examples.jobtypes import (
    EXPORT_CHUNK_BYTES,
    EXPORT_MAX_COLUMN_NAME,
    EXPORT_MAX_COLUMNS,
    ExportCsvPayload,
    csv_chunks,
    export_csv,
)
from jobcore.execution.registry import JobContext
from jobcore.storage.results import LocalResultStore


async def _no_heartbeat() -> None:
    return None


async def test_a_large_exports_peak_memory_stays_far_below_its_size(tmp_path: Path) -> None:
    names = [f"c{i:02d}".ljust(EXPORT_MAX_COLUMN_NAME, "x") for i in range(EXPORT_MAX_COLUMNS)]
    payload = ExportCsvPayload(rows=40_000, columns=names, seed=7)
    store = LocalResultStore(tmp_path)
    ctx = JobContext(
        job_id=uuid.uuid4(),
        job_type="export_csv",
        payload=payload,
        attempt=1,
        max_attempts=3,
        idempotency_key="k",
        heartbeat=_no_heartbeat,
        result_store=store,
    )

    tracemalloc.start()
    try:
        result = await export_csv(ctx)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert ctx.result_ref is not None
    size = store.path(ctx.result_ref).stat().st_size
    assert result["bytes"] == size
    assert size > 30 * 1024 * 1024  # ~32 MB: large enough for the ratio to mean something
    # A chunk (str + its bytes), the payload, the event loop's own: a few chunks at most.
    assert peak < 8 * EXPORT_CHUNK_BYTES, (peak, size)
    assert peak < size / 10, (peak, size)
    # And it is the same file as the chunks in memory make.
    assert store.get(ctx.result_ref) == b"".join(csv_chunks(payload))
