"""`jobcore bench` runs every scenario end to end (tiny sizes, one run) and writes a
well-formed report. No timing is asserted: only that each figure was measured."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import pytest

from jobcore.kernel.settings import Settings
from jobcore.testing.processes import ROOT, jobcore_command, settings_env
from services.bench import report as report_module

ALL = ("enqueue", "relay", "e2e", "scale", "backlog", "tracing")


def bench_cli(
    settings: Settings, *args: str, timeout: float = 400, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobcore_command("bench", *args),
        env=settings_env(settings, **env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# Six scenarios start eight stacks of processes: minutes on a loaded 2-core machine.
@pytest.mark.timeout(420)
def test_every_scenario_writes_figures_tables_and_plots(settings: Settings, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = bench_cli(
        settings,
        *ALL,
        *("--jobs", "60", "--relay-rows", "400", "--backlog-rows", "3000", "--runs", "1"),
        *("--clients", "4", "--duration", "2", "--scale", "1,2", "--out", str(out)),
    )
    assert result.returncode == 0, result.stderr[-3000:]

    report = orjson.loads((out / "report.json").read_bytes())
    assert report["machine"]["cores"] >= 1
    assert report["machine"]["postgresql"]
    assert report["machine"]["rabbitmq"]
    assert [s["scenario"] for s in report["scenarios"]] == list(ALL)
    for section in report["scenarios"]:
        assert section["figures"], section["scenario"]
        for figure in section["figures"]:
            assert figure["runs"], figure
            assert all(v > 0 for v in figure["runs"]), figure
            assert figure["min"] <= figure["median"] <= figure["max"]
            if figure["baseline"]:
                assert figure["baseline_runs"], figure
                assert figure["ratio"] > 0, figure
        assert (out / f"{section['scenario']}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    scenarios = {s["scenario"]: s for s in report["scenarios"]}
    # The idle path's floor, each of its parts measured in the same run.
    floor = scenarios["e2e"]["details"]["idle_floor_p50_ms"]
    assert set(floor) == {"durable commit", "round trip", "broker publish→consume", "sum"}
    assert all(v > 0 for v in floor.values()), floor
    assert floor["sum"] >= floor["broker publish→consume"], floor
    # enqueue→start split at the relay's claim (each job's first publish, kept on its job
    # row: claim→confirm only for the jobs whose publish is an event row, as a retry's).
    e2e = {(f["case"], f["metric"]): f["median"] for f in scenarios["e2e"]["figures"]}
    hops = {metric: v for (case, metric), v in e2e.items() if case == "enqueue→start, by hop"}
    assert {"enqueue→relay's claim p50 ms", "relay's claim→start p50 ms"} <= set(hops)
    assert set(hops) <= {
        "enqueue→relay's claim p50 ms",
        "relay's claim→confirm p50 ms",
        "relay's claim→start p50 ms",
    }
    for part in ("enqueue→relay's claim p50 ms", "relay's claim→start p50 ms"):
        assert hops[part] <= e2e[("enqueue→start", "max ms")], (part, e2e)
    backlog = scenarios["backlog"]["series"][0]
    assert backlog["y"][-1] == 0, "the backlog drain ends with an empty outbox"
    scale = {f["case"]: f for f in scenarios["scale"]["figures"]}
    assert set(scale) == {
        "1 relays + 1 workers",
        "2 relays + 2 workers",
        "1 relays + 1 workers: CPU per job, own processes",
        "2 relays + 2 workers: CPU per job, own processes",
    }
    assert scale["2 relays + 2 workers: CPU per job, own processes"]["better"] == "lower"
    # CPU per job of every process group.
    per_job = scenarios["scale"]["details"]["per_job_median"]
    assert set(per_job) == {"1", "2"}
    for size in ("1", "2"):
        for group in ("relays", "workers", "bench", "postgres"):
            assert per_job[size][group] > 0, (size, group, per_job)

    table = (out / "report.md").read_text()
    # The report renders again from its JSON alone, to the same table.
    again = tmp_path / "again"
    report_module.write(again, *report_module.load(out))
    assert (again / "report.md").read_text() == table
    assert "| scenario | case | metric |" in table
    for name in ALL:
        assert f"| {name} |" in table
        assert f"![{name}]({name}.png)" in table


# 1,500 jobs: enough that a worker-only drain outlasts its stack's start, whose end opens
# the window its CPU per job is measured in. The HTTP runs wait for every job they POST
# (Celery's, behind its result backend, at tens a second; Procrastinate's too): 200 each.
@pytest.mark.timeout(600)
def test_the_peers_scenario_measures_jobcore_celery_and_procrastinate(
    settings: Settings, tmp_path: Path
) -> None:
    out = tmp_path / "peers"
    result = bench_cli(
        settings,
        "peers",
        *("--jobs", "1500", "--http-jobs", "200", "--runs", "1", "--out", str(out)),
        timeout=580,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    [section] = orjson.loads((out / "report.json").read_bytes())["scenarios"]
    assert section["scenario"] == "peers"
    assert {f["baseline"] for f in section["figures"]} == {
        "Celery, prefork 2",
        "Celery, prefork 2, quorum queue",
        "Procrastinate, concurrency 8",
        "FastAPI + Celery apply_async, prefork 2, acks_late, PG results",
        "FastAPI + Procrastinate defer_async, concurrency 8",
    }
    assert {f["metric"] for f in section["figures"]} == {
        "pipeline jobs/s",
        "worker-only jobs/s",
        "worker-only jobs/s, 2 workers",
        "worker-only CPU-ms/job, all processes",
        "POST→succeeded jobs/s",
        "enqueue→start p50 ms",
        "enqueue→start p99 ms",
    }
    # Over HTTP, at both connection counts (--http-jobs jobs each).
    http_cases = {f["case"] for f in section["figures"] if f["metric"] == "POST→succeeded jobs/s"}
    assert http_cases == {
        "200 jobs POSTed over 16 connections",
        "200 jobs POSTed over 64 connections",
    }
    # Each HTTP case against both baselines a user would build, on every metric.
    http_rows = {
        (f["case"], f["metric"], f["baseline"])
        for f in section["figures"]
        if f["case"] in http_cases
    }
    assert len(http_rows) == 2 * 3 * 2, http_rows
    # The load generator's side (POSTs/s, its CPU, the e2e rate), per system and count.
    [load_table] = section["details"]["tables"]
    assert [(row[0], row[1]) for row in load_table["rows"]] == [
        (system, clients)
        for clients in (16, 64)
        for system in (
            "jobcore",
            "FastAPI + Celery apply_async, prefork 2, acks_late, PG results",
            "FastAPI + Procrastinate defer_async, concurrency 8",
        )
    ]
    for row in load_table["rows"]:
        assert all(value > 0 for value in row[2:]), row
    for figure in section["figures"]:
        assert figure["runs"][0] > 0, figure
        assert figure["ratio"] > 0, figure
    # Where each system's CPU went: its own processes, PostgreSQL's and RabbitMQ's.
    per_job = section["cpu_ms_per_job"]
    for case, groups in (
        ("jobcore pipeline", ("relay", "worker", "postgres", "rabbitmq")),
        ("jobcore worker-only", ("worker", "postgres", "rabbitmq")),
        ("jobcore worker-only, 2 workers", ("worker", "postgres", "rabbitmq")),
        ("Celery, prefork 2", ("celery", "rabbitmq")),
        ("Celery, prefork 2, quorum queue", ("celery", "rabbitmq")),
    ):
        for group in groups:
            assert per_job[case][group] > 0, (case, group, per_job)
        # Each figure is rounded to the µs on its own.
        assert per_job[case]["all"] >= sum(per_job[case][g] for g in groups) - 0.01, per_job
    assert "postgres" not in per_job["Celery, prefork 2"]  # Celery uses no database


def test_bad_arguments_give_one_line_and_exit_2(settings: Settings, tmp_path: Path) -> None:
    for args, message in (
        (("nosuch",), "unknown scenario 'nosuch'"),
        (("--clients", "0"), "--clients takes numbers from 1 to 256"),
        (("--scale", "two"), "--scale takes comma-separated whole numbers"),
        (("--runs", "0"), "--runs"),
    ):
        result = bench_cli(settings, *args, "--out", str(tmp_path), timeout=60)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "report.json").exists()


# 2,000 jobs at 100/s with a 3 s retention: the tables are pruned while the load runs.
@pytest.mark.timeout(300)
def test_steady_scenario_prunes_while_it_loads_and_reports_sizes(
    settings: Settings, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    result = bench_cli(
        settings,
        "steady",
        *("--steady-jobs", "2000", "--steady-rate", "100"),
        *("--steady-retention", "3", "--steady-sample", "1", "--out", str(out)),
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    (steady,) = orjson.loads((out / "report.json").read_bytes())["scenarios"]
    details = steady["details"]
    assert details["unfinished_at_end"] == 0, "every job finished"
    assert details["jobs_rows_at_end"] < 2000, "finished jobs were pruned during the load"
    assert {"jobs", "outbox", "inbox"} <= set(details["final_sizes_mib"])
    figures = {f["metric"]: f for f in steady["figures"]}
    size = figures["MiB, last quarter (mean)"]
    assert size["runs"][0] > 0
    assert size["baseline_runs"][0] > 0
    rate = figures["jobs finished/s, last quarter"]
    assert rate["runs"][0] > 0
    assert rate["baseline_runs"][0] > 0
    series = {s["label"]: s for s in steady["series"]}
    # Sampled through the whole load (about 20 s): a sample of every table's size takes
    # longer than its 1 s interval when the machine is busy, so only a floor is asserted.
    sampled_at = series["all tables"]["x"]
    assert len(sampled_at) >= 5, "sampled in every quarter of the load"
    assert sampled_at[0] == 0
    assert sampled_at[-1] >= 15
    assert series["not finished"]["y"][-1] == 0
    assert (out / "steady.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# Two stacks (the fair relay and the FIFO baseline) on a small backlog: the report's
# figures exist, and B's jobs were sent while A's backlog was still waiting.
@pytest.mark.timeout(300)
def test_fair_scenario_reports_both_relays(settings: Settings, tmp_path: Path) -> None:
    out = tmp_path / "report"
    result = bench_cli(
        settings,
        "fair",
        *("--fair-backlog", "2000", "--fair-probes", "3", "--runs", "1", "--out", str(out)),
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    (fair,) = orjson.loads((out / "report.json").read_bytes())["scenarios"]
    metrics = [f["metric"] for f in fair["figures"]]
    assert metrics == [
        "enqueue→start p50 ms",
        "enqueue→start p99 ms",
        "enqueue→start max ms",
        "jobs/s drained (depth limit 1000)",
    ]
    for figure in fair["figures"]:
        assert figure["runs"][0] > 0, figure
        assert figure["baseline_runs"][0] > 0, figure
    for mode in ("fair", "fifo"):
        assert fair["details"][mode]["probes_sent"][0] >= 1
        assert fair["details"][mode]["probes_during_backlog"][0] >= 1
    assert {s["label"] for s in fair["series"]} == {"fair relay", "fifo relay"}
    assert (out / "fair.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# A few hundred jobs: both cases finish, and the ordered one is reported against the other.
@pytest.mark.timeout(300)
def test_ordered_scenario_reports_ordered_against_unordered(
    settings: Settings, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    result = bench_cli(
        settings, "ordered", *("--jobs", "300", "--runs", "1", "--out", str(out)), timeout=280
    )
    assert result.returncode == 0, result.stderr[-3000:]

    (ordered,) = orjson.loads((out / "report.json").read_bytes())["scenarios"]
    figures = {f["case"]: f for f in ordered["figures"]}
    assert figures["unordered"]["runs"][0] > 0
    keyed = figures["100 ordering keys"]
    assert keyed["runs"][0] > 0
    assert keyed["baseline_runs"] == figures["unordered"]["runs"]


# The statements of 200 jobs per arm: seconds. The scenario itself fails if the arm with
# events off wrote any.
@pytest.mark.timeout(300)
def test_timeline_scenario_reports_events_on_against_off(
    settings: Settings, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    result = bench_cli(
        settings, "timeline", *("--jobs", "200", "--runs", "1", "--out", str(out)), timeout=280
    )
    assert result.returncode == 0, result.stderr[-3000:]

    (timeline,) = orjson.loads((out / "report.json").read_bytes())["scenarios"]
    figures = {f["metric"]: f for f in timeline["figures"]}
    cpu = figures["PostgreSQL CPU ms/job"]
    assert cpu["runs"][0] > 0
    assert cpu["baseline_runs"][0] > 0
    assert cpu["baseline"] == "events off"
    # None: a happy job's `accepted`, `published`, `claimed` and `finished` are all said
    # from the job row (migrations 0019, 0040, 0041)
    assert timeline["details"]["statements"]["events_per_job_on"] == 0.0
