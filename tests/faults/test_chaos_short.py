"""A minute of `jobcore chaos` (the CI version of the 10-minute soak): every kind of fault
under load, from HTTP and from application transactions (some rolled back on purpose),
with workflows, batches with callbacks, debounced bursts and edits of delayed jobs beside
them, then nothing lost, no effect twice, no job of a rolled-back transaction, and none of
the multi-step guarantees broken."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import orjson
import psycopg
import pytest

from jobcore.testing.pipeline import environment_for_children, services_restored
from jobcore.testing.processes import ROOT, jobcore_command
from services.cli.chaos import FAULTS
from tests.support.databases import with_database
from tests.support.services import ServiceUrls


@pytest.mark.serial
@pytest.mark.timeout(600)
def test_a_minute_of_chaos_loses_nothing_and_repeats_nothing(
    service_urls: ServiceUrls, tmp_path: Path
) -> None:
    env = {
        **environment_for_children(),
        # The command makes a database and a broker prefix of its own on these servers.
        "JOBCORE_DATABASE_URL": with_database(service_urls.pg_admin_url, "jobcore"),
        "JOBCORE_AMQP_URL": service_urls.amqp_url,
        "JOBCORE_ENVIRONMENT": "test",
        "PYTHONPATH": str(ROOT),
    }
    args = (
        "chaos",
        "--duration",
        "60",
        "--seed",
        "11",
        "--rate",
        "20",
        "--multistep-rate",
        "2",
        "--json",
    )
    proc = subprocess.Popen(
        jobcore_command(*args, "--log-dir", str(tmp_path)),
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # so that it and its children can be stopped together
    )
    try:
        stdout, stderr = proc.communicate(timeout=480)
    finally:
        if proc.poll() is None:
            # SIGTERM makes it clean up (stack, shared services, its database), bounded.
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
            services_restored()
    print(stderr.decode(errors="replace")[-4000:])
    report = orjson.loads(stdout)
    summary = {k: v for k, v in report.items() if k not in ("schedule", "lost_examples")}
    assert proc.returncode == 0, summary
    assert report["ok"] is True
    assert report["lost"] == 0, summary
    assert report["duplicate_effects"] == 0, summary
    assert report["failed_without_handler"] == 0, summary
    assert report["accepted"] >= 500, summary
    # The compensation workflows' unreachable steps end cancelled; nothing else does.
    assert report["accepted"] == (report["succeeded"] + report["failed"] + report["cancelled"]), (
        summary
    )
    assert report["cancelled"] == report["multistep_compensation_workflows"], summary
    # The application producer: transactions committed and rolled back on purpose, and
    # no job of a rolled-back one (its committed jobs are among the accepted above).
    assert report["app_committed"] > 0, summary
    assert report["app_rolled_back"] > 0, summary
    assert report["app_jobs_from_rollbacks"] == 0, summary
    # The multi-step load: each kind ran, and no guarantee of theirs was broken.
    for count in ("workflows", "batches", "callbacks_fired", "debounce_runs", "edits_tried"):
        assert report[f"multistep_{count}"] > 0, summary
    assert report["multistep_violations"] == 0, summary
    # The pruner deleted finished jobs while the faults went on (and the check still saw
    # every one of them, from the run's archive).
    assert report["pruned"] > 0, summary
    # Shuffled rounds of every fault: a minute holds at least one of each.
    assert set(report["faults_by_kind"]) == set(FAULTS)
    assert all(report["faults_by_kind"][kind] >= 1 for kind in FAULTS), report["schedule"]
    assert report["unrecovered_faults"] == 0, report["schedule"]
    assert report["fault_errors"] == 0, report["schedule"]
    # It cleaned up after itself.
    with psycopg.connect(service_urls.pg_admin_url) as conn:
        left = conn.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", (report["database"],)
        ).fetchone()
    assert left is None
