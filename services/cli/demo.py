"""`jobcore demo`: the whole system on this machine, with a broker outage in the middle.

Starts the API, a relay and a worker (like `jobcore dev`), with the relay and the worker
reaching RabbitMQ through a proxy the demo controls. It submits a mixed workload over
HTTP, cuts the broker connection for a few seconds while it keeps submitting (enqueue
still answers 202), shows jobs moving through their states, and ends with a summary.
It exits 0 when every job reached the state it should.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import typer
from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from jobcore.client import AsyncClient, JobStatus, WaitTimeout
from jobcore.database.gateway import Database
from jobcore.database.store import job_store
from jobcore.kernel.settings import Settings
from jobcore.testing.tcpproxy import Mode, TcpProxy
from services.cli.common import example, settings
from services.cli.dev import (
    create_key,
    free_port,
    prepare_database,
    start_stack,
    wait_until_ready,
)

STATUSES = ("pending", "running", "succeeded", "failed", "cancelled")
OUTAGE_SECONDS = 4.0
WAIT_SECONDS = 120.0


@dataclass
class Submission:
    type: str
    payload: dict[str, Any]
    expected: str
    job_id: str | None = None


def workload() -> tuple[list[Submission], list[Submission]]:
    """Two halves: one before the outage, one submitted while the broker is unreachable."""
    halves: tuple[list[Submission], list[Submission]] = ([], [])
    for i in range(24):
        half = halves[i % 2]
        half.append(Submission("export_csv", {"rows": 200 + i, "seed": i}, "succeeded"))
        half.append(
            Submission(
                "send_email",
                {"to": f"user{i}@example.com", "subject": f"Your receipt #{i}"},
                "succeeded",
            )
        )
    for i in range(4):
        halves[i % 2].append(Submission("flaky", {"succeed_on_attempt": 2 + i % 2}, "succeeded"))
    for i in range(2):
        halves[i % 2].append(Submission("doomed", {"reason": f"card declined ({i})"}, "failed"))
    return halves


class Demo:
    def __init__(self, config: Settings, console: Console) -> None:
        self.config = config
        self.console = console
        self.tenant = f"demo-{uuid.uuid4().hex[:8]}"
        self.submissions: list[Submission] = []
        self.status_line = "starting"
        self.accepted_during_outage = 0
        self.replayed_same_id = False

    # -- HTTP (through jobcore.client) ---------------------------------------------------
    async def submit(self, client: AsyncClient, item: Submission) -> None:
        accepted = await client.enqueue(item.type, item.payload)
        item.job_id = str(accepted.job_id)
        self.submissions.append(item)

    async def submit_all(self, client: AsyncClient, items: list[Submission]) -> None:
        limit = asyncio.Semaphore(8)

        async def one(item: Submission) -> None:
            async with limit:
                await self.submit(client, item)

        await asyncio.gather(*(one(item) for item in items))

    async def idempotent_replay(self, client: AsyncClient) -> None:
        payload = {"to": "ada@example.com", "subject": "Welcome"}
        key = f"welcome-{self.tenant}"
        first = await client.enqueue("send_email", payload, idempotency_key=key)
        again = await client.enqueue("send_email", payload, idempotency_key=key)
        self.replayed_same_id = first.job_id == again.job_id and again.replayed
        self.submissions.append(Submission("send_email", payload, "succeeded", str(first.job_id)))

    async def cancel_a_running_job(self, client: AsyncClient) -> None:
        item = Submission("slow", {"seconds": 120}, "cancelled")
        await self.submit(client, item)
        assert item.job_id is not None
        deadline = time.monotonic() + 30
        while (await client.get(item.job_id)).status != JobStatus.RUNNING:
            if time.monotonic() > deadline:
                raise RuntimeError("the slow job never started running")
            await asyncio.sleep(0.1)  # poll interval, bounded by the deadline
        await client.cancel(item.job_id)

    async def wait_all(self, client: AsyncClient, timeout: float) -> bool:
        """Long-poll every job until it ends; False if one had not after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        # Under the tenant's cap on parked long-polls (100 by default).
        parked = asyncio.Semaphore(50)

        async def one(job_id: str) -> bool:
            async with parked:
                try:
                    await client.wait(job_id, timeout=max(0.0, deadline - time.monotonic()))
                except WaitTimeout:
                    return False
                return True

        ids = [s.job_id for s in self.submissions if s.job_id is not None]
        return all(await asyncio.gather(*(one(job_id) for job_id in ids)))

    # -- display ---------------------------------------------------------------------
    async def counts(self, db: Database) -> dict[str, dict[str, int]]:
        async with db.unit_of_work() as uow:
            rows = await job_store.count_by_type_and_status(uow, {"tenant": self.tenant})
        table: dict[str, dict[str, int]] = {}
        for row in rows:
            table.setdefault(row["type"], {})[row["status"]] = row["n"]
        return table

    def render(self, counts: dict[str, dict[str, int]]) -> Group:
        table = Table(title=f"jobs of tenant {self.tenant}", expand=False)
        table.add_column("type")
        for status in STATUSES:
            table.add_column(status, justify="right")
        total = done = 0
        for job_type in sorted(counts):
            row = counts[job_type]
            table.add_row(job_type, *(str(row.get(s, 0)) for s in STATUSES))
            total += sum(row.values())
            done += sum(row.get(s, 0) for s in ("succeeded", "failed", "cancelled"))
        bar = ProgressBar(total=max(total, 1), completed=done, width=50)
        line = Text(f"{done}/{total} finished — {self.status_line}")
        return Group(table, bar, line)

    async def show_until_done(self, db: Database, stop: asyncio.Event) -> None:
        if self.console.is_terminal:
            with Live(self.render({}), console=self.console, refresh_per_second=8) as live:
                while not stop.is_set():
                    live.update(self.render(await self.counts(db)))
                    await asyncio.sleep(0.15)  # display refresh
                live.update(self.render(await self.counts(db)))
        else:
            while not stop.is_set():
                await asyncio.sleep(1.0)  # display refresh
                counts = await self.counts(db)
                flat = {s: sum(c.get(s, 0) for c in counts.values()) for s in STATUSES}
                self.console.print(
                    f"{self.status_line}: " + ", ".join(f"{k} {v}" for k, v in flat.items())
                )


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def proxied_url(amqp_url: str, port: int) -> str:
    parts = urlsplit(amqp_url)
    netloc = re.sub(r"@?[^@]*$", "", parts.netloc)
    netloc = f"{netloc}@127.0.0.1:{port}" if netloc else f"127.0.0.1:{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


