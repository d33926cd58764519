"""`jobcore bench`: runs the chosen scenarios, each next to its baseline, and writes the
report (report.json, report.md, one PNG per scenario) to the output directory.

Each scenario gets a database and a broker prefix of its own (created for it, removed
after it) and starts the jobcore processes it needs as separate OS processes, with the
machinery the fault tests use (:mod:`jobcore.testing.pipeline`). The harness ships in the
wheel (``services.bench``); its plots need the ``bench`` extra (matplotlib).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from jobcore.kernel.settings import Settings, load_settings
from jobcore.testing.scratch import database_url, scratch
from services.bench import machine, report
from services.bench.measure import Profiler

if TYPE_CHECKING:
    from jobcore.testing.pipeline import Stack

# Run when none is named.
SCENARIOS = ("enqueue", "batch", "relay", "e2e", "scale", "backlog", "fair")
EXTRA_SCENARIOS = (
    "tracing",
    "steady",
    "priority",
    "ordered",
    "timeline",
    "timeline_e2e",
    "peers",
    "cardinality",
    "pressure",
    "startup",
    "paced",
    "workflow",
)  # run when named
BENCH_JOB_MODULES = ("jobcore.examples.jobtypes",)
# Scenarios whose relays publish to queues nobody consumes (they measure how fast a relay
# publishes, and purge the queues): the queue depth limit would stop them at its size.
UNLIMITED_QUEUES = {"JOBCORE_RELAY_QUEUE_DEPTH_LIMIT": "0"}


@dataclass(frozen=True)
class Options:
    jobs: int = 5000
    # Seconds of each enqueue run (wrk -d).
    duration: float = 10.0
    # Jobs per HTTP run of the peers scenario (at most ``jobs``).
    http_jobs: int = 2000
    relay_rows: int = 100_000
    backlog_rows: int = 1_000_000
    runs: int = 3
    clients: tuple[int, ...] = (1, 16, 64)
    scale: tuple[int, ...] = (1, 2, 4)
    profile: bool = False
    steady_jobs: int = 1_000_000
    steady_rate: float = 250.0
    steady_sample: float = 30.0
    steady_retention: int = 300
    fair_backlog: int = 100_000
    fair_probes: int = 20
    batch_size: int = 1000
    # The workflow scenario's many-workflows case: how many small workflows (a diamond of
    # 4 jobs) are created at once, ascending; empty: the case is skipped.
    workflow_counts: tuple[int, ...] = (1000, 10000)
    # The cardinality scenario: its size, and step lists that replace the size's (empty:
    # the size's own).
    cardinality_size: str = "full"
    tenant_steps: tuple[int, ...] = ()
    key_steps: tuple[int, ...] = ()
    held_steps: tuple[int, ...] = ()
    gate_keys: int = 0
    # --pg-stats: every scratch database on this server (one that preloads
    # pg_stat_statements: scripts/pg_stats_cluster.sh), and the e2e scenario's
    # per-statement and wait-event tables (services/bench/pgstats.py). Empty: off.
    pg_stats_url: str = ""
    # The pressure scenario (services/bench/scenarios/pressure.py): its rate, each phase's
    # length, the recovery after each, how long after the pin the sizes are compared, the
    # kills a second, the size sampling period, and its cluster's port.
    pressure_rate: float = 200.0
    pressure_warmup: float = 480.0
    pressure_clean: float = 60.0
    pressure_pin: float = 600.0
    pressure_phase: float = 60.0
    pressure_recovery: float = 60.0
    pressure_pin_recovery: float = 60.0
    pressure_after_pin: float = 1800.0
    pressure_kill_rate: float = 5.0
    pressure_sample: float = 5.0
    pressure_port: int = 5460
    # The paced scenario (services/bench/scenarios/paced.py): the peak its rates are
    # fractions of (0: measured first, offering the probe rate for the probe's seconds),
    # the fractions in %, each rate's seconds, and the systems paced.
    paced_peak: float = 0.0
    paced_fractions: tuple[int, ...] = (10, 25, 50, 75, 90)
    paced_seconds: float = 30.0
    paced_probe_rate: float = 2000.0
    paced_probe_seconds: float = 15.0
    paced_systems: tuple[str, ...] = ("jobcore", "procrastinate", "celery")
    # The jobcore-baseline system's JOBCORE_* settings (KEY=VALUE each).
    paced_baseline_env: tuple[str, ...] = ()


class Scenario(Protocol):
    TITLE: str

    def steps(self, options: Options) -> int: ...

    async def run(self, bench: Bench) -> report.Section: ...


def scenario(name: str) -> Scenario:
    module: Any = importlib.import_module(f"services.bench.scenarios.{name}")
    return module  # type: ignore[no-any-return]


@dataclass
class Bench:
    """What a scenario runs with: options, settings, where logs and profiles go, progress."""

    options: Options
    config: Settings
    out: Path
    # Called once per step with what is being measured (the progress bar).
    step: Callable[[str], None] = lambda description: None
    log_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_dir = self.out / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)

    @contextlib.asynccontextmanager
    async def scratch(
        self, name: str, job_modules: tuple[str, ...] = BENCH_JOB_MODULES
    ) -> AsyncIterator[Settings]:
        """Settings on a database and a broker prefix of their own, removed afterwards."""
        run_id = uuid.uuid4().hex[:10]
        config = load_settings(
            database_url=database_url(self.config.database_url, f"jobcore_bench_{run_id}"),
            amqp_prefix=f"bench.{name}.{run_id}",
            job_modules=job_modules,
            result_dir=self.out / "results",
        )
        async with scratch(config):
            if self.options.pg_stats_url:
                from services.bench import pgstats

                await pgstats.enable(config.database_url)
            yield config

    @contextlib.asynccontextmanager
    async def stack(
        self,
        config: Settings,
        name: str,
        *,
        relays: int,
        workers: int,
        api: bool = True,
        env: Mapping[str, str] | None = None,
        api_args: tuple[str, ...] = (),
    ) -> AsyncIterator[Stack]:
        """An API (without ``api``: none, for a scenario that writes to the database
        itself), relays and workers as OS processes on ``config``, with production defaults
        for what the fault harness turns down (the pool size) and the no-op route the
        enqueue baseline uses."""
        from jobcore.testing.pipeline import Stack

        environment = {
            "JOBCORE_DB_POOL_MAX": str(config.db_pool_max),
            # As the bench was run with, so coalescing can be compared on and off
            # (the stack's processes get no JOBCORE_* of the bench's environment).
            "JOBCORE_API_ENQUEUE_COALESCE_MAX": str(config.api_enqueue_coalesce_max),
            "JOBCORE_BENCH_ROUTES": "true",
            **(env or {}),
        }
        stack = Stack(
            config,
            self.log_dir / name,
            tenant="bench",
            relays=relays,
            workers=workers,
            api=api,
            env=environment,
            api_args=api_args,
        )
        async with stack:
            yield stack

    @contextlib.asynccontextmanager
    async def profiled(
        self, section: report.Section, label: str, processes: dict[str, int]
    ) -> AsyncIterator[None]:
        """py-spy on ``processes`` for the block when --profile is on; else nothing."""
        if not self.options.profile:
            yield
            return
        profiler = Profiler(self.out / "profiles", f"{section.scenario}-{label}", processes)
        profiler.start()
        try:
            yield
        finally:
            for name, summary in (await asyncio.to_thread(profiler.stop)).items():
                section.profiles[f"{label}/{name}"] = summary


async def analyze(config: Settings) -> None:
    """ANALYZE the scratch database, as a deployment's autovacuum does within a minute of
    its tables filling. The services plan their prepared statements once (generic plans):
    planned on near-empty tables, where every index costs the same, a plan can pick one
    that scans; new statistics make them plan again."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(config.database_url, autocommit=True) as conn:
        await conn.execute("ANALYZE")


