"""`jobcore chaos`: a seeded random schedule of faults against a steady load, then a report.

It runs the whole stack (an API, relays and workers as child processes) on a database and
a broker prefix of its own, created for the run and removed after it; the relays and
workers reach RabbitMQ, and every process reaches PostgreSQL, through proxies it controls.
While jobs arrive at a steady rate it throws one fault at a time — a relay or a worker
killed with SIGKILL (and restarted), RabbitMQ stopped and started, PostgreSQL restarted,
the broker or the database connections cut silently, one worker's or relay's statements
let commit and their answers cut — and after each measures how long
a new job then takes to succeed end to end. When the time is up it stops the load, waits
(bounded) for quiescence and checks in the database that no accepted job was lost and no
effect was recorded twice, and that no job ended failed without a handler having run.
Exit 0 only when all hold.

Two of its faults, ``broker_restart`` and ``postgres_restart``, stop the machine's shared
RabbitMQ and PostgreSQL: a run that throws either holds, for its whole length, the lock
the disruptive tests take (:mod:`jobcore.testing.chaos`), and starts them again at the
end whatever happened. The other faults touch only the run's own processes and proxies,
so ``--fault kill_relay --fault kill_worker --fault broker_cut --fault database_cut
--fault worker_commit_cut --fault relay_commit_cut`` leaves the shared services alone
(the wheel check in CI runs that, next to the tests).
Beside the HTTP load, an application producer (``--app-rate``) enqueues the same job type
through ``jobcore.enqueue_in`` inside transactions of its own that also write an
application row, and rolls back a share of them on purpose after the enqueue
(``--app-rollback-share``): its committed jobs are checked with the others (none lost),
and no job of a rolled-back transaction may exist.
A multi-step load (``--multistep-rate``, off by default) also creates workflows (a diamond
with a snoozing step and a ``finally`` job; one with an ``on_failure`` compensation
edge), batches with all three callbacks, bursts of a debounced type on a few keys, and
PATCH edits of delayed jobs, all over HTTP; the report counts them and the violations of
each of their guarantees (:mod:`jobcore.testing.multistep`), which must all be 0.
The stack machinery and the job type it submits are the library's testing kit
(:mod:`jobcore.testing`), which the tests use too.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import random
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from jobcore.kernel.settings import Settings, load_settings
from jobcore.testing.scratch import database_url, scratch
from jobcore.testing.tcpproxy import Mode
from services.cli.common import emit, example, fail, settings

if TYPE_CHECKING:
    from jobcore.testing.app_producer import AppProducer
    from jobcore.testing.multistep import MultiStep
    from jobcore.testing.pipeline import Stack, Submitter

FAULTS = (
    "kill_relay",
    "kill_worker",
    "broker_restart",
    "postgres_restart",
    "broker_cut",
    "database_cut",
    "worker_commit_cut",
    "relay_commit_cut",
)
# "commit, then cut before the answer" (TcpProxy.cut_after_commit), aimed at the processes'
# own database proxies: every statement of one worker (claims, outcomes, maintenance) may
# be the one cut; the relays' cuts fall on COMMITs, after a batch was published. The fault
# cuts one answer after another, for its length.
COMMIT_CUT_FAULTS = {"worker_commit_cut": "worker", "relay_commit_cut": "relay"}
# The bytes of a claim of the run's job type (jobcore.testing.pipeline.JOB_TYPE): its
# `types` parameter, a text array.
CLAIM_REQUEST = b"{effect}"
# The pause after one cut before the next is armed (the process reconnects meanwhile).
COMMIT_CUT_PAUSE = 0.2
# What a worker logs when a claim's retry finds its first try committed (services.worker).
RESUMED_CLAIM_LOG = "the claim's first try committed unanswered; running the job it claimed"
# How long one fault lasts (an outage, a cut, the wait before a killed process restarts).
# The faults that stop the shared services rather than this run's processes or proxies.
SHARED_SERVICE_FAULTS = frozenset({"broker_restart", "postgres_restart"})
FAULT_SECONDS = (2.0, 6.0)
# The quiet time between one recovery and the next fault.
GAP_SECONDS = (1.0, 5.0)
RECOVERY_TIMEOUT = 120.0
LOCK_TIMEOUT = 900.0
# Only the job types the run submits: their short timeouts (a slot held at most 32 s) let it
# declare a short consumer timeout, and so a short inbox window (below).
CHAOS_JOB_MODULES = ("jobcore.testing.jobtypes", "jobcore.testing.multistep_jobtypes")
# The pruner and the sweeper work all through the faults, on a scale of seconds instead of
# days: finished jobs (and their effects, by cascade) go 20 s after they end, inbox rows
# after the shortest window the settings allow (delivery limit × consumer timeout = 180 s),
# and a pending job whose message vanished is published again after 20 s. The run's own
# consumer timeout (60 s, above the 'effect' type's 30 s timeout + 2 s lease, which start-up
# checks) is declared shorter than the broker's (30 min): with deliveries
# acknowledged at the claim, an inbox row is only ever written for a claimed message, and
# the claim's fence makes a late copy harmless anyway — which is what the run checks.
MAINTENANCE_ENV = {
    "JOBCORE_RETENTION_SUCCEEDED": "20",
    "JOBCORE_RETENTION_FAILED": "20",
    "JOBCORE_RETENTION_CANCELLED": "20",
    "JOBCORE_PRUNER_INTERVAL": "2",
    "JOBCORE_AMQP_DELIVERY_LIMIT": "3",
    "JOBCORE_AMQP_CONSUMER_TIMEOUT": "60",
    "JOBCORE_INBOX_RETENTION": "180",
    "JOBCORE_SWEEPER_INTERVAL": "2",
    "JOBCORE_SWEEPER_STALE_AFTER": "20",
}


# The stack's quotas (jobcore.testing.pipeline.LOAD_QUOTAS), for the application
# producer's in-process enqueues: the HTTP load must not be refused for its sake.
_LOAD_QUOTA_SETTINGS = {
    "quota_enqueue_rate": 1_000_000.0,
    "quota_enqueue_burst": 1_000_000,
    "quota_max_unfinished": 1_000_000_000,
}


def _say(message: str) -> None:
    typer.echo(f"chaos: {message}", err=True)


@contextlib.contextmanager
def disruption_lock(path: str, timeout: float) -> Iterator[None]:
    """The lock the disruptive tests take; waits (bounded) while someone else holds it."""
    with open(path, "w") as handle:
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told:
                    _say(f"waiting for {path}: another run is disrupting the shared services")
                    told = True
                if time.monotonic() > deadline:
                    fail(f"{path} still held after {timeout:.0f}s; try again later")
                time.sleep(1.0)  # the lock's poll interval, bounded by the deadline
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_settings(config: Settings, run_id: str, log_dir: Path) -> Settings:
    """The developer's settings pointed at a database and a broker prefix of this run."""
    return load_settings(
        database_url=database_url(config.database_url, f"jobcore_chaos_{run_id}"),
        amqp_prefix=f"jobcore-chaos-{run_id}",
        job_modules=CHAOS_JOB_MODULES,
        result_dir=log_dir / "results",
    )


