"""scale: end-to-end throughput with 1, 2 and 4 relays and as many workers.

For each size a stack of one API, N relays and N workers runs as separate processes; each
run enqueues ``jobs`` no-op jobs straight into the database (job + outbox row, one
transaction each, 8 connections, as fast as they go) and waits until all succeeded:
jobs/s = jobs / (last finished_at − first created_at). Jobs go in through the database,
not the API, because one API process on this machine accepts fewer jobs per second than
one relay and one worker run: through it every size would measure the API. The baseline
is the first size's runs, so the ratio is the scaling.

The sizes are interleaved (a round runs each size once, on a stack of its own), so a
machine shared with other work loads every size alike. jobs/s still moves with that
load; CPU-seconds per job does much less, so each run also reports, per job: the CPU of
the relays, the workers, the enqueuing bench, this database's PostgreSQL backends (the
bench's enqueue connections included; WAL writer and checkpointer left out, they serve
every database) and the whole RabbitMQ node (shared with anything else using it: left
out of the total), and
the transactions this database committed per job (read after a pause: PostgreSQL
flushes an idle backend's statistics late). CPU per job that stays flat as N grows
means the replicas scale and the cores are the ceiling; CPU per job that grows with N is
jobcore's own overhead (docs/scaling.md).
"""

from __future__ import annotations

import asyncio
import os
import statistics

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.kernel.settings import RelayOptions, Settings
from services.bench.harness import Bench, Options, analyze, pids
from services.bench.measure import CpuMeter, merge_cpu
from services.bench.report import Figure, Section, Series
from services.bench.scenarios.e2e import db_now, run_stats, wait_done
from services.bench.scenarios.enqueue import raw_transactions

TITLE = "Throughput with more relays and workers"
CONNECTIONS = 8
# The stacks run the maintenance and polling intervals a deployment has by default, not
# the fault harness's (jobcore.testing.pipeline.FAST_ENV: a reaper ten times as often,
# relays polling five times as often, so that fault tests recover within seconds): N - 1
# standby relays and workers pay those intervals whatever the load, so the harness's
# values would charge the larger sizes for a test setting (docs/bench/measurements.md,
# "Idle stacks in the scale scenario").
PRODUCTION_INTERVALS = {
    "JOBCORE_WORKER_REAPER_INTERVAL": str(Settings.model_fields["worker_reaper_interval"].default),
    "JOBCORE_RELAY_POLL_INTERVAL": str(RelayOptions.model_fields["poll_interval"].default),
}
# The process groups whose CPU per job is reported (the API process idles: left out).
GROUPS = ("relays", "workers", "bench", "postgres", "rabbitmq")
# Those of them that serve this scenario alone: the total CPU per job leaves out the
# RabbitMQ node, whose CPU is whatever else uses the node too (reported on its own).
OWN = ("relays", "workers", "bench", "postgres")


def steps(options: Options) -> int:
    return len(options.scale) * options.runs


async def backend_pids(db: Database) -> list[int]:
    """The PostgreSQL backends serving the scenario's database (every client's)."""
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        )
        rows = await cur.fetchall()
    return [int(row["pid"]) for row in rows]


# An idle backend flushes its statistics up to 10 s late (PostgreSQL 15): the commit
# counts are read after this pause, and only for runs long enough to be worth it.
STATS_SETTLE = 11.0
COUNT_TRANSACTIONS_FROM = 500


async def committed(db: Database) -> int:
    """Transactions committed in the scenario's database so far, once settled."""
    await asyncio.sleep(STATS_SETTLE)  # the statistics' flush delay, not a synchronisation
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT pg_stat_force_next_flush(), xact_commit FROM pg_stat_database"
            " WHERE datname = current_database()"
        )
        row = await cur.fetchone()
    assert row is not None
    return int(row["xact_commit"])


