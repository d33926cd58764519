"""The whole pipeline as separate OS processes, driven over HTTP and checked in the database.

Shared by the fault tests (``tests/faults/test_pipeline_faults.py``) and ``jobcore chaos``:

- :class:`Stack` runs one API (or none), N relays and M workers as child processes
  (``jobcore api``, ``jobcore relay``, ``jobcore worker``), optionally reaching RabbitMQ
  and/or PostgreSQL through a :class:`~jobcore.testing.tcpproxy.TcpProxy` the caller controls, and
  kills, restarts and stops them.
- :class:`Submitter` enqueues ``effect`` jobs over HTTP with an API key, each with its own
  Idempotency-Key, retrying a 503 or a lost connection with the same key (the way a client
  should), and counts every answer it got.
- :func:`wait_quiescent` waits (with a deadline) until no job is open and the outbox is
  empty; :func:`check` returns the :class:`Report` of the invariants: every accepted job
  terminal, each succeeded job's effect in ``job_effects`` exactly once, no effect on a job
  that did not succeed.
- :class:`LeaseWatch` samples how long any job stayed ``running`` past its lease.
- :func:`broker_down` / :func:`postgres_down` stop a shared service (taking the disruption
  lock unless the caller already holds it) without blocking the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import orjson

from jobcore.database.gateway import Database, execute, fetch_all
from jobcore.database.store import Query
from jobcore.kernel.errors import DatabaseUnavailable
from jobcore.kernel.settings import Settings
from jobcore.testing import chaos
from jobcore.testing.processes import ROOT, jobcore_command, settings_env
from jobcore.testing.tcpproxy import TcpProxy
from jobcore.testing.waiting import eventually
from jobcore.usecases import keys as key_usecases

PIPELINE_JOB_MODULES = ("jobcore.examples.jobtypes", "jobcore.testing.jobtypes")
JOB_TYPE = "effect"  # libs/jobcore/testing/jobtypes.py: records one effect, lease 2 s
TERMINAL = ("succeeded", "failed", "cancelled")

# Stacks push load from one tenant as fast as they can: the quotas are checked on every
# request (so what they cost is in every measurement) but set far above any test's rate.
LOAD_QUOTAS: dict[str, str] = {
    "JOBCORE_QUOTA_ENQUEUE_RATE": "1000000",
    "JOBCORE_QUOTA_ENQUEUE_BURST": "1000000",
    "JOBCORE_QUOTA_MAX_UNFINISHED": "1000000000",
    "JOBCORE_QUOTA_MAX_LONG_POLLS": "0",
    "JOBCORE_API_MAX_LONG_POLLS": "0",
}

# Everything reconnects and retries within a second or two, so a fault test spends its
# time on the fault, not on backoff. Silent cuts are found by heartbeats (2 s) and timeouts.
FAST_ENV: dict[str, str] = {
    "JOBCORE_AMQP_HEARTBEAT": "2",
    "JOBCORE_DB_CONNECT_TIMEOUT": "2",
    "JOBCORE_DB_OPERATION_TIMEOUT": "4",
    "JOBCORE_DB_POOL_MAX": "10",
    "JOBCORE_SHUTDOWN_GRACE": "2",
    "JOBCORE_RETRY_BACKOFF_BASE": "0.2",
    "JOBCORE_RETRY_BACKOFF_CAP": "1",
    "JOBCORE_WORKER_REAPER_INTERVAL": "0.5",
    "JOBCORE_RELAY_HEALTH_PORT": "0",
    "JOBCORE_RELAY_POLL_INTERVAL": "0.2",
    "JOBCORE_RELAY_PUBLISH_TIMEOUT": "4",
    "JOBCORE_RELAY_CONNECT_TIMEOUT": "2",
    "JOBCORE_RELAY_RECONNECT_BASE_DELAY": "0.05",
    "JOBCORE_RELAY_RECONNECT_MAX_DELAY": "1",
    "JOBCORE_RELAY_RETRY_BASE_DELAY": "0.05",
    "JOBCORE_RELAY_RETRY_MAX_DELAY": "0.5",
}

# A process imports a lot before it serves; on a loaded 2-core machine that takes seconds.
PROCESS_START = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the socket listening on TCP ``port`` (Linux: the
    listening sockets of /proc/net/tcp*, by inode, against the process's descriptors). A
    port picked free and handed to a process can be taken by another process before it
    binds; whatever answers there is then not the process asked."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # local address (hex ip:port), state (0A: LISTEN), inode
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    try:
        descriptors = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for descriptor in descriptors:
        with contextlib.suppress(OSError):
            target = os.readlink(descriptor)
            if target.startswith("socket:[") and target[len("socket:[") : -1] in inodes:
                return True
    return False


class PortTaken(RuntimeError):
    """The port picked for a process was taken by another before the process bound it."""


def via_port(url: str, port: int) -> str:
    """``url`` with its host and port replaced by 127.0.0.1:``port`` (credentials kept)."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _target(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    if "," in parts.netloc.rpartition("@")[2]:
        # A proxy stands in front of one server; a failover pair's hosts each need their own.
        raise ValueError("a proxy fronts one host: the URL names several (a failover pair)")
    return parts.hostname or "127.0.0.1", parts.port or default_port