@dataclass
class FaultRecord:
    number: int
    kind: str
    target: str
    seconds: float
    recovery: float | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "n": self.number,
            "fault": self.kind,
            "target": self.target,
            "seconds": round(self.seconds, 2),
            "recovered_in": None if self.recovery is None else round(self.recovery, 2),
            "error": self.error,
        }


@dataclass
class Chaos:
    stack: Stack
    rng: random.Random
    faults: tuple[str, ...] = FAULTS
    records: list[FaultRecord] = field(default_factory=list)
    _round: list[str] = field(default_factory=list)

    def next_fault(self) -> str:
        """Rounds of every fault in a shuffled order: random, yet each kind comes up once
        in every round, so even a short run throws all of them."""
        if not self._round:
            self._round = list(self.faults)
            self.rng.shuffle(self._round)
        return self._round.pop()

    async def run(self, submitter: Submitter, until: float) -> None:
        """Faults one after another until the monotonic time ``until``, and at least one
        whole round: a short run on a slow machine still throws every kind once (a run fits
        as few as five faults in a minute), at the cost of one round's overrun at most."""
        while time.monotonic() < until or len(self.records) < len(self.faults):
            gap = self.rng.uniform(*GAP_SECONDS)
            if time.monotonic() + gap >= until and len(self.records) >= len(self.faults):
                break
            await asyncio.sleep(gap)  # quiet time between faults (part of the schedule)
            kind = self.next_fault()
            seconds = self.rng.uniform(*FAULT_SECONDS)
            record = FaultRecord(len(self.records) + 1, kind, "", seconds)
            self.records.append(record)
            try:
                record.target = await self.apply(kind, seconds)
            except Exception as exc:  # a fault that could not be thrown or lifted: go on
                record.error = f"{type(exc).__name__}: {exc}"[:500]
                _say(f"fault {record.number}: {kind} failed: {record.error}")
            from jobcore.testing.pipeline import time_to_recover

            record.recovery = await time_to_recover(
                self.stack.db, submitter, timeout=RECOVERY_TIMEOUT
            )
            shown = "did not recover" if record.recovery is None else f"{record.recovery:.1f}s"
            _say(f"fault {record.number}: {kind} {record.target} {seconds:.1f}s; recovery {shown}")

    async def apply(self, kind: str, seconds: float) -> str:
        """Throw one fault at the stack for ``seconds`` and lift it; return its target."""
        from jobcore.testing.pipeline import broker_down, postgres_down

        stack = self.stack
        if kind in ("kill_relay", "kill_worker"):
            process = self.rng.choice(stack.relays if kind == "kill_relay" else stack.workers)
            process.kill()
            await asyncio.sleep(seconds)  # the process stays dead a while (the fault)
            await stack.restart(process)
            return process.name
        if kind == "broker_restart":
            async with broker_down(locked=True):
                await asyncio.sleep(seconds)  # the outage
            return "rabbitmq"
        if kind == "postgres_restart":
            async with postgres_down(locked=True):
                await asyncio.sleep(seconds)  # the outage
            return "postgresql"
        if kind in COMMIT_CUT_FAULTS:
            return await self._commit_cuts(kind, seconds)
        proxy = stack.broker_proxy if kind == "broker_cut" else stack.database_proxy
        assert proxy is not None
        proxy.set_mode(Mode.BLACKHOLE)
        try:
            await asyncio.sleep(seconds)  # the silent cut
        finally:
            proxy.set_mode(Mode.FORWARD)
        return "broker proxy" if kind == "broker_cut" else "database proxy"

    async def _commit_cuts(self, kind: str, seconds: float) -> str:
        """For ``seconds``, let statements commit and cut their answers, one after
        another: a worker's (one chosen at random), or the relays' COMMITs (all of them are
        armed: only the relay holding the wake lease may be publishing). The target names
        the processes and how many answers were cut."""
        stack = self.stack
        relays = COMMIT_CUT_FAULTS[kind] == "relay"
        processes = stack.relays if relays else [self.rng.choice(stack.workers)]
        proxies = [stack.process_proxies[p.name] for p in processes]
        before = [proxy.cuts for proxy in proxies]
        until = time.monotonic() + seconds
        armed = 0
        while (left := until - time.monotonic()) > 0:
            # A worker's every other cut waits for a claim (the only statement sending the
            # job types as a text array); the others fall on whatever statement comes next.
            match = CLAIM_REQUEST if not relays and armed % 2 else b""
            armed += 1
            cuts = [proxy.cut_after_commit(match, transaction_end=relays) for proxy in proxies]
            try:
                await asyncio.wait(cuts, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for cut in cuts:
                    cut.cancel()  # disarmed if still waiting: one cut at a time
            await asyncio.sleep(COMMIT_CUT_PAUSE)  # the processes reconnect between cuts
        counts = [proxy.cuts - n for proxy, n in zip(proxies, before, strict=True)]
        names = ", ".join(f"{p.name} {n}" for p, n in zip(processes, counts, strict=True))
        return f"answers cut: {names}"


def resumed_claims(stack: Stack) -> int:
    """Claims whose first try committed unanswered and whose retry ran the job anyway."""
    from jobcore.testing.pipeline import log_records

    return sum(
        1
        for worker in stack.workers
        for incarnation in range(1, worker.incarnation + 1)
        for record in log_records(worker.log_dir / f"{worker.name}.{incarnation}.log")
        if record.get("msg") == RESUMED_CLAIM_LOG
    )


@contextlib.asynccontextmanager
async def _steady_load(
    submitter: Submitter, rate: float, limit: int, handler_seconds: float
) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.create_task(submitter.steady(rate, stop, limit=limit, seconds=handler_seconds))
    try:
        yield stop
    finally:
        stop.set()
        await task


@contextlib.asynccontextmanager
async def _multistep_load(load: MultiStep | None, rate: float) -> AsyncIterator[None]:
    if load is None:
        yield
        return
    stop = asyncio.Event()
    task = asyncio.create_task(load.steady(rate, stop))
    try:
        yield
    finally:
        stop.set()
        await task


@contextlib.asynccontextmanager
async def _app_load(
    producer: AppProducer | None, rate: float, limit: int, handler_seconds: float
) -> AsyncIterator[None]:
    if producer is None:
        yield
        return
    stop = asyncio.Event()
    task = asyncio.create_task(producer.steady(rate, stop, limit=limit, seconds=handler_seconds))
    try:
        yield
    finally:
        stop.set()
        await task


async def _soak(
    config: Settings,
    log_dir: Path,
    *,
    duration: float,
    seed: int,
    rate: float,
    relays: int,
    workers: int,
    settle: float,
    handler_seconds: float,
    faults: tuple[str, ...],
    app_rate: float = 0.0,
    app_rollback_share: float = 0.0,
    multistep_rate: float = 0.0,
) -> dict[str, Any]:
    from jobcore.execution.registry import load_job_modules
    from jobcore.testing.app_producer import AppProducer
    from jobcore.testing.multistep import MultiStep, check_multistep, install_archive
    from jobcore.testing.pipeline import (
        LeaseWatch,
        Stack,
        archive_pruned,
        check,
        via_port,
        wait_quiescent,
    )

    started = time.monotonic()
    stack = Stack(
        config,
        log_dir,
        tenant="chaos",
        relays=relays,
        workers=workers,
        broker_proxy=True,
        database_proxy=True,
        process_database_proxies=bool(set(COMMIT_CUT_FAULTS).intersection(faults)),
        env=MAINTENANCE_ENV,
    )
    async with stack, stack.submitter(give_up=RECOVERY_TIMEOUT) as submitter:
        # Before the first job: every job the pruner deletes is still checked at the end.
        await archive_pruned(stack.db)
        if multistep_rate > 0:
            await install_archive(config.database_url)
        _say(f"stack up in {time.monotonic() - started:.1f}s; logs in {log_dir}")
        chaos = Chaos(stack, random.Random(seed), faults)
        producer = None
        if app_rate > 0:
            # Through the run's database proxy: the database faults reach it too.
            assert stack.database_proxy is not None
            producer = AppProducer(
                via_port(config.database_url, stack.database_proxy.port),
                config.model_copy(update=_LOAD_QUOTA_SETTINGS),
                load_job_modules(config.job_modules),
                stack.tenant,
                random.Random(seed + 1),
                rollback_share=app_rollback_share,
            )
            await producer.prepare()
        multistep = (
            MultiStep(
                stack.api_url, stack.api_key, random.Random(seed + 2), give_up=RECOVERY_TIMEOUT
            )
            if multistep_rate > 0
            else None
        )
        async with LeaseWatch(stack.db) as leases, contextlib.AsyncExitStack() as scope:
            if multistep is not None:
                await scope.enter_async_context(multistep)
            async with (
                _steady_load(submitter, rate, int(rate * duration), handler_seconds),
                _app_load(producer, app_rate, int(app_rate * duration) + 1, handler_seconds),
                _multistep_load(multistep, multistep_rate),
            ):
                await chaos.run(submitter, time.monotonic() + duration)
            _say(f"load stopped after {len(submitter.accepted)} accepted jobs; settling")
            app = None
            if producer is not None:
                await producer.settle(config.database_url)
            settled = await wait_quiescent(stack.db, stack.tenant, timeout=settle)
            accepted = submitter.job_ids + ([] if producer is None else producer.committed)
            steps = None
            if multistep is not None:
                # Its jobs are counted as accepted: its own check says none was lost.
                steps, step_jobs = await check_multistep(
                    config.database_url, stack.tenant, multistep
                )
                accepted += step_jobs
            report = await check(stack.db, stack.tenant, accepted)
            if producer is not None:
                app = await producer.report(config.database_url)
        recoveries = [r.recovery for r in chaos.records if r.recovery is not None]
        unrecovered = sum(1 for r in chaos.records if r.recovery is None)
        return {
            "database": config.database_name,
            "amqp_prefix": config.amqp_prefix,
            "seed": seed,
            "duration": duration,
            "rate": rate,
            "relays": relays,
            "workers": workers,
            **report.as_dict(),
            "faults": len(chaos.records),
            "faults_by_kind": {k: sum(1 for r in chaos.records if r.kind == k) for k in faults},
            "longest_recovery_seconds": round(max(recoveries, default=0.0), 2),
            "unrecovered_faults": unrecovered,
            "resumed_claims": resumed_claims(stack),
            "fault_errors": sum(1 for r in chaos.records if r.error),
            "settle_seconds": round(settled, 2),
            "longest_overdue_lease_seconds": round(leases.worst, 2),
            "app_rate": app_rate,
            **(app.as_dict() if app is not None else {}),
            "multistep_rate": multistep_rate,
            **(steps.as_dict() if steps is not None else {}),
            **({"multistep_http": dict(multistep.answers)} if multistep is not None else {}),
            "http": submitter.summary(),
            "processes_alive": {p.name: p.alive for p in stack.processes},
            "schedule": [r.as_dict() for r in chaos.records],
            "elapsed_seconds": round(time.monotonic() - started, 1),
            "ok": not (
                report.lost
                or report.duplicate_effects
                or report.missing_effects
                or report.stray_effects
                or report.failed_without_handler
                or (app is not None and app.jobs_from_rollbacks)
                or (steps is not None and not steps.ok)
            ),
        }


SUMMARY_KEYS = (
    "accepted",
    "succeeded",
    "failed",
    "cancelled",
    "lost",
    "duplicate_effects",
    "missing_effects",
    "stray_effects",
    "failed_without_handler",
    "app_committed",
    "app_rolled_back",
    "app_jobs_from_rollbacks",
    "multistep_workflows",
    "multistep_batches",
    "multistep_callbacks_fired",
    "multistep_debounce_keys",
    "multistep_debounce_runs",
    "multistep_edits_applied",
    "multistep_violations",
    "faults",
    "longest_recovery_seconds",
    "unrecovered_faults",
    "resumed_claims",
    "fault_errors",
    "retried",
    "reaped",
    "pruned",
    "most_attempts",
    "longest_overdue_lease_seconds",
    "settle_seconds",
    "elapsed_seconds",
    "ok",
)


def _print(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        emit(result, as_json=True)
        return
    emit({k: result[k] for k in SUMMARY_KEYS if k in result}, as_json=False)
    typer.echo("")
    emit(
        result["schedule"],
        as_json=False,
        columns=["n", "fault", "target", "seconds", "recovered_in", "error"],
    )
    typer.echo("")
    typer.echo(f"http answers: {result['http']['answers']}")


def _with_cleanup(
    config: Settings, action: Callable[[], Awaitable[dict[str, Any]]], *, restore: bool
) -> dict[str, Any]:
    from jobcore.testing.pipeline import services_restored

    async def run() -> dict[str, Any]:
        async with scratch(config):
            try:
                return await action()
            finally:
                # Whatever happened, the shared services run again before the run's
                # database and topology go.
                if restore:
                    await asyncio.to_thread(services_restored)

    return asyncio.run(run())


def chaos(
    duration: float = typer.Option(
        60.0, min=5, max=24 * 3600, help="Seconds of faults under load."
    ),
    seed: int = typer.Option(1, help="Seeds the fault schedule (same seed, same schedule)."),
    rate: float = typer.Option(50.0, min=1, max=2000, help="Jobs submitted per second."),
    relays: int = typer.Option(2, min=1, max=8, help="Relay processes."),
    workers: int = typer.Option(2, min=1, max=8, help="Worker processes."),
    settle: float = typer.Option(
        300.0, min=10, max=3600, help="At most this many seconds to wait for quiescence."
    ),
    handler_seconds: float = typer.Option(
        0.05, min=0, max=5, help="How long each job's handler works (kills land mid-handler)."
    ),
    app_rate: float = typer.Option(
        5.0,
        min=0,
        max=500,
        help="Application transactions a second that enqueue with enqueue_in (0: none).",
    ),
    app_rollback_share: float = typer.Option(
        0.25, min=0, max=1, help="The share of those rolled back on purpose after the enqueue."
    ),
    multistep_rate: float = typer.Option(
        0.0,
        min=0,
        max=50,
        help="Multi-step actions a second (workflows, batches, debounce bursts, edits; 0: none).",
    ),
    fault: list[str] | None = typer.Option(
        None, "--fault", help="Only these faults (repeatable; default all of them)."
    ),
    log_dir: Path | None = typer.Option(None, help="Where the processes' logs go."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Throw a seeded random schedule of faults at the whole stack under load; report
    lost jobs, duplicated effects and jobs failed without a handler having run (exit 0 only
    when there are none)."""
    # Imported here, like the stack machinery: every other command starts without it.
    from jobcore.testing import chaos as chaos_support

    chosen = tuple(fault or FAULTS)
    unknown = sorted(set(chosen) - set(FAULTS))
    if unknown:
        fail(f"unknown fault(s) {', '.join(unknown)}; choose from {', '.join(FAULTS)}", code=2)
    # SIGTERM ends the run like Ctrl-C does: the stack stops, the shared services are
    # started again, this run's database and queues are removed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # The harness's own pool reconnects through every outage; the report says what matters.
    for noisy in ("psycopg", "psycopg.pool"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    run_id = uuid.uuid4().hex[:10]
    logs = (log_dir or Path("var/chaos")) / run_id
    logs.mkdir(parents=True, exist_ok=True)
    config = run_settings(settings(), run_id, logs)
    disrupts_shared = bool(SHARED_SERVICE_FAULTS.intersection(chosen))
    lock = (
        disruption_lock(chaos_support.LOCK_PATH, LOCK_TIMEOUT)
        if disrupts_shared
        else contextlib.nullcontext()
    )
    with lock:
        _say(
            f"run {run_id}: database {config.database_name}, broker prefix {config.amqp_prefix}, "
            f"{duration:.0f}s at {rate:g} jobs/s, seed {seed}"
        )
        try:
            result = _with_cleanup(
                config,
                lambda: _soak(
                    config,
                    logs,
                    duration=duration,
                    seed=seed,
                    rate=rate,
                    relays=relays,
                    workers=workers,
                    settle=settle,
                    handler_seconds=handler_seconds,
                    faults=chosen,
                    app_rate=app_rate,
                    app_rollback_share=app_rollback_share,
                    multistep_rate=multistep_rate,
                ),
                restore=disrupts_shared,
            )
        except KeyboardInterrupt:
            _say("interrupted: the stack is stopped, the services run, the run's data is gone")
            sys.exit(130)
    _print(result, as_json)
    sys.exit(0 if result["ok"] else 1)


def register(app: typer.Typer) -> None:
    app.command(
        "chaos",
        epilog=example(
            "jobcore chaos --duration 60 --seed 7 --fault kill_relay --fault kill_worker"
        ),
    )(chaos)
