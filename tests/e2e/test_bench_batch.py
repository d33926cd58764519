"""`jobcore bench batch` measures batch and single enqueues in one run and reports both
with their ratio (tiny sizes, one run; no timing is asserted)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from jobcore.kernel.settings import Settings
from tests.e2e.test_bench_smoke import bench_cli


@pytest.mark.timeout(300)
def test_the_batch_scenario_reports_jobs_per_second_against_single_requests(
    settings: Settings, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    result = bench_cli(
        settings,
        *("batch", "--jobs", "60", "--batch-size", "20", "--runs", "1", "--out", str(out)),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    [section] = orjson.loads((out / "report.json").read_bytes())["scenarios"]
    assert section["scenario"] == "batch"
    rate = section["figures"][0]
    assert (rate["case"], rate["metric"]) == ("20 items/request, 2 clients", "jobs/s")
    assert rate["baseline"] == "single POST, 16 clients"
    assert rate["runs"][0] > 0
    assert rate["baseline_runs"][0] > 0
    assert rate["ratio"] > 0
    assert set(section["cpu_pct"]) == {"single", "batch"}
    assert (out / "batch.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| batch | 20 items/request, 2 clients | jobs/s |" in (out / "report.md").read_text()