def log_records(path: Path) -> list[dict[str, Any]]:
    """The JSON log lines a process wrote (other lines are skipped)."""
    if not path.exists():
        return []
    records = []
    for line in path.read_bytes().splitlines():
        with contextlib.suppress(orjson.JSONDecodeError):
            record = orjson.loads(line)
            if isinstance(record, dict):
                records.append(record)
    return records


# --- processes ---------------------------------------------------------------------------


@dataclass
class Process:
    """One ``jobcore`` child process; each (re)start writes its own log file."""

    name: str
    args: tuple[str, ...]
    env: dict[str, str]
    log_dir: Path
    incarnation: int = 0
    popen: subprocess.Popen[bytes] | None = None
    # The environment this incarnation got on top of ``env`` (its health port, say).
    extra_env: dict[str, str] = field(default_factory=dict)
    _log: IO[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.{self.incarnation}.log"

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def start(self, **extra_env: str) -> None:
        self.incarnation += 1
        self._close_log()
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed when the process ends
        self.extra_env = dict(extra_env)
        self.popen = subprocess.Popen(
            jobcore_command(*self.args),
            env={**self.env, **extra_env},
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def kill(self) -> None:
        """SIGKILL, and reap it."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait(timeout=10)

    async def stop(self, grace: float) -> int | None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; the exit code."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self.popen.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # the poll interval, bounded by the deadline
        code = self.popen.poll()
        if code is None:
            self.kill()
        self._close_log()
        return code

    def records(self) -> list[dict[str, Any]]:
        return log_records(self.log_path)

    def logged(self, msg: str) -> list[dict[str, Any]]:
        return [r for r in self.records() if r.get("msg") == msg]

    def all_logs(self) -> str:
        return "\n".join(
            (self.log_dir / f"{self.name}.{i}.log").read_text(errors="replace")
            for i in range(1, self.incarnation + 1)
            if (self.log_dir / f"{self.name}.{i}.log").exists()
        )

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


class Stack:
    """An API (unless ``api`` is off), relays and workers as separate processes, with
    optional proxies in front of the broker (for the relays and workers) and of PostgreSQL
    (for all three)."""

    def __init__(
        self,
        settings: Settings,
        log_dir: Path,
        *,
        tenant: str = "pipeline",
        relays: int = 1,
        workers: int = 1,
        api: bool = True,
        broker_proxy: bool = False,
        database_proxy: bool = False,
        process_database_proxies: bool = False,
        env: Mapping[str, str] | None = None,
        api_args: tuple[str, ...] = (),
    ) -> None:
        self.settings = settings
        self.api_args = api_args
        self.log_dir = log_dir
        self.tenant = tenant
        self.env = {**FAST_ENV, **LOAD_QUOTAS, **(env or {})}
        self.grace = float(self.env["JOBCORE_SHUTDOWN_GRACE"]) + 8.0
        # With several brokers configured, the proxy stands in front of the first.
        self.broker_proxy = (
            TcpProxy(*_target(settings.amqp_urls[0], 5672)) if broker_proxy else None
        )
        self.database_proxy = (
            TcpProxy(*_target(settings.database_url, 5432)) if database_proxy else None
        )
        # One more proxy per relay and worker, behind which only that process reaches
        # PostgreSQL (through the shared one, when there is one): for faults aimed at one
        # process's database connections (TcpProxy.cut_after_commit). By process name.
        self._process_database_proxies = process_database_proxies
        self.process_proxies: dict[str, TcpProxy] = {}
        self.db = Database(settings, min_size=0, max_size=3, name="jobcore-pipeline")
        self.api_port = 0
        self.api_key = ""
        self.api: Process | None = None
        self.relays: list[Process] = []
        self.workers: list[Process] = []
        self._relay_count = relays
        self._worker_count = workers
        # Off for a caller that drives the relays and workers through the database alone:
        # one process fewer to start, and none idling beside what it measures.
        self._with_api = api

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def processes(self) -> list[Process]:
        return [p for p in (self.api, *self.relays, *self.workers) if p is not None]

    async def __aenter__(self) -> Stack:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _env(self, *, broker: bool, own_proxy: TcpProxy | None = None) -> dict[str, str]:
        extra = dict(self.env)
        proxy = own_proxy or self.database_proxy
        if proxy is not None:
            extra["JOBCORE_DATABASE_URL"] = via_port(self.settings.database_url, proxy.port)
        if broker and self.broker_proxy is not None:
            extra["JOBCORE_AMQP_URL"] = via_port(self.settings.amqp_urls[0], self.broker_proxy.port)
        return settings_env(self.settings, **extra)

    async def start(self, *, wait_consuming: bool = True) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for proxy in (self.broker_proxy, self.database_proxy):
            if proxy is not None:
                await proxy.start()
        await self.db.open(wait=True)
        self.api_key = (
            await key_usecases.create_key(
                self.db, self.tenant, "pipeline", actor="testing:pipeline"
            )
        ).key
        if self._with_api:
            self.api_port = free_port()
            self.api = Process(
                "api",
                ("api", "--port", str(self.api_port), *self.api_args),
                self._env(broker=False),
                self.log_dir,
            )
        self.relays = [
            Process(f"relay-{i}", ("relay",), await self._process_env(f"relay-{i}"), self.log_dir)
            for i in range(self._relay_count)
        ]
        self.workers = [
            Process(
                f"worker-{i}", ("worker",), await self._process_env(f"worker-{i}"), self.log_dir
            )
            for i in range(self._worker_count)
        ]
        for process in self.processes:
            self._start(process)
        if self.api is not None:
            await self._api_on_a_port_of_its_own()
        if wait_consuming:
            for worker in self.workers:
                await self.wait_consuming(worker)

    async def _process_env(self, name: str) -> dict[str, str]:
        """A relay's or a worker's environment, with its own database proxy if asked."""
        if not self._process_database_proxies:
            return self._env(broker=True)
        target = (
            ("127.0.0.1", self.database_proxy.port)
            if self.database_proxy is not None
            else _target(self.settings.database_url, 5432)
        )
        proxy = TcpProxy(*target)
        await proxy.start()
        self.process_proxies[name] = proxy
        return self._env(broker=True, own_proxy=proxy)

    def _start(self, process: Process) -> None:
        extra = {}
        if process in self.workers:
            # Each incarnation its own port: the old one may still be in TIME_WAIT.
            extra["JOBCORE_WORKER_HEALTH_PORT"] = str(free_port())
        process.start(**extra)

    async def stop(self) -> dict[str, int | None]:
        """Stop every process (SIGTERM, then SIGKILL), the proxies and the harness pool."""
        codes: dict[str, int | None] = {}
        try:
            stops = [p.stop(self.grace) for p in self.processes]
            results = await asyncio.gather(*stops, return_exceptions=True)
            for process, result in zip(self.processes, results, strict=True):
                codes[process.name] = result if isinstance(result, int) else None
        finally:
            for proxy in (
                *self.process_proxies.values(),
                self.broker_proxy,
                self.database_proxy,
            ):
                if proxy is not None:
                    with contextlib.suppress(Exception):
                        await proxy.stop()
            await self.db.close()
        return codes

    async def _api_on_a_port_of_its_own(self, tries: int = 3) -> None:
        """Until the API is ready on its port, starting it on another free port when the
        one picked was taken before it could bind."""
        assert self.api is not None
        for _ in range(tries - 1):
            try:
                await self.wait_api_ready()
                return
            except PortTaken:
                self.api_port = free_port()
                self.api.args = ("api", "--port", str(self.api_port), *self.api_args)
                self._start(self.api)
        await self.wait_api_ready()

    async def wait_api_ready(self, timeout: float = PROCESS_START) -> None:
        assert self.api is not None
        api = self.api

        async def ready() -> bool:
            if not api.alive:
                logs = api.all_logs()
                this_start = api.log_path.read_text(errors="replace")
                if "address already in use" in this_start.lower():
                    raise PortTaken(f"port {self.api_port} was taken before the API bound it")
                raise AssertionError(f"the API exited:\n{logs[-3000:]}")
            try:
                async with httpx.AsyncClient(timeout=2) as client:
                    answer = await client.get(f"{self.api_url}/readyz")
            except httpx.HTTPError:
                return False
            # Another process's server on the port would answer too.
            return answer.status_code == 200 and listens_on(api.pid, self.api_port)

        await eventually(ready, timeout=timeout, interval=0.1, what="the API to be ready")

    async def wait_consuming(self, worker: Process, timeout: float = PROCESS_START) -> None:
        """Until this incarnation of ``worker`` consumes (its log says so)."""

        async def consuming() -> bool:
            if not worker.alive:
                raise AssertionError(f"{worker.name} exited:\n{worker.all_logs()[-3000:]}")
            return bool(worker.logged("worker consuming"))

        await eventually(
            consuming, timeout=timeout, interval=0.05, what=f"{worker.name} to consume"
        )

    async def relay_health_port(self, relay: Process, timeout: float = PROCESS_START) -> int:
        async def port() -> int | None:
            if not relay.alive:
                raise AssertionError(f"{relay.name} exited:\n{relay.all_logs()[-3000:]}")
            starting = relay.logged("relay starting")
            return int(starting[0]["health_port"]) if starting else None

        found = await eventually(
            port, timeout=timeout, interval=0.05, what=f"{relay.name} to start"
        )
        assert found is not None
        return found

    async def restart(self, process: Process, *, wait: bool = True) -> None:
        """Start ``process`` again (it must have ended); wait until it serves."""
        assert not process.alive, f"{process.name} is still running"
        self._start(process)
        if wait and process in self.workers:
            await self.wait_consuming(process)
        elif wait and process in self.relays:
            await self.relay_health_port(process)
        elif wait and process is self.api:
            await self.wait_api_ready()

    async def worker_metric(self, worker: Process, name: str) -> float:
        """The sum of a metric's samples on ``worker``'s /metrics (this incarnation's)."""
        port = worker.extra_env["JOBCORE_WORKER_HEALTH_PORT"]
        async with httpx.AsyncClient(timeout=5) as client:
            text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#")
        )

    def submitter(self, **kwargs: Any) -> Submitter:
        return Submitter(self.api_url, self.api_key, **kwargs)


# --- load ----------------------------------------------------------------------------------


@dataclass
class Submitter:
    """Enqueues ``effect`` jobs over HTTP, one Idempotency-Key each, retrying a 503 or a lost
    connection with the same key until ``give_up`` seconds passed; counts every answer."""

    base_url: str
    api_key: str
    timeout: float = 10.0
    give_up: float = 120.0
    accepted: dict[str, str] = field(default_factory=dict)  # idempotency key -> job id
    answers: Counter[int] = field(default_factory=Counter)  # HTTP status -> count
    transport_errors: int = 0
    replays: int = 0
    missing_retry_after: int = 0
    abandoned: list[str] = field(default_factory=list)  # keys never answered 202
    unexpected: list[str] = field(default_factory=list)  # answers other than 202 / 503
    _client: httpx.AsyncClient | None = None
    _sequence: int = 0

    async def __aenter__(self) -> Submitter:
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=self.timeout,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=64),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @property
    def job_ids(self) -> list[str]:
        return list(self.accepted.values())

    async def submit(self, *, seconds: float = 0.0, n: int | None = None) -> str | None:
        """One job; its id once the API answered 202, None if it never did."""
        assert self._client is not None, "use `async with submitter`"
        self._sequence += 1
        number = self._sequence if n is None else n
        key = f"pipeline-{uuid.uuid4()}"
        payload = {"n": number, "seconds": seconds}
        deadline = time.monotonic() + self.give_up
        while True:
            try:
                response = await self._client.post(
                    f"/jobs/{JOB_TYPE}", json=payload, headers={"Idempotency-Key": key}
                )
            except httpx.TransportError:
                # The request may or may not have been written: the same key tells, next time.
                self.transport_errors += 1
                response = None
            if response is not None:
                self.answers[response.status_code] += 1
                if response.status_code == 202:
                    job_id = str(response.json()["job_id"])
                    self.accepted[key] = job_id
                    if response.headers.get("idempotent-replayed") == "true":
                        self.replays += 1
                    return job_id
                if response.status_code != 503:
                    self.unexpected.append(f"{response.status_code} {response.text[:300]}")
                    return None
                if not response.headers.get("retry-after"):
                    self.missing_retry_after += 1
            if time.monotonic() >= deadline:
                self.abandoned.append(key)
                return None
            await asyncio.sleep(0.2)  # retry pacing while the API cannot take the job

    async def submit_many(
        self, count: int, *, concurrency: int = 16, seconds: float = 0.0
    ) -> list[str]:
        """``count`` jobs, ``concurrency`` requests at a time; the ids of the accepted ones."""
        limit = asyncio.Semaphore(concurrency)

        async def one() -> str | None:
            async with limit:
                return await self.submit(seconds=seconds)

        ids = await asyncio.gather(*(one() for _ in range(count)))
        return [i for i in ids if i is not None]

    async def steady(
        self,
        rate: float,
        stop: asyncio.Event,
        *,
        limit: int | None = None,
        seconds: float = 0.0,
        concurrency: int = 32,
    ) -> int:
        """Submit ``rate`` jobs a second until ``stop`` is set (or ``limit`` were started);
        return how many were started. Waits for the requests in flight before returning."""
        slots = asyncio.Semaphore(concurrency)
        tasks: set[asyncio.Task[str | None]] = set()
        started = 0
        begun = time.monotonic()

        async def one() -> str | None:
            try:
                return await self.submit(seconds=seconds)
            finally:
                slots.release()

        while not stop.is_set() and (limit is None or started < limit):
            due = begun + started / rate
            if (wait := due - time.monotonic()) > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)  # the load's pacing
                continue
            await slots.acquire()
            task = asyncio.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            started += 1
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        return started

    def summary(self) -> dict[str, Any]:
        return {
            "accepted": len(self.accepted),
            "answers": {str(k): v for k, v in sorted(self.answers.items())},
            "transport_errors": self.transport_errors,
            "replayed": self.replays,
            "missing_retry_after": self.missing_retry_after,
            "abandoned": len(self.abandoned),
            "unexpected": self.unexpected[:10],
        }