async def relays_ready(stack: Stack) -> None:
    """Until every relay answers /readyz (database and broker connected)."""
    import httpx

    from jobcore.testing.waiting import eventually

    for relay in stack.relays:
        port = await stack.relay_health_port(relay)

        async def ready(port: int = port) -> bool:
            try:
                async with httpx.AsyncClient(timeout=2) as client:
                    return (await client.get(f"http://127.0.0.1:{port}/readyz")).is_success
            except httpx.HTTPError:
                return False

        await eventually(ready, timeout=60, interval=0.05, what=f"{relay.name} to be ready")


def pids(stack: Stack) -> dict[str, int]:
    return {p.name: p.pid for p in stack.processes if p.alive}


async def run(
    names: list[str],
    options: Options,
    out: Path,
    step: Callable[[str], None],
    config: Settings,
) -> list[report.Section]:
    if options.pg_stats_url:
        from services.bench import pgstats

        why = await pgstats.check_server(options.pg_stats_url)
        if why is not None:
            raise RuntimeError(why)
        # The scratch databases (named from this URL) go to the stats server.
        config = load_settings(database_url=options.pg_stats_url)
    bench = Bench(options, config, out, step)
    facts = await machine.facts(config)
    sections = []
    for name in names:
        started = time.monotonic()
        section = await scenario(name).run(bench)
        section.seconds = time.monotonic() - started
        sections.append(section)
        # Written after every scenario: an interrupted run still leaves what it measured.
        report.write(out, facts, sections, options_dict(options))
    return sections


def options_dict(options: Options) -> dict[str, Any]:
    shown = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(options).items()}
    if options.pg_stats_url:
        from services.bench.pgstats import where

        shown["pg_stats_url"] = where(options.pg_stats_url)  # a URL may hold a password
    return shown


def total_steps(names: list[str], options: Options) -> int:
    return sum(scenario(name).steps(options) for name in names)
