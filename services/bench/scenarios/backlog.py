"""backlog: a relay draining 1,000,000 pending outbox rows; does the cost grow with it?

The outbox is filled with ``backlog_rows`` rows (in chunks, untimed) before a relay runs.
The claim statement the relay runs (outbox_claim_fair, batch-sized, FOR UPDATE SKIP LOCKED)
is timed from a separate connection (JIT off, as on the relay's), in a transaction rolled
back at once: 10 times on the full backlog, then about every second while one relay drains
it (it then skips the relay's locked rows, as a second replica would). The drained rows are
read ten times a second as the distance from the first row's id to the oldest row still
there, and the queue is purged as it goes so the broker holds only a little. Figures: the
drain rate over the last 10 % of the rows against the first 10 %, and the claim time near
the end against near the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import statistics
import time
from typing import Any

import aio_pika
import psycopg

from jobcore.amqp.connection import connect as connect_broker
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import NO_JIT
from jobcore.database.store import outbox_store
from jobcore.kernel.priorities import WEIGHTS
from jobcore.kernel.settings import RelayOptions
from services.bench.harness import UNLIMITED_QUEUES, Bench, Options, pids, relays_ready
from services.bench.measure import cpu_of, merge_cpu
from services.bench.report import Figure, Section, Series
from services.bench.scenarios.relay import QUEUE, fill_outbox, purge

TITLE = "Draining a large outbox backlog"
FILL_CHUNK = 100_000
EDGE = 0.10  # the share of rows at each end whose drain rate is compared
# The drain front is one index probe, read often so the rate at the very end (where the
# last sample interval ends with the outbox empty) is not smeared over a whole second.
SAMPLE_SECONDS = 0.1
CLAIM_EVERY = 10  # samples: a claim timing and a queue purge about every second


def steps(options: Options) -> int:
    return -(-options.backlog_rows // FILL_CHUNK) + 1


async def claim_ms(conn: psycopg.AsyncConnection[Any], limit: int) -> float:
    """One claim on its own transaction, rolled back: its time in milliseconds."""
    started = time.perf_counter()
    async with conn.transaction(force_rollback=True):
        await outbox_store.claim_fair(
            conn,
            {
                "routing_keys": [QUEUE],
                "budgets": [limit],
                "other_budget": limit,
                "limit": limit,
                "priorities": [int(p) for p in WEIGHTS],
                "weights": list(WEIGHTS.values()),
                # The relay's window reaches its low-water mark, the oldest backlog row.
                "window": 1e9,
            },
        )
    return 1000 * (time.perf_counter() - started)


# The relay claims the oldest due rows first (outbox_due_idx: available_at, id) and the
# fill gives later chunks later ids and timestamps, so every row before the first one
# still there has been published and deleted: the drained count without counting rows.
FRONT = """
SELECT id FROM jobcore.outbox WHERE available_at <= now() AND quarantined_at IS NULL
ORDER BY available_at, id LIMIT 1
"""


async def front(conn: psycopg.AsyncConnection[Any]) -> int | None:
    """The id of the oldest row still in the outbox; None once it is empty."""
    cur = await conn.execute(FRONT)
    row = await cur.fetchone()
    return int(row[0]) if row else None


def crossing(points: list[tuple[float, int]], target: float) -> float:
    """The time at which the drained count reached ``target`` (linear between samples)."""
    if target <= points[0][1]:
        return points[0][0]
    for (t0, d0), (t1, d1) in itertools.pairwise(points):
        if d0 <= target <= d1:
            return t0 if d1 == d0 else t0 + (t1 - t0) * (target - d0) / (d1 - d0)
    return points[-1][0]


def edge_rates(points: list[tuple[float, int]], total: int) -> tuple[float, float]:
    """Rows/s over the first and the last ``EDGE`` of the rows. The relay starts draining
    before the first sample, so the first window starts at the first sample."""
    edge = EDGE * total
    first = points[0][1]
    start = edge / max(1e-9, crossing(points, first + edge) - crossing(points, first))
    end = edge / max(1e-9, crossing(points, total) - crossing(points, total - edge))
    return start, end


async def run(bench: Bench) -> Section:
    rows = bench.options.backlog_rows
    async with bench.scratch("backlog") as config:
        limit = RelayOptions().batch_size
        section = Section(
            "backlog",
            TITLE,
            f"{rows:,} outbox rows drained by one relay; the claim statement (limit {limit}) "
            f"timed from another connection on the full backlog and every second during the "
            f"drain; the drain rate over the first and the last {EDGE:.0%} of the rows. One "
            f"drain (the min–max are over the claim samples).",
        )
        topology = Topology.from_settings(config)
        async with await psycopg.AsyncConnection.connect(
            config.database_url, autocommit=True
        ) as conn:
            # As the relay's connections are (jobcore.database.gateway): a claim timed with JIT
            # would time LLVM compiling the statement, which the relay never does.
            await conn.execute(NO_JIT)
            for start in range(0, rows, FILL_CHUNK):
                bench.step(f"backlog: filling {start + FILL_CHUNK:,} of {rows:,}")
                await fill_outbox(conn, topology, min(FILL_CHUNK, rows - start))
            await conn.execute("ANALYZE jobcore.outbox")
            full = [await claim_ms(conn, limit) for _ in range(10)]
            first = await front(conn)
            assert first is not None
            bench.step(f"backlog: draining {rows:,} rows")
            async with bench.stack(
                config, "backlog", relays=1, workers=0, api=False, env=UNLIMITED_QUEUES
            ) as stack:
                await relays_ready(stack)
                relay_pids = pids(stack)
                points: list[tuple[float, int]] = []
                claims: list[tuple[int, float]] = []
                used: dict[str, float] = {}
                started = time.monotonic()
                connection = await connect_broker(config)
                try:
                    channel = await connection.channel()
                    async with bench.profiled(section, "drain", relay_pids):
                        with cpu_of(relay_pids, used):
                            while True:
                                oldest = await front(conn)
                                drained = rows if oldest is None else oldest - first
                                points.append((time.monotonic() - started, drained))
                                if drained >= rows:
                                    break
                                if time.monotonic() - started > 1800:
                                    raise RuntimeError(f"{drained:,} of {rows:,} drained in 30 min")
                                if len(points) % CLAIM_EVERY == 1:
                                    claim = await claim_ms(conn, limit)
                                    claims.append((rows - drained, claim))
                                    with contextlib.suppress(aio_pika.exceptions.AMQPError):
                                        await purge(channel, topology)
                                await asyncio.sleep(SAMPLE_SECONDS)
                finally:
                    await connection.close()
    start_rate, end_rate = edge_rates(points, rows)
    near_start = [ms for left, ms in claims if left >= (1 - EDGE) * rows] or full
    near_end = [ms for left, ms in claims if left <= EDGE * rows] or near_start
    section.add(
        Figure(
            f"{rows:,} rows",
            "rows/s, last 10 %",
            [round(end_rate, 1)],
            "first 10 %",
            [round(start_rate, 1)],
        )
    )
    section.add(Figure(f"{rows:,} rows", "rows/s, whole drain", [round(rows / points[-1][0], 1)]))
    section.add(
        Figure(
            "claim, relay draining",
            "ms, last 10 %",
            [round(x, 2) for x in near_end],
            "first 10 %",
            [round(x, 2) for x in near_start],
            better="lower",
        )
    )
    section.add(
        Figure("claim, full backlog idle", "ms", [round(x, 2) for x in full], better="lower")
    )
    section.cpu_pct = {"drain": merge_cpu([used])}
    section.series.append(
        Series(
            "rows left",
            [t for t, _ in points],
            [rows - d for _, d in points],
            "seconds",
            "outbox rows left",
        )
    )
    section.series.append(
        Series(
            "one claim (limit = batch size)",
            [float(left) for left, _ in claims],
            [ms for _, ms in claims],
            "outbox rows left",
            "claim ms",
        )
    )
    section.details.update(
        queue=QUEUE,
        claim_samples=[{"rows_left": left, "ms": round(ms, 2)} for left, ms in claims],
        drain_seconds=round(points[-1][0], 1),
        claim_ms_full_median=round(statistics.median(full), 2),
    )
    return section
