"""`jobcore bench pressure` with phases of a few seconds: every phase (a pinned horizon,
readers, overload, backend kills, pool exhaustion, a PostgreSQL restart, worker SIGKILLs)
runs on the scenario's own cluster (scripts/pressure_cluster.sh, created if missing), no
accepted job is lost or has its effect twice, and every phase produced its figures,
table and plot. No timing is asserted.

``PRESSURE_PORT`` / ``PRESSURE_CLUSTER`` move the cluster (a run of the full scenario may
hold the default one)."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from jobcore.kernel.settings import Settings
from services.bench.scenarios.pressure import PHASES
from tests.e2e.test_bench_smoke import bench_cli

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(300)
def test_every_pressure_phase_loses_nothing_and_reports_figures(
    settings: Settings, tmp_path: Path
) -> None:
    out = tmp_path / "pressure"
    port = os.environ.get("PRESSURE_PORT", "5460")
    result = bench_cli(
        settings,
        "pressure",
        *("--pressure-rate", "40", "--pressure-warmup", "2", "--pressure-clean", "3"),
        *("--pressure-pin", "3", "--pressure-phase", "3", "--pressure-recovery", "5"),
        *("--pressure-pin-recovery", "5", "--pressure-after-pin", "0"),
        *("--pressure-sample", "1", "--pressure-port", port, "--out", str(out)),
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    (section,) = orjson.loads((out / "report.json").read_bytes())["scenarios"]
    details = section["details"]
    assert details["accepted"] > 0
    assert details["lost"] == 0, details["tables"][0]
    assert details["duplicates"] == 0, details["tables"][0]
    windows = {(w["name"], w["kind"]): w for w in details["windows"]}
    for name in PHASES:
        phase, recovery = windows[(name, "phase")], windows[(name, "recovery")]
        assert phase["offered"] > 0, name
        assert phase["accepted"] + recovery["accepted"] > 0, name
        assert recovery["completed_per_s"] > 0, name
        assert recovery["pickup_samples"] > 0, name
        assert phase["stranded"] == recovery["stranded"] == 0, name
        assert phase["duplicate_effects"] == recovery["duplicate_effects"] == 0, name
        assert set(phase["dead_tuples_at_end"]) >= {"jobs", "outbox", "inbox"}, name
        assert phase["hot_tables_mib_at_end"] > 0, name
        assert phase["cpu_pct"]["bench"] > 0, name  # the generator's own CPU is shown
        assert (out / f"pressure-{name}.png").read_bytes()[:8] == PNG
    # Each disturbance happened.
    assert windows[("pin", "phase")]["pinned_xid"] > 0
    assert sum(windows[("readers", "phase")]["scans"].values()) > 0
    assert windows[("overload", "phase")]["offered_rate"] > 40
    assert windows[("kills", "phase")]["terminated"] > 0
    assert windows[("pool", "phase")]["held_idle_connections"] > 0
    assert windows[("restart", "phase")]["restart_seconds"] > 0
    assert windows[("sigkill", "phase")]["sigkills"] > 0
    # The targets table, then one table per phase, then the statements.
    titles = [table["title"] for table in details["tables"]]
    assert titles[0].startswith("Targets")
    assert len(details["tables"][0]["rows"]) == 7
    assert [t.split(":")[0] for t in titles[1 : 1 + len(PHASES)]] == list(PHASES)
    report = (out / "report.md").read_text()
    for name in PHASES:
        assert f"![pressure-{name}.png](pressure-{name}.png)" in report