async def run(bench: Bench) -> Section:
    options = bench.options
    n = options.jobs
    section = Section(
        "scale",
        TITLE,
        f"{n:,} no-op jobs per run enqueued straight into the database ({CONNECTIONS} "
        f"connections) while N relays and N workers run, N in {list(options.scale)}; jobs/s "
        f"from the first created_at to the last finished_at; baseline: N = "
        f"{options.scale[0]}; {options.runs} rounds, each running every size once on a "
        "fresh stack (interleaved), at the default reaper and relay poll intervals. CPU-ms "
        "per job per process group, and transactions per "
        f"job (runs of {COUNT_TRANSACTIONS_FROM:,}+ jobs), are in the details.",
    )
    by_size: dict[int, list[float]] = {size: [] for size in options.scale}
    cpu_ms: dict[int, list[float]] = {size: [] for size in options.scale}
    per_job: dict[int, list[dict[str, float]]] = {size: [] for size in options.scale}
    cpu: dict[int, list[dict[str, float]]] = {size: [] for size in options.scale}
    loads: dict[int, list[float]] = {size: [] for size in options.scale}
    async with bench.scratch("scale") as config:
        topology = Topology.from_settings(config)
        # Generic plans, as the API's pool has: the enqueue statement planned anew for
        # each job cost PostgreSQL more than the statement itself.
        db = Database(
            config,
            min_size=CONNECTIONS,
            max_size=CONNECTIONS,
            name="bench-scale",
            generic_plans=True,
        )
        await db.open(wait=True)
        try:
            for round_number in range(options.runs):
                last = round_number == options.runs - 1
                for size in options.scale:
                    bench.step(f"scale: {size} + {size}, round {round_number + 1}")
                    async with bench.stack(
                        config,
                        f"scale-{size}-{round_number + 1}",
                        relays=size,
                        workers=size,
                        env=PRODUCTION_INTERVALS,
                    ) as stack:
                        since = await db_now(db)
                        await raw_transactions(db, topology, CONNECTIONS, 100)  # warm-up
                        await wait_done(db, since, 100, stack.processes, 120)
                        if round_number == 0 and size == options.scale[0]:
                            await analyze(config)
                        processes = pids(stack)
                        # The groups' pids, read by the meter at start and stop (the
                        # backends' list grows by whatever connected during the run).
                        members = {
                            "relays": [p for name, p in processes.items() if "relay" in name],
                            "workers": [p for name, p in processes.items() if "worker" in name],
                            "postgres": await backend_pids(db),
                        }
                        meter = CpuMeter(groups={g: members[g].copy for g in members})
                        counting = n >= COUNT_TRANSACTIONS_FROM
                        xacts = await committed(db) if counting else 0
                        loads[size].append(round(os.getloadavg()[0], 2))
                        since = await db_now(db)
                        async with bench.profiled(section, f"{size}x", processes if last else {}):
                            meter.start()
                            await raw_transactions(db, topology, CONNECTIONS, n)
                            await wait_done(db, since, n, stack.processes, 600)
                            members["postgres"].extend(
                                set(await backend_pids(db)) - set(members["postgres"])
                            )
                            pct = meter.stop()
                        stats = await run_stats(db, since)
                        xacts = await committed(db) - xacts if counting else 0
                    by_size[size].append(round(stats["jobs"] / float(stats["seconds"]), 1))
                    cpu[size].append(pct)
                    used = {g: 1000 * meter.seconds.get(g, 0.0) / n for g in GROUPS}
                    if counting:
                        used["transactions"] = xacts / n
                    per_job[size].append(used)
                    cpu_ms[size].append(round(sum(used[g] for g in OWN), 3))
        finally:
            await db.close()
    first = options.scale[0]
    for size in options.scale:
        label = f"{size} relays + {size} workers"
        section.cpu_pct[label] = merge_cpu(cpu[size])
        section.add(
            Figure(
                label,
                "jobs/s",
                by_size[size],
                f"{first} + {first}" if size != first else None,
                by_size[first] if size != first else [],
            )
        )
        section.add(
            Figure(
                f"{label}: CPU per job, own processes",
                "CPU-ms/job",
                cpu_ms[size],
                f"{first} + {first}" if size != first else None,
                cpu_ms[first] if size != first else [],
                better="lower",
            )
        )
    # JSON object keys: the sizes as text.
    section.details["per_job_median"] = {
        str(size): {
            key: round(statistics.median(run[key] for run in runs), 3)
            for key in (*GROUPS, "transactions")
            if all(key in run for run in runs)
        }
        for size, runs in per_job.items()
    }
    section.details["per_job_runs"] = {
        str(size): [{k: round(v, 3) for k, v in run.items()} for run in runs]
        for size, runs in per_job.items()
    }
    section.details["load_average_1m_at_run_start"] = {str(s): v for s, v in loads.items()}
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
    section.series.append(
        Series(
            "CPU-ms per job, relays + workers + enqueuer + PostgreSQL (median)",
            [float(s) for s in sizes],
            [statistics.median(cpu_ms[s]) for s in sizes],
            "relays = workers",
            "CPU-ms/job",
        )
    )
    return section