async def _demo(config: Settings, console: Console, log_path: Path) -> int:
    # The demo cuts one broker connection through its proxy: the first broker of a list.
    first_broker = config.amqp_urls[0]
    amqp = urlsplit(first_broker)
    proxy = TcpProxy(amqp.hostname or "127.0.0.1", amqp.port or 5672)
    await proxy.start()
    api_port, relay_port, worker_port = free_port(), free_port(), free_port()
    supervisor = start_stack(
        config,
        api_port=api_port,
        relay_health_port=relay_port,
        worker_health_port=worker_port,
        env={
            "JOBCORE_JOB_MODULES": "jobcore.examples.jobtypes,jobcore.examples.demo",
            "JOBCORE_RETRY_BACKOFF_BASE": "0.3",
            "JOBCORE_RETRY_BACKOFF_CAP": "2",
            "JOBCORE_SHUTDOWN_GRACE": "3",
            # Reconnect within a second of the broker coming back, not after a long backoff.
            "JOBCORE_RELAY_RECONNECT_MAX_DELAY": "1",
        },
        broker_env={"JOBCORE_AMQP_URL": proxied_url(first_broker, proxy.port)},
    )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = log_path.open("w")
    supervisor.out = log_file
    supervisor.colour = False
    demo = Demo(config, console)
    db = Database(config, min_size=0, max_size=2, name="jobcore-demo")
    await db.open(wait=True)
    await supervisor.start()
    stop_display = asyncio.Event()
    display: asyncio.Task[None] | None = None
    started = time.monotonic()
    try:
        url = f"http://127.0.0.1:{api_port}"
        await wait_until_ready(url, supervisor)
        key = await create_key(config, demo.tenant, "jobcore demo")
        console.print(f"API at {url}, logs in {log_path}")
        display = asyncio.create_task(demo.show_until_done(db, stop_display))
        first, second = workload()
        async with AsyncClient(url, key) as client:
            demo.status_line = "submitting the first half"
            await demo.submit_all(client, first)
            await demo.idempotent_replay(client)
            demo.status_line = "cancelling a running job"
            await demo.cancel_a_running_job(client)

            demo.status_line = "broker connection CUT: submitting the second half"
            proxy.set_mode(Mode.REFUSE)
            await demo.submit_all(client, second)
            demo.accepted_during_outage = len(second)
            demo.status_line = (
                f"broker connection CUT: {len(second)} jobs still accepted with 202; "
                "they wait in the outbox"
            )
            await asyncio.sleep(OUTAGE_SECONDS)  # the outage the demo is about
            proxy.set_mode(Mode.FORWARD)
            demo.status_line = "broker connection restored: the relay drains the outbox"

            # Every job, by long-poll (one parked request per job, no polling loop).
            if await demo.wait_all(client, WAIT_SECONDS):
                demo.status_line = "all jobs finished"
            else:
                demo.status_line = f"gave up waiting after {WAIT_SECONDS:.0f} s"
        stop_display.set()
        await display
        async with httpx.AsyncClient(timeout=5) as client:
            metrics = (await client.get(f"http://127.0.0.1:{worker_port}/metrics")).text
        return await summarise(demo, db, metrics, time.monotonic() - started)
    finally:
        stop_display.set()
        if display is not None and not display.done():
            display.cancel()
        await supervisor.stop()
        log_file.close()
        await proxy.stop()
        await db.close()