# --- the invariants -------------------------------------------------------------------------

JOBS_WITH_EFFECTS: Query[Mapping[str, Any]] = Query(
    "pipeline_jobs_with_effects",
    "Every job of a tenant with its status, attempts and how many effects it recorded.",
    """
    SELECT j.id::text AS id, j.status, j.attempts, j.last_error, j.progress_attempt,
           count(e.id) AS effects
    FROM jobcore.jobs j LEFT JOIN jobcore.job_effects e ON e.job_id = j.id
    WHERE j.tenant = %(tenant)s
    GROUP BY j.id
    """,
)

# A run whose pruner deletes finished jobs (and, by cascade, their effects) keeps the
# evidence: triggers copy every deleted job and effect into archive tables of the run's
# own database, which the check reads beside the live ones. Harness-only: never part of
# jobcore's schema.
PRUNE_ARCHIVE: tuple[Query[Mapping[str, Any]], ...] = tuple(
    Query(f"pipeline_prune_archive_{n}", "Archive what the pruner deletes, for the check.", sql)
    for n, sql in enumerate(
        (
            """
            CREATE TABLE IF NOT EXISTS public.pruned_jobs (
                id uuid PRIMARY KEY, tenant text NOT NULL, status text NOT NULL,
                attempts int NOT NULL, last_error text, progress_attempt int,
                pruned_at timestamptz NOT NULL DEFAULT now(), created_at timestamptz
            )
            """,
            """
            CREATE TABLE IF NOT EXISTS public.pruned_effects (
                id bigint PRIMARY KEY, job_id uuid NOT NULL, attempt int NOT NULL,
                kind text NOT NULL
            )
            """,
            """
            CREATE OR REPLACE FUNCTION public.pipeline_archive_job() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO public.pruned_jobs (
                    id, tenant, status, attempts, last_error, progress_attempt, created_at
                )
                VALUES (
                    OLD.id, OLD.tenant, OLD.status, OLD.attempts, OLD.last_error,
                    OLD.progress_attempt, OLD.created_at
                );
                RETURN OLD;
            END $$
            """,
            """
            CREATE OR REPLACE FUNCTION public.pipeline_archive_effect() RETURNS trigger
            LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO public.pruned_effects (id, job_id, attempt, kind)
                VALUES (OLD.id, OLD.job_id, OLD.attempt, OLD.kind);
                RETURN OLD;
            END $$
            """,
            """
            CREATE OR REPLACE TRIGGER pipeline_archive_job AFTER DELETE ON jobcore.jobs
                FOR EACH ROW EXECUTE FUNCTION public.pipeline_archive_job()
            """,
            """
            CREATE OR REPLACE TRIGGER pipeline_archive_effect AFTER DELETE ON jobcore.job_effects
                FOR EACH ROW EXECUTE FUNCTION public.pipeline_archive_effect()
            """,
        )
    )
)
HAS_PRUNE_ARCHIVE: Query[Mapping[str, Any]] = Query(
    "pipeline_has_prune_archive",
    "Whether this database archives pruned jobs.",
    "SELECT to_regclass('public.pruned_jobs') IS NOT NULL AS archived",
)
PRUNED_JOBS: Query[Mapping[str, Any]] = Query(
    "pipeline_pruned_jobs",
    "How many of a tenant's jobs the pruner deleted.",
    "SELECT count(*) AS n FROM public.pruned_jobs WHERE tenant = %(tenant)s",
)
ALL_JOBS_WITH_EFFECTS: Query[Mapping[str, Any]] = Query(
    "pipeline_all_jobs_with_effects",
    "Like pipeline_jobs_with_effects, with the pruned jobs and effects counted too.",
    """
    WITH every_job AS (
        SELECT id, status, attempts, last_error, progress_attempt
        FROM jobcore.jobs WHERE tenant = %(tenant)s
        UNION ALL
        SELECT id, status, attempts, last_error, progress_attempt
        FROM public.pruned_jobs WHERE tenant = %(tenant)s
    ), every_effect AS (
        SELECT id, job_id FROM jobcore.job_effects
        UNION ALL
        SELECT id, job_id FROM public.pruned_effects
    )
    SELECT j.id::text AS id, j.status, j.attempts, j.last_error, j.progress_attempt,
           count(e.id) AS effects
    FROM every_job j LEFT JOIN every_effect e ON e.job_id = j.id
    GROUP BY j.id, j.status, j.attempts, j.last_error, j.progress_attempt
    """,
)
OPEN_WORK: Query[Mapping[str, Any]] = Query(
    "pipeline_open_work",
    "A tenant's jobs not finished yet, and outbox rows still to publish or quarantined.",
    """
    SELECT (SELECT count(*) FROM jobcore.jobs
            WHERE tenant = %(tenant)s AND status IN ('pending', 'running')) AS open,
           (SELECT count(*) FROM jobcore.jobs WHERE tenant = %(tenant)s) AS jobs,
           (SELECT count(*) FROM jobcore.outbox WHERE quarantined_at IS NULL) AS outbox,
           (SELECT count(*) FROM jobcore.outbox WHERE quarantined_at IS NOT NULL) AS quarantined
    """,
)
STATUS_COUNTS: Query[Mapping[str, Any]] = Query(
    "pipeline_status_counts",
    "A tenant's jobs counted by status.",
    "SELECT status, count(*) AS n FROM jobcore.jobs WHERE tenant = %(tenant)s GROUP BY status",
)
OVERDUE_LEASES: Query[Mapping[str, Any]] = Query(
    "pipeline_overdue_leases",
    "Running jobs whose lease has expired, and the longest overdue (seconds).",
    """
    SELECT count(*) AS n,
           coalesce(max(extract(epoch FROM now() - lease_expires_at)), 0)::float AS overdue
    FROM jobcore.jobs WHERE status = 'running' AND lease_expires_at < now()
    """,
)
JOB_STATUS: Query[Mapping[str, Any]] = Query(
    "pipeline_job_status", "One job's status.", "SELECT status FROM jobcore.jobs WHERE id = %(id)s"
)


