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
    result = bench_cli(
        settings,
        "workflow",
        "--jobs",
        "40",
        "--runs",
        "1",
        "--workflows",
        "3,6",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    [section] = orjson.loads((out / "report.json").read_bytes())["scenarios"]
    assert section["scenario"] == "workflow"
    created, ran, per_job, *many = section["figures"]
    assert (created["metric"], created["baseline"]) == (
        "jobs created/s",
        "single POST /jobs/noop, 16 clients",
    )
    assert ran["metric"] == "jobs run/s (first request to last job)"
    assert per_job["baseline"] == "4 jobs"
    # Many small workflows at once: per count, creation and drain per job against as many
    # single jobs; then the largest count against the smallest (flatness).
    assert [(f["case"], f["metric"], f["baseline"]) for f in many] == [
        (
            "3 workflows of 4 jobs at once, 16 clients",
            "µs to create, per job",
            "12 single POST /jobs/noop, 16 clients",
        ),
        (
            "3 workflows of 4 jobs at once, 16 clients",
            "µs to drain from the resume, per job (readiness included)",
            "12 single jobs (no readiness)",
        ),
        (
            "6 workflows of 4 jobs at once, 16 clients",
            "µs to create, per job",
            "24 single POST /jobs/noop, 16 clients",
        ),
        (
            "6 workflows of 4 jobs at once, 16 clients",
            "µs to drain from the resume, per job (readiness included)",
            "24 single jobs (no readiness)",
        ),
        ("6 workflows at once", "µs to create, per job (flatness)", "3 workflows at once"),
        ("6 workflows at once", "µs to drain, per job (flatness)", "3 workflows at once"),
    ]
    for figure in (created, ran, per_job, *many):
        assert figure["runs"][0] > 0
        assert figure["baseline_runs"][0] > 0
    # The load generator's CPU is reported with the system's, in % and per job.
    for case in ("3 workflows: create", "3 workflows: drain", "24 single jobs: create"):
        assert "bench" in section["cpu_pct"][case]
        assert section["cpu_ms_per_job"][case]["all"] > 0
