"""batch: jobs/s through `POST /jobs/noop/batch` against single `POST /jobs/noop` requests.

Both on the same API process in the same run, interleaved: the single-request rate as the
enqueue scenario measures it (keep-alive clients, one job a request), and batches of
``--batch-size`` no-op jobs (1,000 by default) from a few clients. The ratio is jobs/s
through batches over jobs/s through single requests; every batch answer is checked to
have created all of its items.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from functools import partial

import orjson

from services.bench.harness import Bench, Options, pids
from services.bench.http import Connection, http_load, post, run_clients
from services.bench.measure import cpu_of, merge_cpu, percentile
from services.bench.report import Figure, Section

TITLE = "Batch enqueue vs single enqueue requests"
# Single requests in flight at once: where the enqueue scenario saturates the API process.
SINGLE_CLIENTS = 16
# Batches in flight at once: enough to overlap one batch's database work with the next
# one's parsing, few enough not to queue on the tenant's usage row (batches of one tenant
# take turns there, as single enqueues do).
BATCH_CLIENTS = 2
# Batches per run at least, so a run lasts long enough to measure.
MIN_BATCHES = 20


def steps(options: Options) -> int:
    return options.runs


def batches(options: Options) -> int:
    return max(MIN_BATCHES, options.jobs // options.batch_size)


async def batch_load(
    port: int, request: bytes, size: int, clients: int, total: int
) -> tuple[list[float], float, int]:
    """``total`` batch requests over ``clients`` connections; failed: any answer that is not
    200 with every item created."""
    created = f'"created":{size},'.encode()

    async def one(conn: Connection) -> bool:
        status, body = await conn.send(request)
        return status == 200 and created in body

    return await run_clients(clients, total, lambda: Connection.open(port), one, Connection.close)


async def run(bench: Bench) -> Section:
    options = bench.options
    size = options.batch_size
    total_batches = batches(options)
    section = Section(
        "batch",
        TITLE,
        f"`POST /jobs/noop/batch` with {size} items a request ({total_batches} requests per "
        f"run, {BATCH_CLIENTS} clients) against `POST /jobs/noop` ({options.jobs} requests "
        f"per run, {SINGLE_CLIENTS} clients), on the same API process, {options.runs} "
        "interleaved runs; jobs/s is jobs created per second of wall time.",
    )
    async with (
        bench.scratch("batch") as config,
        bench.stack(config, "batch", relays=0, workers=0) as stack,
    ):
        port = stack.api_port
        auth = {"Authorization": f"Bearer {stack.api_key}"}
        single_request = post(port, "/jobs/noop", b"{}", auth)
        body = orjson.dumps({"items": [{"payload": {}}] * size})
        batch_request = post(port, "/jobs/noop/batch", body, auth)
        # Warm-up: connections, the pool, the first requests' imports and plans.
        await http_load(port, single_request, SINGLE_CLIENTS, 200)
        await batch_load(port, batch_request, size, BATCH_CLIENTS, 4)
        rates: dict[str, list[float]] = defaultdict(list)
        latency: dict[str, list[float]] = defaultdict(list)
        cpu: dict[str, list[dict[str, float]]] = defaultdict(list)
        for run_number in range(options.runs):
            bench.step(f"batch: run {run_number + 1}")
            phases = {
                "single": (
                    partial(http_load, port, single_request, SINGLE_CLIENTS, options.jobs),
                    1,
                ),
                "batch": (
                    partial(batch_load, port, batch_request, size, BATCH_CLIENTS, total_batches),
                    size,
                ),
            }
            for phase, (action, jobs_per_request) in phases.items():
                used: dict[str, float] = {}
                profile = run_number == options.runs - 1 and phase == "batch"
                async with bench.profiled(section, phase, pids(stack) if profile else {}):
                    with cpu_of({"api": stack.api.pid} if stack.api else {}, used):
                        latencies, seconds, errors = await action()
                if errors:
                    raise RuntimeError(f"{phase}: {errors} of {len(latencies)} requests failed")
                rates[phase].append(round(len(latencies) * jobs_per_request / seconds, 1))
                latency[phase].append(round(1000 * statistics.median(latencies), 2))
                latency[f"{phase} p99"].append(round(1000 * percentile(latencies, 99), 2))
                cpu[phase].append(used)
        section.add(
            Figure(
                f"{size} items/request, {BATCH_CLIENTS} clients",
                "jobs/s",
                rates["batch"],
                f"single POST, {SINGLE_CLIENTS} clients",
                rates["single"],
            )
        )
        section.add(
            Figure(
                f"{size} items/request",
                "request p50 ms",
                latency["batch"],
                "single POST p50",
                latency["single"],
                better="lower",
            )
        )
        section.add(
            Figure(
                f"{size} items/request",
                "request p99 ms",
                latency["batch p99"],
                "single POST p99",
                latency["single p99"],
                better="lower",
            )
        )
        for phase, samples in cpu.items():
            section.cpu_pct[phase] = merge_cpu(samples)
    return section
