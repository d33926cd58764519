"""ordered: the throughput cost of ordering keys, against the same jobs unordered.

One stack (an API, one relay, one worker, as OS processes, production settings). Each run
enqueues ``jobs`` no-op jobs straight into the database (8 connections), waits until all
succeeded, and reports jobs/s = jobs / (last finished_at − first created_at): first
without an ordering key (the baseline), then spread over ``KEYS`` ordering keys. An
ordered job starts only once the one before it in its key has finished and the gate
releaser (every JOBCORE_GATE_RELEASE_INTERVAL) has published it again, so each key is a
chain of jobs with a release round and a relay and worker hop between links; the keys run
side by side.
"""

from __future__ import annotations

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.examples.jobtypes import NoopPayload
from jobcore.execution.registry import load_job_modules
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue
from services.bench.harness import Bench, Options
from services.bench.http import run_clients
from services.bench.report import Figure, Section
from services.bench.scenarios.e2e import db_now, run_stats, wait_done

TITLE = "Ordering keys: throughput against unordered jobs"
CONNECTIONS = 8
KEYS = 100


def steps(options: Options) -> int:
    return 2 * options.runs


async def enqueue_noops(db: Database, topology: Topology, total: int, *, keys: int) -> None:
    """``total`` no-op jobs; with ``keys``, job i goes to ordering key i mod keys."""
    noop = load_job_modules(("jobcore.examples.jobtypes",)).get("noop")
    numbers = iter(range(total))

    async def one(_: None) -> bool:
        n = next(numbers)
        async with db.unit_of_work() as uow:
            await enqueue(
                uow,
                topology,
                EnqueueRequest(
                    tenant="bench",
                    job_type=noop,
                    payload=NoopPayload(),
                    ordering_key=f"key-{n % keys}" if keys else None,
                ),
            )
            await uow.commit()
        return True

    async def no_state() -> None:
        return None

    await run_clients(CONNECTIONS, total, no_state, one)


async def run(bench: Bench) -> Section:
    options = bench.options
    n = options.jobs
    section = Section(
        "ordered",
        TITLE,
        f"{n:,} no-op jobs per run enqueued straight into the database ({CONNECTIONS} "
        f"connections) while one relay and one worker run: unordered (the baseline), then "
        f"over {KEYS} ordering keys ({n // KEYS} jobs a key); jobs/s from the first "
        f"created_at to the last finished_at; {options.runs} runs each.",
    )
    results: dict[str, list[float]] = {"unordered": [], "ordered": []}
    async with bench.scratch("ordered") as config:
        topology = Topology.from_settings(config)
        db = Database(config, min_size=CONNECTIONS, max_size=CONNECTIONS, name="bench-ordered")
        await db.open(wait=True)
        try:
            async with bench.stack(config, "ordered", relays=1, workers=1) as stack:
                since = await db_now(db)
                await enqueue_noops(db, topology, 100, keys=0)  # warm-up
                await wait_done(db, since, 100, stack.processes, 120)
                for run_number in range(options.runs):
                    for case, keys in (("unordered", 0), ("ordered", KEYS)):
                        bench.step(f"ordered: {case}, run {run_number + 1}")
                        since = await db_now(db)
                        await enqueue_noops(db, topology, n, keys=keys)
                        await wait_done(db, since, n, stack.processes, 1200)
                        stats = await run_stats(db, since)
                        results[case].append(round(stats["jobs"] / float(stats["seconds"]), 1))
        finally:
            await db.close()
    section.add(Figure("unordered", "jobs/s", results["unordered"]))
    section.add(
        Figure(
            f"{KEYS} ordering keys",
            "jobs/s",
            results["ordered"],
            "unordered",
            results["unordered"],
        )
    )
    return section
