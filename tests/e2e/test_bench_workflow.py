"""`jobcore bench workflow` creates and runs a workflow and the same jobs one at a time, and
reports both (tiny sizes, one run; no timing is asserted)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from jobcore.kernel.settings import Settings
from tests.e2e.test_bench_smoke import bench_cli


@pytest.mark.timeout(300)
def test_the_workflow_scenario_reports_against_one_at_a_time_enqueue(
    settings: Settings, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    result = bench_cli(settings, "workflow", "--jobs", "40", "--runs", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    [section] = orjson.loads((out / "report.json").read_bytes())["scenarios"]
    assert section["scenario"] == "workflow"
    created, ran, per_job = section["figures"]
    assert (created["metric"], created["baseline"]) == (
        "jobs created/s",
        "single POST /jobs/noop, 16 clients",
    )
    assert ran["metric"] == "jobs run/s (first request to last job)"
    assert per_job["baseline"] == "4 jobs"
    for figure in (created, ran, per_job):
        assert figure["runs"][0] > 0
        assert figure["baseline_runs"][0] > 0
