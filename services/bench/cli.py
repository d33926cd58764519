"""`jobcore bench`: every scenario next to its baseline in the same run, and a report.

The harness is this package (``services/bench/``, shipped in the wheel); this module is its
command line, which the `jobcore` program (:mod:`services.entry`) adds beside the CLI's. Its
plots need matplotlib, which only the ``bench`` extra installs (``pip install
'jobcore[bench]'``): without it the command says so and stops before running anything.
"""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import typer

from services.commandline import example, fail, settings


def _positive_list(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        fail(f"--{what} takes comma-separated whole numbers, got {text!r}", code=2)
    if not values or min(values) < 1 or max(values) > 256:
        fail(f"--{what} takes numbers from 1 to 256, got {text!r}", code=2)
    return values


def _step_list(text: str | None, what: str, low: int, high: int) -> tuple[int, ...]:
    """An ascending list of step sizes (``10,1000,100000``); None or empty: the size's."""
    if not text:
        return ()
    try:
        values = tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())
    except ValueError:
        fail(f"--{what} takes comma-separated whole numbers, got {text!r}", code=2)
    if not values or min(values) < low or max(values) > high:
        fail(f"--{what} takes numbers from {low:,} to {high:,}, got {text!r}", code=2)
    if list(values) != sorted(set(values)):
        fail(f"--{what} takes ascending numbers, got {text!r}", code=2)
    return values


