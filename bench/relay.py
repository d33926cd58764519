"""Relay throughput and idle latency, next to raw publishing in the same run.

1. Baselines: the same messages published straight from this process with pipelined
   publisher confirms (aio-pika ``exchange.publish``, and aiormq one layer below it),
   ``--window`` messages in flight, to the same quorum queue.
2. Relay: one ``jobcore relay`` process, idle and ready; the outbox is filled with
   ``--rows`` rows in one statement and the clock runs from that commit until the outbox
   is empty (every row confirmed and deleted).
3. Idle latency: single jobs enqueued with ``jobcore.enqueue.enqueue`` while the relay
   idles; the time from each commit until this process consumes the message.

CPU seconds per process (this one, the relay, RabbitMQ, PostgreSQL) are read from /proc
around each phase, to show where the time goes. Everything runs against a fresh database
and a fresh broker prefix, removed afterwards.

    .venv/bin/python -m bench.relay --rows 100000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import aio_pika
import orjson
import psycopg
from pamqp.commands import Basic
from psycopg import sql

from jobcore import migrate
from jobcore.amqp.topology import Topology
from jobcore.db import Database
from jobcore.enqueue import OUTBOX_CHANNEL, enqueue
from jobcore.envelope import JobMessage
from jobcore.jobtypes import NoopPayload
from jobcore.registry import load_job_modules
from jobcore.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "default"  # the queue of the `noop` job type
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TICKS = os.sysconf("SC_CLK_TCK")


# -- CPU accounting ----------------------------------------------------------------------


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def _pids_named(name: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


class CpuMeter:
    """CPU used by a few process groups between start() and stop(), as % of one core.

    Approximate for PostgreSQL: a backend that ends during the phase is not counted."""

    def __init__(self, relay_pid: int | None = None) -> None:
        self.groups: dict[str, list[int]] = {
            "bench": [os.getpid()],
            "rabbitmq": _pids_named("beam.smp"),
            "postgres": _pids_named("postgres"),
        }
        if relay_pid is not None:
            self.groups["relay"] = [relay_pid]

    def _sample(self) -> dict[int, float]:
        return {pid: _cpu_seconds(pid) for pids in self.groups.values() for pid in pids}

    def start(self) -> None:
        self._start = self._sample()
        self._t0 = time.monotonic()

    def stop(self) -> dict[str, float]:
        end, wall = self._sample(), time.monotonic() - self._t0
        used = {
            name: sum(max(0.0, end[p] - self._start[p]) for p in pids if end[p] > 0)
            for name, pids in self.groups.items()
        }
        return {f"{name}_cpu_pct": round(100 * cpu / wall, 1) for name, cpu in used.items()}


# -- fixtures: a fresh database and broker prefix ---------------------------------------------


@contextmanager
def bench_settings(base: Settings) -> Iterator[Settings]:
    suffix = uuid.uuid4().hex[:10]
    url = base.database_url.rsplit("/", 1)[0] + f"/jobcore_bench_relay_{suffix}"
    settings = base.model_copy(
        update={"database_url": url, "amqp_prefix": f"bench.{suffix}", "relay_health_port": 0}
    )
    migrate.create_database(settings)
    try:
        migrate.upgrade(settings)
        yield settings
    finally:
        with psycopg.connect(settings.maintenance_database_url(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(settings.database_name)
                )
            )


def outbox_rows(topology: Topology, n: int) -> list[dict[str, Any]]:
    return [
        {
            "message_id": str(uuid.uuid4()),
            "body": JobMessage(job_id=uuid.uuid4(), attempt=1, type="noop").encode(),
        }
        for _ in range(n)
    ]


# -- baselines ---------------------------------------------------------------------------


async def raw_aio_pika(
    channel: aio_pika.abc.AbstractChannel,
    exchange: str,
    messages: list[dict[str, Any]],
    window: int,
) -> float:
    target = await channel.get_exchange(exchange, ensure=False)
    headers = {"traceparent": TRACEPARENT, "x-envelope-version": 1}
    started = time.perf_counter()
    for i in range(0, len(messages), window):
        await asyncio.gather(
            *(
                target.publish(
                    aio_pika.Message(
                        m["body"],
                        message_id=m["message_id"],
                        type="noop",
                        content_type="application/json",
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        headers=headers,
                    ),
                    QUEUE,
                    mandatory=True,
                )
                for m in messages[i : i + window]
            )
        )
    return time.perf_counter() - started


async def raw_aiormq(
    channel: aio_pika.abc.AbstractChannel,
    exchange: str,
    messages: list[dict[str, Any]],
    window: int,
) -> float:
    raw = await channel.get_underlay_channel()
    headers = {"traceparent": TRACEPARENT, "x-envelope-version": 1}
    started = time.perf_counter()
    for i in range(0, len(messages), window):
        await asyncio.gather(
            *(
                raw.basic_publish(
                    m["body"],
                    exchange=exchange,
                    routing_key=QUEUE,
                    properties=Basic.Properties(
                        content_type="application/json",
                        delivery_mode=2,
                        message_id=m["message_id"],
                        message_type="noop",
                        headers=headers,
                    ),
                    mandatory=True,
                )
                for m in messages[i : i + window]
            )
        )
    return time.perf_counter() - started


async def purge(channel: aio_pika.abc.AbstractChannel, topology: Topology) -> None:
    queue = await channel.declare_queue(topology.queue_name(QUEUE), passive=True)
    await queue.purge()


# -- the relay -----------------------------------------------------------------------------


def relay_env(settings: Settings, args: argparse.Namespace) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBCORE_")}
    env.update(
        {
            "JOBCORE_DATABASE_URL": settings.database_url,
            "JOBCORE_AMQP_URL": settings.amqp_url,
            "JOBCORE_AMQP_PREFIX": settings.amqp_prefix,
            "JOBCORE_RELAY_HEALTH_PORT": "0",
            "JOBCORE_RELAY_BATCH_SIZE": str(args.batch_size),
            "JOBCORE_RELAY_LANES": str(args.lanes),
            "PYTHONPATH": str(ROOT),
        }
    )
    return env


async def wait_ready(log_path: Path, proc: asyncio.subprocess.Process, timeout: float = 30) -> None:
    """Until the relay logged that the broker is connected (and it is still running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = await asyncio.to_thread(log_path.read_bytes)
        if proc.returncode is not None:
            raise RuntimeError(f"relay exited early:\n{text.decode()}")
        if b'"broker connected"' in text:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"relay not ready after {timeout}s")


