"""A rolling upgrade from the previous release to this code, under load (docs/operations.md,
"Upgrades").

The previous release (jobcore.database.release_history) is built from the git history and installed
in a venv of its own (tests/support/previous_release.py). Its `jobcore migrate` makes the
schema; its API, two relays and two workers run while a bounded loop POSTs jobs over HTTP:
plain ones, a rate-limited type and a concurrency-limited type (tests/support/
upgrade_jobtypes.py, declared alike by both versions). Then, with the load going on, this
code's `jobcore migrate` runs (moving every table into jobcore's own schema and leaving
views under the old names in public, through which the old processes go on), and the
processes are replaced one at a time, as a rollout
does: the API (the load moves to the new one before the old stops, as a load balancer
would), one relay, one worker; old and new relays and workers then run together for
OVERLAP seconds; then the other relay and worker. The database, the truth, then shows
no job lost, no effect recorded twice, the rate and concurrency limits held throughout
(from the jobs' start and finish times), and the load saw no HTTP answer but 202, 200 and
the documented 503 (with Retry-After).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from jobcore.amqp.connection import connect as amqp_connect
from jobcore.amqp.topology import Topology
from jobcore.database import schema_version
from jobcore.database.gateway import Database
from jobcore.database.release_history import previous_release
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import check
from jobcore.testing.processes import ROOT, jobcore_command
from tests.e2e.stack import free_port
from tests.support import databases
from tests.support import previous_release as previous_build
from tests.support.flow import most_starts_in_a_second, overlap_per_key
from tests.support.services import ServiceUrls

# The job types both versions load. Never imported here: importing declares them in this
# process's registry, and every test a pytest worker runs after collecting this module
# would then consume their queue too.
UPGRADE_JOBTYPES = Path(__file__).parents[1] / "support" / "upgrade_jobtypes.py"


def _declared(name: str) -> Any:
    """A module-level constant of UPGRADE_JOBTYPES, read without importing it."""
    for node in ast.parse(UPGRADE_JOBTYPES.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise LookupError(f"{UPGRADE_JOBTYPES} declares no {name}")


UPGRADE_QUEUE: str = _declared("QUEUE")
UPGRADE_LIMIT: int = _declared("LIMIT")
UPGRADE_RATE: float = _declared("RATE")

# At least a minute of old and new relays and workers side by side (the brief of the
# rollout); JOBCORE_UPGRADE_OVERLAP shortens it for a quick local run.
OVERLAP = float(os.environ.get("JOBCORE_UPGRADE_OVERLAP", "60"))
TENANT = "upgrade"
START_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0
# The load's bounds: one tick every TICK seconds, for at most MAX_SECONDS or MAX_JOBS.
TICK = 0.5
PLAIN_PER_TICK = 3
BURST_EVERY = 4  # ticks: a burst of rated and limited jobs every 2 s, so their gates hold some
# 6 per account at once, 3 a second on average: within a limit of 4 a second per account
# only when the gate spaces them.
RATED_PER_BURST = 12
LIMITED_PER_BURST = 3  # one over the limit of 2 at once
LIMITED_SECONDS = 0.4
MAX_SECONDS = 300.0
MAX_JOBS = 6000
ANSWERS_ALLOWED = {200, 202, 503}

pytestmark = pytest.mark.timeout(480)


@dataclass
class Proc:
    name: str
    release: str  # "old" or "new"
    role: str
    popen: subprocess.Popen[bytes]
    port: int
    log: Path


@dataclass
class Rollout:
    """The processes of both releases, started and stopped one at a time."""

    settings: Settings
    workdir: Path
    old_bin: Path
    modules: Path
    running: list[Proc] = field(default_factory=list)

    def env(self, release: str, role: str, port: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBCORE_")}
        # The old release finds its own `services` in its venv: no checkout on its path.
        path = str(self.modules) if release == "old" else f"{ROOT}{os.pathsep}{self.modules}"
        env.update(
            {
                "PYTHONPATH": path,
                "JOBCORE_ENVIRONMENT": "test",
                "JOBCORE_DATABASE_URL": self.settings.database_url,
                "JOBCORE_AMQP_URL": self.settings.amqp_url,
                "JOBCORE_AMQP_PREFIX": self.settings.amqp_prefix,
                "JOBCORE_JOB_MODULES": "upgrade_jobtypes",
                "JOBCORE_RESULT_DIR": str(self.workdir / "results"),
                "JOBCORE_SHUTDOWN_GRACE": "5",
                "JOBCORE_RELAY_POLL_INTERVAL": "0.2",
                "JOBCORE_RETRY_BACKOFF_BASE": "0.2",
                "JOBCORE_RETRY_BACKOFF_CAP": "0.5",
                "JOBCORE_WORKER_CONCURRENCY": "4",
                # One consumer priority for all: RabbitMQ shares deliveries between old and
                # new workers instead of sending them to the highest (random) one.
                "JOBCORE_WORKER_CONSUMER_PRIORITY": "0",
                "JOBCORE_DB_POOL_MIN": "1",
                # Seven processes at once on a shared server (max_connections 100).
                "JOBCORE_DB_POOL_MAX": "10" if role == "worker" else "4",
                "JOBCORE_RELAY_HEALTH_PORT": str(port),
                "JOBCORE_WORKER_HEALTH_PORT": str(port),
            }
        )
        return env

    def command(self, release: str, *args: str) -> list[str]:
        if release == "old":
            return [str(self.old_bin / "jobcore"), *args]
        return jobcore_command(*args)

    def run(self, release: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(release, *args),
            env=self.env(release, "cli", 0),
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    async def start(self, release: str, role: str, name: str) -> Proc:
        port = free_port()
        args = ("api", "--port", str(port)) if role == "api" else (role,)
        log = self.workdir / f"{name}-{release}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                self.command(release, *args),
                env=self.env(release, role, port),
                cwd=self.workdir if release == "old" else ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc = Proc(name, release, role, popen, port, log)
        self.running.append(proc)
        return proc

    async def ready(self, *procs: Proc) -> None:
        async def one(proc: Proc) -> bool:
            self.alive()
            try:
                async with httpx.AsyncClient(timeout=2) as client:
                    answer = await client.get(f"http://127.0.0.1:{proc.port}/readyz")
                    return answer.status_code == 200
            except httpx.HTTPError:
                return False

        for proc in procs:
            await until(lambda p=proc: one(p), timeout=START_TIMEOUT, what=f"{proc.name} ready")

    def alive(self) -> None:
        for proc in self.running:
            if proc.popen.poll() is not None:
                raise AssertionError(
                    f"{proc.name} ({proc.release}) exited with {proc.popen.returncode}:\n"
                    + proc.log.read_text(errors="replace")[-3000:]
                )

    async def stop(self, proc: Proc) -> int | None:
        self.alive()
        self.running.remove(proc)
        proc.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while proc.popen.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # polling a child process, bounded by the deadline
        if proc.popen.poll() is None:
            proc.popen.kill()
            proc.popen.wait(timeout=10)
            return None
        return proc.popen.returncode

    async def replace(self, old: Proc) -> Proc:
        """A new process in the old one's place: started and ready before the old stops."""
        new = await self.start("new", old.role, old.name)
        await self.ready(new)
        code = await self.stop(old)
        assert code == 0, (
            f"{old.name} (old) did not stop cleanly: {code}\n"
            + old.log.read_text(errors="replace")[-3000:]
        )
        return new

    def kill_all(self) -> None:
        for proc in self.running:
            if proc.popen.poll() is None:
                proc.popen.kill()
                proc.popen.wait(timeout=10)


