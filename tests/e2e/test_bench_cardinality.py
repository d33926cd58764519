"""`jobcore bench cardinality --size small` runs every sweep and writes its figures, plot
and targets. No speed is asserted (nor any target's verdict): only that each step was set
up as described and measured, and that the report says PASS or FAIL for each target."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from jobcore.kernel.settings import Settings
from services.bench import report as report_module
from tests.e2e.test_bench_smoke import bench_cli


# Two stacks (a relay; a relay and a worker) and two scratch databases without one: under a
# minute on a quiet 2-core machine, a few on a loaded one.
@pytest.mark.timeout(400)
def test_small_cardinality_sweeps_report_figures_and_targets(
    settings: Settings, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    result = bench_cli(
        settings,
        "cardinality",
        *("--size", "small", "--runs", "1", "--held-steps", "1000,5000", "--out", str(out)),
        timeout=380,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    document = orjson.loads((out / "report.json").read_bytes())
    assert document["machine"]["cpu_model"]
    assert document["machine"]["cores"] >= 1
    assert document["options"]["cardinality_size"] == "small"
    (section,) = document["scenarios"]
    assert section["scenario"] == "cardinality"
    details = section["details"]
    assert details["size"] == "small"

    for figure in section["figures"]:
        assert figure["runs"], figure
        assert all(v > 0 for v in figure["runs"]), figure
        if figure["baseline"]:
            assert figure["ratio"] > 0, figure
    metrics = {f["metric"] for f in section["figures"]}
    assert {
        "relay rows/s (3,000-row backlog)",
        "pipeline jobs/s (300 ordered jobs)",
        "releaser PostgreSQL CPU-ms/round",
        "releaser ms/round (wall)",
        "releaser scan shared blocks/round",
        "MiB of the 4 tables after prune",
        "MiB of the 4 tables before prune",
    } == metrics

    # Each step was set up as it says: the delayed tenants' rows are there, the keys'
    # gate rows, the held jobs (a round releases about a second's worth at 10/s).
    assert [s["tenants"] for s in details["tenants"]] == [10, 1000]
    assert [s["delayed_rows"] for s in details["tenants"]] == [10, 1000]
    assert [s["keys"] for s in details["ordering_keys"]] == [10, 10_000]
    for step in details["ordering_keys"]:
        assert step["job_gates_rows"] > step["keys"], step
    assert [s["held"] for s in details["held"]] == [1000, 5000]  # --held-steps
    for step in details["held"]:
        assert step["rounds"] >= 10, step
        assert 1 <= step["released_per_round"] <= 20, step
        assert step["cpu_ms_per_round"] > 0, step
        assert step["scan_shared_blocks"] > 0, step
    # Every wave's finished jobs and inbox rows were pruned; the keys' gate rows are counted.
    waves = details["gate_key_waves"]
    assert [w["gate_keys_seen"] for w in waves] == [5000, 10_000, 15_000, 20_000]
    for wave in waves:
        assert wave["before"]["jobs"]["rows"] == 5000, wave
        assert wave["deleted"]["jobs"] == 5000, wave
        assert wave["deleted"]["inbox"] == 5000, wave
        assert wave["after"]["jobs"]["rows"] == 0, wave
        assert wave["after"]["inbox"]["rows"] == 0, wave
        assert all(wave["after"][t]["mib"] > 0 for t in ("job_gates", "jobs", "inbox")), wave

    targets = details["targets"]
    assert len(targets) == 4
    for target in targets:
        assert target["verdict"] in {"PASS", "FAIL"}, target
        assert target["ratio"] > 0, target
    series = {s["y_label"] for s in section["series"]}
    assert series == {
        "rows published/s",
        "pipeline jobs/s",
        "releaser CPU-ms/round",
        "MiB (pg_total_relation_size)",
    }
    assert (out / "cardinality.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    table = (out / "report.md").read_text()
    assert "| cardinality | 1,000 tenants, one delayed job each |" in table
    for target in targets:
        assert f"**{target['verdict']}** {target['target']}" in table
    # The report renders again from its JSON alone, to the same text.
    again = tmp_path / "again"
    report_module.write(again, *report_module.load(out))
    assert (again / "report.md").read_text() == table


def test_bad_cardinality_arguments_give_one_line_and_exit_2(
    settings: Settings, tmp_path: Path
) -> None:
    for args, message in (
        (("--size", "huge"), "--size takes small or full"),
        (("--held-steps", "1000,10"), "--held-steps takes ascending numbers"),
        (("--key-steps", "ten"), "--key-steps takes comma-separated whole numbers"),
        (("--tenant-steps", "0,10"), "--tenant-steps takes numbers from 1"),
    ):
        result = bench_cli(settings, "cardinality", *args, "--out", str(tmp_path), timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "report.json").exists()