async def summarise(demo: Demo, db: Database, worker_metrics: str, elapsed: float) -> int:
    console = demo.console
    async with db.unit_of_work() as uow:
        rows = await job_store.timings(uow, {"tenant": demo.tenant})
    by_id = {str(row["id"]): row for row in rows}
    wrong = [
        f"{s.type} {s.job_id}: {by_id[s.job_id]['status'] if s.job_id in by_id else 'missing'}"
        f" (expected {s.expected})"
        for s in demo.submissions
        if s.job_id not in by_id or by_id[s.job_id]["status"] != s.expected
    ]
    counts = {status: sum(1 for r in rows if r["status"] == status) for status in STATUSES}
    finish = [float(r["to_finish"]) for r in rows if r["status"] == "succeeded"]
    start = [float(r["to_start"]) for r in rows if r["to_start"] is not None]
    retries = sum(max(0, r["attempts"] - 1) for r in rows)
    summary = Table(title="summary", show_header=False)
    summary.add_row("jobs", str(len(rows)))
    for status in STATUSES:
        summary.add_row(status, str(counts[status]))
    summary.add_row("accepted (202) while the broker was cut", str(demo.accepted_during_outage))
    summary.add_row(
        "idempotent replay returned the same job", "yes" if demo.replayed_same_id else "NO"
    )
    summary.add_row("retries", str(retries))
    summary.add_row(
        "dedupe hits (duplicate deliveries ignored)",
        str(int(_metric(worker_metrics, "jobcore_worker_duplicate_messages_total"))),
    )
    summary.add_row(
        "enqueue → start p50 / p95 (s)", f"{_pct(start, 0.5):.3f} / {_pct(start, 0.95):.3f}"
    )
    slowest = max(finish, default=float("nan"))
    summary.add_row(
        "enqueue → succeeded p50 / p95 / max (s)",
        f"{_pct(finish, 0.5):.3f} / {_pct(finish, 0.95):.3f} / {slowest:.3f}",
    )
    summary.add_row("wall time (s)", f"{elapsed:.1f}")
    console.print(summary)
    if wrong or not demo.replayed_same_id:
        for line in wrong[:20]:
            console.print(f"[red]wrong final state[/red]: {line}")
        console.print("[red]demo FAILED[/red]")
        return 1
    console.print("[green]demo OK[/green]: every job reached the state it should")
    return 0


def demo(
    log: Path = typer.Option(Path("var/demo/stack.log"), help="Where the processes' logs go."),
) -> None:
    """Run the whole system with a mixed workload and a broker outage in the middle."""
    config = settings()
    prepare_database(config)
    console = Console()
    sys.exit(asyncio.run(_demo(config, console, log)))


def register(app: typer.Typer) -> None:
    app.command("demo", epilog=example("jobcore demo --log var/demo/stack.log"))(demo)