@dataclass
class Report:
    accepted: int
    jobs: int
    statuses: dict[str, int]
    lost: int  # accepted jobs missing, or jobs not terminal when the wait ended
    lost_examples: list[str]
    duplicate_effects: int  # jobs whose effect is in the ledger more than once
    missing_effects: int  # succeeded jobs without their effect
    stray_effects: int  # effects of jobs that did not succeed
    # Jobs that ended failed though no handler of theirs ever started: the 'effect' job
    # type reports progress first thing, which sets progress_attempt (jobs.progress_attempt).
    failed_without_handler: int
    retried: int  # jobs that took more than one attempt
    most_attempts: int
    reaped: int  # jobs whose last error says a lease expired
    outbox_left: int
    quarantined: int
    pruned: int = 0  # finished jobs the pruner deleted during the run (archived for this check)

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.duplicate_effects
            or self.missing_effects
            or self.stray_effects
            or self.failed_without_handler
            or self.quarantined
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "jobs": self.jobs,
            "succeeded": self.statuses.get("succeeded", 0),
            "failed": self.statuses.get("failed", 0),
            "cancelled": self.statuses.get("cancelled", 0),
            "lost": self.lost,
            "lost_examples": self.lost_examples,
            "duplicate_effects": self.duplicate_effects,
            "missing_effects": self.missing_effects,
            "stray_effects": self.stray_effects,
            "failed_without_handler": self.failed_without_handler,
            "retried": self.retried,
            "most_attempts": self.most_attempts,
            "reaped": self.reaped,
            "outbox_left": self.outbox_left,
            "quarantined": self.quarantined,
            "pruned": self.pruned,
        }