async def until(
    check: Callable[[], Awaitable[Any]], *, timeout: float, what: str, interval: float = 0.2
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        if result := await check():
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)  # the poll interval, bounded by the deadline


@dataclass
class Load:
    """POSTs over HTTP, each with an Idempotency-Key of its own, retried with that key after
    a 503 or a broken connection, to whichever API ``api_url`` names at the time."""

    api_url: str
    api_key: str
    accepted: dict[str, str] = field(default_factory=dict)  # idempotency key -> job id
    answers: Counter[int] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    missing_retry_after: int = 0
    transport_errors: int = 0
    abandoned: list[str] = field(default_factory=list)
    sequence: int = 0

    async def post(self, client: httpx.AsyncClient, job_type: str, payload: dict[str, Any]) -> None:
        key = f"up-{uuid.uuid4()}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                answer = await client.post(
                    f"{self.api_url}/jobs/{job_type}",
                    json=payload,
                    headers={"Idempotency-Key": key, "Authorization": f"Bearer {self.api_key}"},
                )
            except httpx.TransportError:
                self.transport_errors += 1
            else:
                self.answers[answer.status_code] += 1
                if answer.status_code in (200, 202):
                    self.accepted[key] = str(answer.json()["job_id"])
                    return
                if answer.status_code not in ANSWERS_ALLOWED:
                    self.unexpected.append(f"{answer.status_code} {answer.text[:300]}")
                    return
                if not answer.headers.get("retry-after"):
                    self.missing_retry_after += 1
            await asyncio.sleep(0.2)  # retry pacing while the API cannot take the job
        self.abandoned.append(key)

    def payload(self, **fields: Any) -> dict[str, Any]:
        self.sequence += 1
        return {"n": self.sequence, **fields}

    async def run(self, stop: asyncio.Event) -> None:
        tasks: set[asyncio.Task[None]] = set()
        begun = time.monotonic()
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
        async with httpx.AsyncClient(timeout=10, limits=limits) as client:
            tick = 0
            while (
                not stop.is_set()
                and time.monotonic() - begun < MAX_SECONDS
                and self.sequence < MAX_JOBS
            ):
                batch = [("up_plain", self.payload()) for _ in range(PLAIN_PER_TICK)]
                if tick % BURST_EVERY == 0:
                    batch += [
                        ("up_rated", self.payload(account=f"r{n % 2}"))
                        for n in range(RATED_PER_BURST)
                    ]
                    batch += [
                        ("up_limited", self.payload(account="c", seconds=LIMITED_SECONDS))
                        for _ in range(LIMITED_PER_BURST)
                    ]
                for job_type, payload in batch:
                    task = asyncio.create_task(self.post(client, job_type, payload))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                tick += 1
                with contextlib.suppress(TimeoutError):
                    # The load's pacing: the next tick, or the stop.
                    await asyncio.wait_for(stop.wait(), begun + tick * TICK - time.monotonic())
            if tasks:
                await asyncio.gather(*tasks)


