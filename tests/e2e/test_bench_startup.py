"""`jobcore bench startup` times each process from spawn to ready against a minimal FastAPI
app in the same run (one run; no timing is asserted)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from jobcore.kernel.settings import Settings
from tests.e2e.test_bench_smoke import bench_cli


@pytest.mark.timeout(600)
def test_the_startup_scenario_times_each_process_against_the_minimal_app(
    settings: Settings, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    result = bench_cli(settings, "startup", "--runs", "1", "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    [section] = orjson.loads((out / "report.json").read_bytes())["scenarios"]
    assert section["scenario"] == "startup"
    cases = {figure["case"]: figure for figure in section["figures"]}
    assert set(cases) == {f"{p} start to ready" for p in ("api", "relay", "worker")}
    for figure in cases.values():
        assert figure["metric"] == "s"
        assert figure["baseline"] == "minimal FastAPI app"
        # A start that counted nothing (a probe that answered before the process ran)
        # would read about zero; each is at least the interpreter's own start.
        assert figure["runs"][0] > min(section["details"]["interpreter_start_s"])
        assert figure["baseline_runs"][0] > 0
    assert "| startup | api start to ready | s |" in (out / "report.md").read_text()