async def _fetch_all(
    db: Database, query: Query[Mapping[str, Any]], params: dict[str, Any]
) -> list[dict[str, Any]]:
    async with db.unit_of_work() as uow:
        return [dict(row) for row in await fetch_all(uow, query(params))]


async def check(db: Database, tenant: str, accepted: list[str]) -> Report:
    """The invariants, read from the database (the truth)."""
    [archive] = await _fetch_all(db, HAS_PRUNE_ARCHIVE, {})
    query = ALL_JOBS_WITH_EFFECTS if archive["archived"] else JOBS_WITH_EFFECTS
    rows = await _fetch_all(db, query, {"tenant": tenant})
    [work] = await _fetch_all(db, OPEN_WORK, {"tenant": tenant})
    by_id = {row["id"]: row for row in rows}
    missing = [job_id for job_id in accepted if job_id not in by_id]
    open_jobs = [row["id"] for row in rows if row["status"] not in TERMINAL]
    statuses = Counter(str(row["status"]) for row in rows)
    return Report(
        accepted=len(set(accepted)),
        jobs=len(rows),
        statuses=dict(statuses),
        lost=len(missing) + len(open_jobs),
        lost_examples=(missing + open_jobs)[:10],
        duplicate_effects=sum(1 for row in rows if row["effects"] > 1),
        missing_effects=sum(
            1 for row in rows if row["status"] == "succeeded" and row["effects"] == 0
        ),
        stray_effects=sum(1 for row in rows if row["status"] != "succeeded" and row["effects"]),
        failed_without_handler=sum(
            1 for row in rows if row["status"] == "failed" and row["progress_attempt"] is None
        ),
        retried=sum(1 for row in rows if row["attempts"] > 1),
        most_attempts=max((int(row["attempts"]) for row in rows), default=0),
        reaped=sum(1 for row in rows if row["last_error"] == "lease expired"),
        outbox_left=int(work["outbox"]),
        quarantined=int(work["quarantined"]),
        pruned=await _pruned_jobs(db, tenant) if archive["archived"] else 0,
    )