def bench(
    scenarios: list[str] = typer.Argument(
        None,
        help="Scenarios to run, in order: enqueue batch relay e2e scale backlog fair (the "
        "default), tracing, steady (about 70 minutes at its defaults), priority (its "
        "backlog and probes are --fair-backlog and --fair-probes), ordered, timeline (the "
        "hot path's statements with the job timeline on vs off), timeline_e2e (the same "
        "through the pipeline), workflow (a workflow, and many small ones at once: "
        "--workflows, against one-at-a-time enqueue), "
        "peers (Celery and Procrastinate on the same no-op jobs; "
        "needs the bench extra), cardinality (tenants, ordering keys, held jobs and gate "
        "keys swept over orders of magnitude; --size) and pressure (a pinned xmin horizon, "
        "REPEATABLE READ readers, overload, backend kills, pool exhaustion, a PostgreSQL "
        "restart and worker SIGKILLs at a steady rate, on its own cluster: "
        "scripts/pressure_cluster.sh; about 55 minutes at its defaults; --pressure-*) and "
        "paced (jobcore, Procrastinate and FastAPI + Celery at 10 to 90 % of the peak, "
        "open loop: pickup latency, bytes, WAL and CPU per job; --paced-*).",
    ),
    jobs: int = typer.Option(
        5000, min=10, max=1_000_000, help="Jobs per e2e, scale, batch and tracing run."
    ),
    duration: float = typer.Option(
        10.0, min=1, max=600, help="Seconds of each enqueue run (wrk's -d)."
    ),
    relay_rows: int = typer.Option(
        100_000, min=10, max=10_000_000, help="Outbox rows the relay scenario drains per run."
    ),
    backlog_rows: int = typer.Option(
        1_000_000, min=100, max=10_000_000, help="Pending outbox rows in the backlog scenario."
    ),
    http_jobs: int = typer.Option(
        2000,
        min=10,
        max=1_000_000,
        help="Jobs the peers scenario POSTs per HTTP run, at each connection count (at most "
        "--jobs; e.g. 200 for a quick check).",
    ),
    runs: int = typer.Option(3, min=1, max=20, help="Runs of each measurement (medians)."),
    clients: str = typer.Option("1,16,64", help="Concurrent HTTP clients of the enqueue runs."),
    scale: str = typer.Option("1,2,4", help="Relays and workers (each) of the scale runs."),
    steady_jobs: int = typer.Option(
        1_000_000, min=100, max=100_000_000, help="Jobs the steady scenario pushes through."
    ),
    steady_rate: float = typer.Option(
        250.0, min=1, max=5000, help="Jobs per second the steady scenario enqueues."
    ),
    steady_sample: float = typer.Option(
        30.0, min=0.5, max=600, help="Seconds between the steady scenario's size samples."
    ),
    steady_retention: int = typer.Option(
        300, min=1, max=86_400, help="Seconds finished jobs are kept in the steady scenario."
    ),
    fair_backlog: int = typer.Option(
        100_000, min=10, max=10_000_000, help="Tenant A's backlog in the fair scenario."
    ),
    fair_probes: int = typer.Option(
        20, min=1, max=1000, help="Tenant B's jobs (one a second) in the fair scenario."
    ),
    batch_size: int = typer.Option(
        1000, min=1, max=1000, help="Items per request in the batch scenario."
    ),
    workflows: str = typer.Option(
        "1000,10000",
        help="Workflow scenario: how many diamonds of 4 jobs are created at once, each its "
        "own POST /workflows, against as many single enqueues (ascending counts, e.g. "
        "100,1000,10000; empty: that case is skipped).",
    ),
    size: str = typer.Option(
        "full",
        help="The cardinality scenario's size: small (about a minute, what CI runs) or full "
        "(the issue's sweeps, 10 to 10,000 tenants, 10 to 1,000,000 ordering keys, 1,000 to "
        "100,000 held jobs, 1,000,000 gate keys: tens of minutes).",
    ),
    tenant_steps: str = typer.Option(
        None, help="Cardinality: tenants with a delayed job, per step (e.g. 10,1000)."
    ),
    key_steps: str = typer.Option(
        None, help="Cardinality: ordering keys in the database, per step."
    ),
    held_steps: str = typer.Option(
        None, help="Cardinality: held jobs behind the rate key, per step."
    ),
    gate_keys: int = typer.Option(
        0, min=0, max=10_000_000, help="Cardinality: distinct gate keys over all waves."
    ),
    pg_stats: bool = typer.Option(
        False,
        help="Run on the bench's own PostgreSQL with pg_stat_statements (start it with "
        "scripts/pg_stats_cluster.sh start) and add to the e2e scenario the cost of each "
        "statement per job and the wait events, for its last run and a pipeline drain.",
    ),
    pg_stats_url: str = typer.Option(
        "postgresql://postgres@127.0.0.1:5451/postgres",
        help="The --pg-stats server (scripts/pg_stats_cluster.sh url).",
    ),
    pressure_rate: float = typer.Option(
        200.0, min=1, max=5000, help="Pressure: jobs per second offered (open loop)."
    ),
    pressure_warmup: float = typer.Option(
        480.0,
        min=1,
        max=3600,
        help="Pressure: seconds of load before the clean phase, so that the size before "
        "the pin is the tables' working size: the inbox fills for its 300 s window, "
        "finished jobs for their 120 s, then autovacuum settles them.",
    ),
    pressure_clean: float = typer.Option(
        60.0, min=1, max=3600, help="Pressure: seconds of the clean phase."
    ),
    pressure_pin: float = typer.Option(
        600.0, min=1, max=7200, help="Pressure: seconds the xmin horizon is pinned."
    ),
    pressure_phase: float = typer.Option(
        60.0, min=1, max=3600, help="Pressure: seconds of each other phase."
    ),
    pressure_recovery: float = typer.Option(
        60.0, min=1, max=3600, help="Pressure: seconds of recovery after each phase."
    ),
    pressure_pin_recovery: float = typer.Option(
        60.0, min=1, max=7200, help="Pressure: seconds of recovery after the pin."
    ),
    pressure_after_pin: float = typer.Option(
        1800.0,
        min=0,
        max=7200,
        help="Pressure: the load runs on at least this long after the pin ended, where the "
        "hot tables' size is compared with before it (0: no longer than the phases).",
    ),
    pressure_kill_rate: float = typer.Option(
        5.0, min=0.1, max=100, help="Pressure: pg_terminate_backend calls a second."
    ),
    pressure_sample: float = typer.Option(
        5.0, min=0.5, max=600, help="Pressure: seconds between table size samples."
    ),
    pressure_port: int = typer.Option(
        5460, min=1024, max=65535, help="Pressure: its own cluster's port (never 5432)."
    ),
    paced_peak: float = typer.Option(
        0.0,
        min=0,
        max=100_000,
        help="Paced: the peak jobs/s its rates are fractions of (0: measure jobcore's first).",
    ),
    paced_fractions: str = typer.Option(
        "10,25,50,75,90", help="Paced: the rates, in % of the peak."
    ),
    paced_seconds: float = typer.Option(
        30.0, min=1, max=3600, help="Paced: seconds each rate is offered."
    ),
    paced_probe_rate: float = typer.Option(
        2000.0, min=1, max=100_000, help="Paced: jobs/s offered while the peak is measured."
    ),
    paced_probe_seconds: float = typer.Option(
        15.0, min=1, max=600, help="Paced: seconds the peak is measured over."
    ),
    paced_systems: str = typer.Option(
        "jobcore,procrastinate,celery",
        help="Paced: the systems paced, in order (also jobcore-baseline: jobcore with "
        "--paced-baseline-env; jobcore-2: two API processes, relays and workers; "
        "jobcore-relayed: with JOBCORE_DIRECT_PICKUP=false).",
    ),
    paced_baseline_env: str = typer.Option(
        "",
        help="Paced: the jobcore-baseline system's settings, comma-separated "
        "JOBCORE_NAME=value pairs (e.g. JOBCORE_RELAY_OVERLAP=true).",
    ),
    profile: bool = typer.Option(False, help="Profile the jobcore processes with py-spy."),
    out: Path = typer.Option(Path("var/bench"), help="Where the report and plots go."),
) -> None:
    """Benchmark jobcore against baselines measured in the same run; write a report."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    if importlib.util.find_spec("matplotlib") is None:
        fail("jobcore bench draws its plots with matplotlib: pip install 'jobcore[bench]'")
    # Imported here: `jobcore --help` need not load the harness.
    from services.bench import harness

    chosen = list(scenarios or harness.SCENARIOS)
    known = (*harness.SCENARIOS, *harness.EXTRA_SCENARIOS)
    unknown = [name for name in chosen if name not in known]
    if unknown:
        fail(f"unknown scenario {unknown[0]!r}; choose from {', '.join(known)}", code=2)
    if "peers" in chosen:
        from services.bench.scenarios.peers import available

        why = available()
        if why is not None:
            fail(why)
    if pg_stats:
        from services.bench import pgstats

        why = asyncio.run(pgstats.check_server(pg_stats_url))
        if why is not None:
            fail(why)
    if pressure_port == 5432:
        fail("--pressure-port: the pressure scenario restarts its cluster; not 5432", code=2)
    systems = tuple(part.strip() for part in paced_systems.split(",") if part.strip())
    known_systems = (
        "jobcore",
        "jobcore-baseline",
        "jobcore-2",
        "jobcore-relayed",
        "procrastinate",
        "celery",
    )
    if not systems or any(s not in known_systems for s in systems):
        fail(f"--paced-systems takes {', '.join(known_systems)}; got {paced_systems!r}", code=2)
    baseline_env = tuple(p.strip() for p in paced_baseline_env.split(",") if p.strip())
    if any(not p.startswith("JOBCORE_") or "=" not in p for p in baseline_env):
        fail(
            f"--paced-baseline-env takes JOBCORE_NAME=value pairs; got {paced_baseline_env!r}",
            code=2,
        )
    if paced_peak <= 0 and "jobcore" not in systems:
        fail("--paced-peak: without jobcore among the systems, give the peak", code=2)
    if "paced" in chosen and any(not s.startswith("jobcore") for s in systems):
        from services.bench.scenarios.peers import available as peers_available

        why = peers_available()
        if why is not None:
            fail(why)
    if size not in ("small", "full"):
        fail(f"--size takes small or full, got {size!r}", code=2)
    options = harness.Options(
        jobs=jobs,
        duration=duration,
        http_jobs=http_jobs,
        relay_rows=relay_rows,
        backlog_rows=backlog_rows,
        runs=runs,
        clients=_positive_list(clients, "clients"),
        scale=_positive_list(scale, "scale"),
        profile=profile,
        steady_jobs=steady_jobs,
        steady_rate=steady_rate,
        steady_sample=steady_sample,
        steady_retention=steady_retention,
        fair_backlog=fair_backlog,
        fair_probes=fair_probes,
        batch_size=batch_size,
        workflow_counts=_step_list(workflows, "workflows", 1, 100_000),
        cardinality_size=size,
        tenant_steps=_step_list(tenant_steps, "tenant-steps", 1, 1_000_000),
        key_steps=_step_list(key_steps, "key-steps", 1, 10_000_000),
        held_steps=_step_list(held_steps, "held-steps", 1, 10_000_000),
        gate_keys=gate_keys,
        pg_stats_url=pg_stats_url if pg_stats else "",
        pressure_rate=pressure_rate,
        pressure_warmup=pressure_warmup,
        pressure_clean=pressure_clean,
        pressure_pin=pressure_pin,
        pressure_phase=pressure_phase,
        pressure_recovery=pressure_recovery,
        pressure_pin_recovery=pressure_pin_recovery,
        pressure_after_pin=pressure_after_pin,
        pressure_kill_rate=pressure_kill_rate,
        pressure_sample=pressure_sample,
        pressure_port=pressure_port,
        paced_peak=paced_peak,
        paced_fractions=_positive_list(paced_fractions, "paced-fractions"),
        paced_seconds=paced_seconds,
        paced_probe_rate=paced_probe_rate,
        paced_probe_seconds=paced_probe_seconds,
        paced_systems=systems,
        paced_baseline_env=baseline_env,
    )
    config = settings()
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=False,
    ) as progress:
        task = progress.add_task("starting", total=harness.total_steps(chosen, options))

        def advance(description: str) -> None:
            progress.update(task, advance=1, description=description)

        sections = asyncio.run(harness.run(chosen, options, out, advance, config))
    typer.echo(f"report: {out / 'report.md'} (and report.json, {len(sections)} plots)")
    from services.bench.report import table_rows

    for line in table_rows(sections):
        typer.echo(line)


def register(app: typer.Typer) -> None:
    app.command(
        "bench", epilog=example("jobcore bench e2e --jobs 2000 --runs 3 --out var/bench/e2e")
    )(bench)
