"""enqueue: HTTP enqueue requests/s and latency at 1, 16 and 64 concurrent clients.

Baselines, in the same run and interleaved with it: the raw job + outbox insert
transaction (jobcore.enqueue.enqueue in a unit of work, from this process, on a pool the
API's size) and a no-op POST served by the same API process (uvicorn, FastAPI, body
reading, an orjson answer; no authentication, no database).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from functools import partial

from jobcore.amqp.topology import Topology
from jobcore.db import Database
from jobcore.enqueue import enqueue
from jobcore.jobtypes import NoopPayload
from jobcore.registry import load_job_modules
from services.bench.harness import Bench, Options, pids
from services.bench.http import http_load, post, run_clients
from services.bench.measure import cpu_of, merge_cpu, percentile
from services.bench.report import Figure, Section

TITLE = "HTTP enqueue vs the raw insert transaction and a no-op POST"


def requests_at(options: Options, clients: int) -> int:
    """Fewer requests at low concurrency, where each waits for the one before it."""
    return max(100, options.jobs * min(clients, 16) // 16)


def steps(options: Options) -> int:
    return len(options.clients) * options.runs


async def raw_transactions(
    db: Database, topology: Topology, clients: int, total: int
) -> tuple[list[float], float, int]:
    noop = load_job_modules(("jobcore.jobtypes",)).get("noop")

    async def one(_: None) -> bool:
        async with db.unit_of_work() as uow:
            await enqueue(uow, topology, tenant="raw", job_type=noop, payload=NoopPayload())
            await uow.commit()
        return True

    async def no_state() -> None:
        return None

    return await run_clients(clients, total, no_state, one)


async def run(bench: Bench) -> Section:
    options = bench.options
    section = Section(
        "enqueue",
        TITLE,
        f"`POST /jobs/noop` with an API key over keep-alive connections "
        f"({options.jobs} requests per phase at 16+ clients, proportionally fewer below), "
        f"against the raw transaction on a pool of the API's size and a no-op POST on the "
        f"same API process; {options.runs} interleaved runs per concurrency.",
    )
    async with (
        bench.scratch("enqueue") as config,
        bench.stack(config, "enqueue", relays=0, workers=0) as stack,
    ):
        topology = Topology(config.amqp_prefix, config.amqp_delivery_limit)
        db = Database(
            config, min_size=config.db_pool_max, max_size=config.db_pool_max, name="bench-raw"
        )
        await db.open(wait=True)
        port = stack.api_port
        noop_request = post(port, "/bench/noop", b"{}")
        enqueue_request = post(
            port, "/jobs/noop", b"{}", {"Authorization": f"Bearer {stack.api_key}"}
        )
        try:
            # Warm-up: connections, the pool, the first requests' imports.
            await http_load(port, noop_request, 16, 200)
            await http_load(port, enqueue_request, 16, 200)
            await raw_transactions(db, topology, 16, 200)
            for clients in options.clients:
                total = requests_at(options, clients)
                rates: dict[str, list[float]] = defaultdict(list)
                lat: dict[str, list[float]] = defaultdict(list)
                cpu: dict[str, list[dict[str, float]]] = defaultdict(list)
                for run_number in range(options.runs):
                    bench.step(f"enqueue: {clients} clients, run {run_number + 1}")
                    phases = {
                        "raw txn": partial(raw_transactions, db, topology, clients, total),
                        "no-op POST": partial(http_load, port, noop_request, clients, total),
                        "enqueue": partial(http_load, port, enqueue_request, clients, total),
                    }
                    last = run_number == options.runs - 1 and clients == max(options.clients)
                    for phase, action in phases.items():
                        used: dict[str, float] = {}
                        profile = last and phase == "enqueue"
                        async with bench.profiled(
                            section, f"{clients}c", pids(stack) if profile else {}
                        ):
                            with cpu_of({"api": stack.api.pid} if stack.api else {}, used):
                                latencies, seconds, errors = await action()
                        if errors:
                            raise RuntimeError(f"{phase}: {errors} of {total} requests failed")
                        rates[phase].append(round(len(latencies) / seconds, 1))
                        lat[f"{phase} p50"].append(round(1000 * statistics.median(latencies), 2))
                        lat[f"{phase} p99"].append(round(1000 * percentile(latencies, 99), 2))
                        cpu[phase].append(used)
                case = f"{clients} clients"
                section.add(
                    Figure(
                        case, "requests/s", rates["enqueue"], "raw job+outbox txn", rates["raw txn"]
                    )
                )
                section.add(
                    Figure(case, "requests/s", rates["enqueue"], "no-op POST", rates["no-op POST"])
                )
                for q in ("p50", "p99"):
                    section.add(
                        Figure(
                            case,
                            f"{q} ms",
                            lat[f"enqueue {q}"],
                            f"no-op POST {q}",
                            lat[f"no-op POST {q}"],
                            better="lower",
                        )
                    )
                for phase, samples in cpu.items():
                    section.cpu_pct[f"{case}, {phase}"] = merge_cpu(samples)
        finally:
            await db.close()
    return section