async def _pruned_jobs(db: Database, tenant: str) -> int:
    [row] = await _fetch_all(db, PRUNED_JOBS, {"tenant": tenant})
    return int(row["n"])


async def archive_pruned(db: Database) -> None:
    """From now on keep a copy of every job and effect the pruner deletes (see
    :data:`PRUNE_ARCHIVE`), so :func:`check` still sees them."""
    async with db.unit_of_work() as uow:
        for statement in PRUNE_ARCHIVE:
            await execute(uow, statement({}))
        await uow.commit()


async def status_counts(db: Database, tenant: str) -> dict[str, int]:
    rows = await _fetch_all(db, STATUS_COUNTS, {"tenant": tenant})
    return {str(row["status"]): int(row["n"]) for row in rows}


async def wait_quiescent(db: Database, tenant: str, *, timeout: float) -> float:
    """Until no job of ``tenant`` is open and the outbox is empty (or ``timeout`` passed);
    return the seconds waited. Survives the database being away meanwhile."""
    started = time.monotonic()
    deadline = started + timeout
    while time.monotonic() < deadline:
        try:
            [work] = await _fetch_all(db, OPEN_WORK, {"tenant": tenant})
            if work["open"] == 0 and work["outbox"] == 0:
                break
        except DatabaseUnavailable:
            pass
        await asyncio.sleep(0.2)  # the poll interval, bounded by the deadline
    return time.monotonic() - started