FILL_SQL = """
INSERT INTO outbox (message_id, exchange, routing_key, message_type, headers, body)
SELECT gen_random_uuid(), %(exchange)s, %(queue)s, 'noop', %(headers)s::jsonb,
       convert_to('{"v":1,"job_id":"' || gen_random_uuid() || '","attempt":1,"type":"noop"}',
                  'UTF8')
FROM generate_series(1, %(n)s)
"""


async def relay_drain(
    settings: Settings, topology: Topology, rows: int, proc_pid: int, poll: float
) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(settings.database_url, autocommit=True) as c:
        meter = CpuMeter(proc_pid)
        async with c.transaction():
            await c.execute(
                FILL_SQL,
                {
                    "exchange": topology.jobs_exchange,
                    "queue": QUEUE,
                    "headers": orjson.dumps({"traceparent": TRACEPARENT}).decode(),
                    "n": rows,
                },
            )
            await c.execute("SELECT pg_notify(%s, '')", (OUTBOX_CHANNEL,))
        started = time.perf_counter()
        meter.start()
        while True:
            cur = await c.execute("SELECT EXISTS (SELECT 1 FROM outbox)")
            row = await cur.fetchone()
            if row is not None and not row[0]:
                break
            await asyncio.sleep(poll)
        seconds = time.perf_counter() - started
        return {"seconds": seconds, **meter.stop()}


