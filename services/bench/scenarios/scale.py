"""scale: end-to-end throughput with 1, 2 and 4 relays and as many workers.

For each size a stack of one API, N relays and N workers runs as separate processes; each
run enqueues ``jobs`` no-op jobs straight into the database (job + outbox row, one
transaction each, 8 connections, as fast as they go) and waits until all succeeded:
jobs/s = jobs / (last finished_at − first created_at). Jobs go in through the database,
not the API, because one API process on this machine accepts fewer jobs per second than
one relay and one worker run: through it every size would measure the API. The baseline
is the first size's runs, so the ratio is the scaling.
"""

from __future__ import annotations

import statistics

from jobcore.amqp.topology import Topology
from jobcore.db import Database
from services.bench.harness import Bench, Options, pids
from services.bench.measure import cpu_of, merge_cpu
from services.bench.report import Figure, Section, Series
from services.bench.scenarios.e2e import db_now, run_stats, wait_done
from services.bench.scenarios.enqueue import raw_transactions

TITLE = "Throughput with more relays and workers"
CONNECTIONS = 8


def steps(options: Options) -> int:
    return len(options.scale) * options.runs


async def run(bench: Bench) -> Section:
    options = bench.options
    n = options.jobs
    section = Section(
        "scale",
        TITLE,
        f"{n:,} no-op jobs per run enqueued straight into the database ({CONNECTIONS} "
        f"connections) while N relays and N workers run, N in {list(options.scale)}; jobs/s "
        f"from the first created_at to the last finished_at; baseline: N = "
        f"{options.scale[0]}; {options.runs} runs per size.",
    )
    by_size: dict[int, list[float]] = {}
    async with bench.scratch("scale") as config:
        topology = Topology(config.amqp_prefix, config.amqp_delivery_limit)
        db = Database(config, min_size=CONNECTIONS, max_size=CONNECTIONS, name="bench-scale")
        await db.open(wait=True)
        try:
            for size in options.scale:
                cpu: list[dict[str, float]] = []
                async with bench.stack(config, f"scale-{size}", relays=size, workers=size) as stack:
                    since = await db_now(db)
                    await raw_transactions(db, topology, CONNECTIONS, 100)  # warm-up
                    await wait_done(db, since, 100, stack.processes, 120)
                    by_size[size] = []
                    for run_number in range(options.runs):
                        bench.step(f"scale: {size} + {size}, run {run_number + 1}")
                        since = await db_now(db)
                        used: dict[str, float] = {}
                        last = run_number == options.runs - 1
                        async with bench.profiled(section, f"{size}x", pids(stack) if last else {}):
                            with cpu_of(pids(stack), used):
                                await raw_transactions(db, topology, CONNECTIONS, n)
                                await wait_done(db, since, n, stack.processes, 600)
                        cpu.append(used)
                        stats = await run_stats(db, since)
                        by_size[size].append(round(stats["jobs"] / float(stats["seconds"]), 1))
                section.cpu_pct[f"{size} relays + {size} workers"] = merge_cpu(cpu)
        finally:
            await db.close()
    first = options.scale[0]
    for size, runs in by_size.items():
        section.add(
            Figure(
                f"{size} relays + {size} workers",
                "jobs/s",
                runs,
                f"{first} + {first}" if size != first else None,
                by_size[first] if size != first else [],
            )
        )
    sizes = sorted(by_size)
    section.series.append(
        Series(
            "jobs/s (median)",
            [float(s) for s in sizes],
            [statistics.median(by_size[s]) for s in sizes],
            "relays = workers",
            "jobs/s",
        )
    )
    return section