async def job_succeeded(db: Database, job_id: str) -> bool:
    try:
        rows = await _fetch_all(db, JOB_STATUS, {"id": uuid.UUID(job_id)})
    except DatabaseUnavailable:
        return False
    return bool(rows) and rows[0]["status"] == "succeeded"


async def time_to_recover(
    db: Database, submitter: Submitter, *, timeout: float = 120.0
) -> float | None:
    """Seconds until a job submitted now has succeeded end to end (None: not within
    ``timeout``). Includes waiting for the API to accept it and for any backlog ahead."""
    started = time.monotonic()
    job_id = await submitter.submit()
    if job_id is None:
        return None
    while time.monotonic() - started < timeout:
        if await job_succeeded(db, job_id):
            return time.monotonic() - started
        await asyncio.sleep(0.1)  # the poll interval, bounded by the timeout
    return None


class LeaseWatch:
    """Samples, every ``interval`` seconds, how long any job has been ``running`` past its
    lease; :attr:`worst` is the longest seen (the reaper should keep it near its interval).

    It stops on an event, not by cancellation: on Python 3.11 a cancellation that lands as
    an ``asyncio.wait_for`` inside the pool completes can be lost, and a task awaited after
    ``cancel()`` would then be waited for forever.
    """

    def __init__(self, db: Database, interval: float = 0.5) -> None:
        self.db = db
        self.interval = interval
        self.worst = 0.0
        self.samples = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LeaseWatch:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._task is not None:
            # One sample is bounded by the pool's and the statement's timeouts.
            _, late = await asyncio.wait({self._task}, timeout=self.interval + 60)
            for task in late:
                task.cancel()

    async def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(DatabaseUnavailable):
                [row] = await _fetch_all(self.db, OVERDUE_LEASES, {})
                self.samples += 1
                self.worst = max(self.worst, float(row["overdue"]))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval)  # the sampling period