async def idle_latency(
    settings: Settings, topology: Topology, channel: aio_pika.abc.AbstractChannel, samples: int
) -> list[float]:
    registry = load_job_modules(settings.job_modules)
    noop = registry.get("noop")
    queue = await channel.declare_queue(topology.queue_name(QUEUE), passive=True)
    arrived: dict[str, float] = {}
    got = asyncio.Event()

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        arrived[orjson.loads(message.body)["job_id"]] = time.perf_counter()
        got.set()
        await message.ack()

    tag = await queue.consume(on_message)
    latencies = []
    db = Database(settings, min_size=1, max_size=1, name="bench-enqueue")
    await db.open(wait=True)
    try:
        for _ in range(samples):
            got.clear()
            async with db.unit_of_work() as uow:
                result = await enqueue(
                    uow, topology, tenant="bench", job_type=noop, payload=NoopPayload()
                )
                await uow.commit()
            committed = time.perf_counter()
            key = str(result.job_id)
            while key not in arrived:
                await asyncio.wait_for(got.wait(), timeout=10)
                got.clear()
            latencies.append(arrived[key] - committed)
            await asyncio.sleep(0.01)  # let the relay go idle again: that is what is measured
    finally:
        await queue.cancel(tag)
        await db.close()
    return latencies


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def _median_phase(rounds: list[dict[str, Any]], rows: int) -> dict[str, Any]:
    """The round with the median rate, plus every round's rate."""
    ordered = sorted(rounds, key=lambda r: r["seconds"])
    middle = ordered[len(ordered) // 2]
    return {
        "msgs_per_s": round(rows / middle["seconds"]),
        "rounds_msgs_per_s": [round(rows / r["seconds"]) for r in rounds],
        **{k: round(v, 3) for k, v in middle.items()},
    }


async def run(args: argparse.Namespace, log: IO[bytes]) -> dict[str, Any]:
    base = load_settings()
    with bench_settings(base) as settings:
        topology = Topology(settings.amqp_prefix, settings.amqp_delivery_limit)
        queues = load_job_modules(settings.job_modules).queues()
        connection = await aio_pika.connect(settings.amqp_url)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "services.cli",
            "relay",
            env=relay_env(settings, args),
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        results: dict[str, Any] = {"load_average_at_start": os.getloadavg()}
        try:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            await topology.declare(channel, queues)
            messages = outbox_rows(topology, args.rows)
            window = args.window or args.batch_size * args.lanes
            await wait_ready(Path(log.name), proc)

            # Interleaved rounds: a neighbour's load hits every phase alike, not just one.
            phases: dict[str, list[dict[str, Any]]] = {
                "raw_aio_pika": [],
                "raw_aiormq": [],
                "relay": [],
            }
            delivered = []
            for _ in range(args.rounds):
                for name, publish in (("raw_aio_pika", raw_aio_pika), ("raw_aiormq", raw_aiormq)):
                    meter = CpuMeter()
                    meter.start()
                    seconds = await publish(channel, topology.jobs_exchange, messages, window)
                    phases[name].append({"seconds": seconds, **meter.stop()})
                    await purge(channel, topology)
                phases["relay"].append(
                    await relay_drain(settings, topology, args.rows, proc.pid, args.poll)
                )
                queue = await channel.declare_queue(topology.queue_name(QUEUE), passive=True)
                delivered.append(queue.declaration_result.message_count)
                await purge(channel, topology)

            results.update(
                {
                    "rows": args.rows,
                    "rounds": args.rounds,
                    "baseline_window": window,
                    "relay_batch_size": args.batch_size,
                    "relay_lanes": args.lanes,
                    **{name: _median_phase(rounds, args.rows) for name, rounds in phases.items()},
                    # Messages the queue held after each relay round (at least `rows`).
                    "relay_queue_messages": delivered,
                }
            )
            for name in ("raw_aio_pika", "raw_aiormq"):
                results[f"ratio_vs_{name}"] = round(
                    results["relay"]["msgs_per_s"] / results[name]["msgs_per_s"], 3
                )

            latencies = await idle_latency(settings, topology, channel, args.samples)
            results["idle_latency_ms"] = {
                "samples": len(latencies),
                "p50": round(1000 * statistics.median(latencies), 2),
                "p99": round(1000 * percentile(latencies, 99), 2),
                "max": round(1000 * max(latencies), 2),
            }
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    results["relay_exit_code"] = await asyncio.wait_for(proc.wait(), 30)
                except TimeoutError:
                    proc.kill()
                    results["relay_exit_code"] = await proc.wait()
            cleanup = await connection.channel()
            await topology.delete(cleanup, queues)
            await connection.close()
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.relay", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rows", type=int, default=10_000, help="messages per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--batch-size", type=int, default=500, help="relay batch size")
    parser.add_argument("--lanes", type=int, default=2, help="relay lanes (batches in flight)")
    parser.add_argument(
        "--window", type=int, default=0, help="baseline publishes in flight (default batch x lanes)"
    )
    parser.add_argument("--samples", type=int, default=200, help="idle latency samples")
    parser.add_argument("--poll", type=float, default=0.01, help="seconds between drain checks")
    parser.add_argument("--log", default="/tmp/jobcore-bench-relay.log", help="relay log file")
    args = parser.parse_args(argv)
    with open(args.log, "wb") as log:
        results = asyncio.run(run(args, log))
    print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
    lat = results["idle_latency_ms"]
    print(
        f"relay {results['relay']['msgs_per_s']} msg/s = "
        f"{results['ratio_vs_raw_aio_pika']:.2f}x raw aio-pika "
        f"({results['raw_aio_pika']['msgs_per_s']} msg/s), "
        f"{results['ratio_vs_raw_aiormq']:.2f}x raw aiormq "
        f"({results['raw_aiormq']['msgs_per_s']} msg/s); "
        f"idle enqueue->consumed p50 {lat['p50']} ms, p99 {lat['p99']} ms"
    )


if __name__ == "__main__":
    main()
