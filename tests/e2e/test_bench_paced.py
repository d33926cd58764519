"""`jobcore bench paced` at a tiny size: jobcore, Procrastinate and Celery each paced at
two rates of a given peak, every accepted job completed exactly once, and the report's
tables and figures present. No timing is asserted."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from jobcore.kernel.settings import Settings
from services.bench.scenarios.paced import HOP_NAMES, SYSTEMS
from tests.e2e.test_bench_smoke import bench_cli


@pytest.mark.timeout(420)
def test_paced_accounts_for_every_job_and_reports_each_system(
    settings: Settings, tmp_path: Path
) -> None:
    out = tmp_path / "paced"
    result = bench_cli(
        settings,
        "paced",
        *("--paced-peak", "60", "--paced-seconds", "3", "--paced-fractions", "25,75"),
        *("--out", str(out)),
        timeout=400,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    (section,) = orjson.loads((out / "report.json").read_bytes())["scenarios"]
    details = section["details"]
    assert details["peak_per_s"] == 60
    steps = {(s["system"], s["fraction_pct"]): s for s in details["steps"]}
    assert set(steps) == {(system, f) for system in SYSTEMS for f in (25, 75)}
    for key, step in steps.items():
        # Open loop on the clock: the offered count is the rate times the step's seconds.
        assert step["offered"] == int(step["rate"] * 3), key
        assert step["accepted"] == step["offered"], key
        assert step["completed"] == step["completed_once"] == step["accepted"], key
        assert step["missing"] == step["not_once"] == 0, key
        assert step["pickup_samples"] > 0, key
        assert step["pickup_p50_ms"] is not None, key
        assert step["pickup_p99_ms"] is not None, key
        assert step["wal_bytes_per_job"] > 0, key
        assert step["tables"], key
        assert step["cpu_ms_per_job"]["bench"] > 0, key  # the load generator's own CPU
        assert step["cpu_ms_per_job"]["worker"] > 0, key
    assert details["accounting_exact"] is True
    # Jobcore as it ships: the jobs idle workers took from the outbox have their own hop.
    hops = set(steps[("jobcore", 25)]["hops_ms"])
    assert {"to_insert", "insert_to_start"} <= hops <= set(HOP_NAMES)
    assert {"jobs", "outbox"} <= set(steps[("jobcore", 25)]["tables"])
    # The step's WAL by table (pg_walinspect): every job writes its row and its message.
    for system, table in (
        ("jobcore", "jobs"),
        ("jobcore", "outbox"),
        ("procrastinate", "procrastinate_jobs"),
    ):
        wal = steps[(system, 25)]["tables"][table]["wal_bytes_per_job"]
        assert wal is not None, (system, table)
        assert wal > 0, (system, table)
    assert (
        steps[("jobcore", 25)]["tables"]["jobs"]["wal_bytes_per_job"]
        < steps[("jobcore", 25)]["wal_bytes_per_job"]
    )
    assert set(steps[("procrastinate", 25)]["tables"]) == {
        "procrastinate_jobs",
        "procrastinate_events",
    }
    titles = [table["title"] for table in details["tables"]]
    assert titles == [
        "Each system at each rate",
        "jobcore: pickup by hop (p50 / p99 ms)",
        "Hot tables, per accepted job",
        "CPU-ms per job, per process group",
    ]
    assert len(details["tables"][0]["rows"]) == len(SYSTEMS) * 2
    assert "## paced" in (out / "report.md").read_text()


@pytest.mark.timeout(400)
def test_paced_runs_jobcore_as_two_replicas_and_without_direct_pickup_next_to_one(
    settings: Settings, tmp_path: Path
) -> None:
    out = tmp_path / "paced"
    result = bench_cli(
        settings,
        "paced",
        *("--paced-peak", "60", "--paced-seconds", "3", "--paced-fractions", "50"),
        *("--paced-systems", "jobcore,jobcore-2,jobcore-relayed", "--out", str(out)),
        timeout=380,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    (section,) = orjson.loads((out / "report.json").read_bytes())["scenarios"]
    steps = {s["system"]: s for s in section["details"]["steps"]}
    assert set(steps) == {"jobcore", "jobcore-2", "jobcore-relayed"}
    for system, step in steps.items():
        assert step["completed_once"] == step["accepted"] == step["offered"] > 0, system
        assert step["missing"] == step["not_once"] == 0, system
    # As shipped, idle workers took jobs from the outbox themselves (their hop is reported
    # apart); without direct pickup every job went through a relay.
    assert steps["jobcore"]["taken_from_outbox_pct"] > 0
    assert "insert_to_start" in steps["jobcore"]["hops_ms"]
    assert steps["jobcore-relayed"]["taken_from_outbox_pct"] == 0
    # Two API server processes answered on the port (uvicorn's supervisor and its two
    # children), and two relays and two workers ran.
    logs = out / "logs" / "paced-jobcore-2"
    api_log = (logs / "api.1.log").read_text().splitlines()
    assert len([line for line in api_log if '"api started"' in line]) == 2, api_log[-20:]
    assert {p.name for p in logs.glob("*.log")} >= {
        "relay-0.1.log",
        "relay-1.1.log",
        "worker-0.1.log",
        "worker-1.1.log",
    }