async def rows(db: Database, query: str, *args: Any) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cursor = await conn.execute(query, args)
        return [dict(row) for row in await cursor.fetchall()]


def worker_pid(worker_id: str | None) -> int | None:
    return int(worker_id.split(":")[1]) if worker_id else None


async def test_rolling_upgrade_from_the_previous_release_under_load(
    service_urls: ServiceUrls, tmp_path: Path
) -> None:
    release = previous_release(schema_version.own_version())
    assert release is not None, "no previous release in jobcore.database.release_history"
    old_bin = previous_build.venv(release)

    name = databases.create_database(service_urls.pg_admin_url, template=None)
    settings = Settings(
        environment="test",
        database_url=databases.with_database(service_urls.pg_admin_url, name),
        amqp_url=service_urls.amqp_url,
        amqp_prefix=f"jct.{uuid.uuid4().hex[:10]}",
    )
    modules = tmp_path / "modules"
    modules.mkdir()
    shutil.copy(UPGRADE_JOBTYPES, modules / "upgrade_jobtypes.py")
    rollout = Rollout(settings, tmp_path, old_bin, modules)
    db = Database(settings, min_size=0, max_size=2, name="upgrade-check")
    try:
        migrated = rollout.run("old", "migrate")
        assert migrated.returncode == 0, migrated.stderr
        assert f"to {release.revision}" in migrated.stdout, migrated.stdout
        created = rollout.run(
            "old", "keys", "create", "--tenant", TENANT, "--scope", "enqueue", "--json"
        )
        assert created.returncode == 0, created.stderr
        api_key = orjson.loads(created.stdout)["key"]

        api = await rollout.start("old", "api", "api")
        relays = [await rollout.start("old", "relay", f"relay{n}") for n in (1, 2)]
        workers = [await rollout.start("old", "worker", f"worker{n}") for n in (1, 2)]
        await rollout.ready(api, *relays, *workers)
        await db.open(wait=True)

        async def succeeded(at_least: int, since: Any = None) -> bool:
            [row] = await rows(
                db,
                "SELECT count(*) AS n FROM jobs WHERE status = 'succeeded' "
                "AND finished_at > coalesce(%s::timestamptz, '-infinity')",
                since,
            )
            rollout.alive()
            assert not load.unexpected, load.unexpected[:5]
            return bool(row["n"] >= at_least)

        load = Load(f"http://127.0.0.1:{api.port}", api_key)
        stop = asyncio.Event()
        load_task = asyncio.create_task(load.run(stop))
        try:
            await until(lambda: succeeded(30), timeout=60, what="the old stack to run jobs")

            # This code's migration, while the old release works.
            migrate = await asyncio.create_subprocess_exec(
                *rollout.command("new", "migrate"),
                env=rollout.env("new", "cli", 0),
                cwd=ROOT,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(migrate.communicate(), timeout=120)
            assert migrate.returncode == 0, err.decode()
            [version] = await rows(db, "SELECT version_num FROM alembic_version")
            assert version["version_num"] == schema_version.own_head(), out.decode()
            # The move into jobcore's schema: the old processes, which name the tables
            # unqualified, go on through the views left under the old names in public.
            moved = await rows(
                db,
                "SELECT to_regclass('jobcore.jobs') IS NOT NULL AS moved, "
                "(SELECT relkind::text FROM pg_class WHERE oid = to_regclass('public.jobs'))"
                " AS left_behind",
            )
            assert moved == [{"moved": True, "left_behind": "v"}]

            # The API: the load moves to the new one, then the old one stops.
            new_api = await rollout.start("new", "api", "api")
            await rollout.ready(new_api)
            load.api_url = f"http://127.0.0.1:{new_api.port}"
            code = await rollout.stop(api)
            assert code == 0, api.log.read_text(errors="replace")[-3000:]

            # One relay and one worker; then old and new side by side.
            relays[0] = await rollout.replace(relays[0])
            workers[0] = await rollout.replace(workers[0])
            overlap_from = time.monotonic()
            [now] = await rows(db, "SELECT now() AS at")
            mixed_since = now["at"]
            old_pid, new_pid = workers[1].popen.pid, workers[0].popen.pid

            async def both_workers_started_jobs() -> bool:
                started = await rows(
                    db, "SELECT DISTINCT worker_id FROM jobs WHERE started_at > %s", mixed_since
                )
                pids = {worker_pid(row["worker_id"]) for row in started}
                rollout.alive()
                assert not load.unexpected, load.unexpected[:5]
                return old_pid in pids and new_pid in pids

            await until(
                both_workers_started_jobs, timeout=OVERLAP + 60, what="old and new workers' jobs"
            )
            remaining = OVERLAP - (time.monotonic() - overlap_from)
            with contextlib.suppress(TimeoutError):
                # The overlap's length (the rollout's), cut short only by a crash.
                await asyncio.wait_for(asyncio.shield(load_task), max(0.0, remaining))
            assert not load_task.done(), "the load ended during the overlap"
            rollout.alive()

            relays[1] = await rollout.replace(relays[1])
            workers[1] = await rollout.replace(workers[1])
            [now] = await rows(db, "SELECT now() AS at")
            await until(
                lambda: succeeded(30, now["at"]), timeout=60, what="the new stack to run jobs"
            )
        finally:
            stop.set()
            await asyncio.wait_for(load_task, timeout=90)

        accepted = list(load.accepted.values())

        async def all_finished() -> bool:
            [row] = await rows(
                db,
                "SELECT count(*) FILTER (WHERE status NOT IN ('succeeded', 'failed', "
                "'cancelled')) AS open FROM jobs",
            )
            rollout.alive()
            return bool(row["open"] == 0)

        await until(all_finished, timeout=120, what="every accepted job to finish")
        codes = {p.name: await rollout.stop(p) for p in list(rollout.running)}
        assert set(codes.values()) == {0}, codes

        report = await check(db, TENANT, accepted)
        summary = {
            "report": report.as_dict(),
            "answers": dict(load.answers),
            "transport_errors": load.transport_errors,
        }
        print(f"rolling upgrade: {summary}")  # the run's figures, shown with -s or on failure
        assert load.unexpected == [], summary
        assert load.abandoned == [], summary
        assert load.missing_retry_after == 0, summary
        assert set(load.answers) <= ANSWERS_ALLOWED, summary
        assert report.lost == 0, summary
        assert report.jobs == len(accepted) == len(set(accepted)), summary
        assert report.statuses == {"succeeded": len(accepted)}, summary
        assert report.duplicate_effects == 0, summary
        assert report.missing_effects == 0, summary
        assert report.stray_effects == 0, summary

        rated = await rows(db, "SELECT payload, started_at FROM jobs WHERE type = 'up_rated'")
        limited = await rows(
            db,
            "SELECT concurrency_key, started_at, finished_at FROM jobs WHERE type = 'up_limited'",
        )
        assert len(rated) > 50, summary
        assert len(limited) > 25, summary
        for account in ("r0", "r1"):
            starts = [r["started_at"] for r in rated if r["payload"]["account"] == account]
            assert most_starts_in_a_second(starts) <= UPGRADE_RATE, sorted(starts)
        overlaps = overlap_per_key(limited, "concurrency_key")
        assert max(overlaps.values()) <= UPGRADE_LIMIT, overlaps
    finally:
        rollout.kill_all()
        await db.close()
        databases.drop_database(service_urls.pg_admin_url, name)
        await delete_topology(settings)


async def delete_topology(settings: Settings) -> None:
    """The run's queues and exchanges, which its processes declared, go with it."""
    connection = await amqp_connect(settings)
    try:
        channel = await connection.channel()
        topology = Topology.from_settings(settings)
        await topology.delete(channel, [UPGRADE_QUEUE])
    finally:
        await connection.close()