# --- stopping the shared services ---------------------------------------------------------------


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=120)


@contextlib.contextmanager
def _broker_stopped_unlocked() -> Iterator[None]:
    try:
        _run("rabbitmqctl", "-q", "stop_app")
        chaos.wait_for_port(5672, up=False)
        yield
    finally:
        chaos.start_broker()


@contextlib.contextmanager
def _postgres_stopped_unlocked() -> Iterator[None]:
    try:
        _run(
            "pg_ctlcluster",
            "--skip-systemctl-redirect",
            chaos.pg_cluster(),
            "main",
            "stop",
            "--",
            "-m",
            "fast",
        )
        chaos.wait_for_port(5432, up=False)
        yield
    finally:
        chaos.start_postgres()


@contextlib.asynccontextmanager
async def _in_thread(manager: contextlib.AbstractContextManager[None]) -> AsyncIterator[None]:
    # Stopping and starting take seconds; the event loop keeps submitting meanwhile.
    await asyncio.to_thread(manager.__enter__)
    try:
        yield
    finally:
        await asyncio.to_thread(manager.__exit__, None, None, None)


def broker_down(*, locked: bool = False) -> contextlib.AbstractAsyncContextManager[None]:
    """RabbitMQ stopped (``rabbitmqctl stop_app``) for the block, started again whatever
    happens. ``locked``: the caller already holds the disruption lock."""
    return _in_thread(_broker_stopped_unlocked() if locked else chaos.broker_stopped())


def postgres_down(*, locked: bool = False) -> contextlib.AbstractAsyncContextManager[None]:
    """PostgreSQL stopped for the block, started again whatever happens."""
    return _in_thread(_postgres_stopped_unlocked() if locked else chaos.postgres_stopped())


def services_restored() -> None:
    """Start RabbitMQ and PostgreSQL if they are not running (idempotent; for `finally`)."""
    chaos.start_postgres()
    chaos.start_broker()


def environment_for_children() -> dict[str, str]:
    """This process's environment without JOBCORE_* (the stack sets its own)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("JOBCORE_")}
