"""What completion webhooks and long-poll wake-ups cost the worker's success statement.

Every statement that ends a job now also carries two CTEs (the delivery row and its
outbox message, for jobs with a callback URL) and a ``pg_notify`` per job (long-poll
waiters). This measures the worker's batched success statement (run through
:class:`jobcore.database.store.JobStore`, as the worker runs it) two ways, in interleaved rounds on
one connection, in autocommit:

1. ``no_callback``: on jobs without a callback URL (the common case);
2. ``callback``: on jobs with one (a delivery + an outbox row each).

A connection LISTENs on ``jobcore_job_done`` throughout (as an API process does) and
drains what it hears. Figures are jobs/s per phase and the ratio of ``callback`` to
``no_callback``; each round prepares fresh running jobs, untimed. A fresh database is
dropped afterwards. (The statement as it was before webhooks, once kept here as a
baseline, is gone: a copy of a statement drifts from the one that runs.)

    .venv/bin/python -m bench.terminal --batch 50 --jobs 5000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

import orjson
import psycopg
from psycopg.rows import dict_row

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import AsyncConn
from jobcore.database.store import CompletionParams, job_store
from jobcore.execution.completion_webhooks import completion_params
from jobcore.kernel.settings import Settings, load_settings
from jobcore.testing.scratch import database_url, scratch

PREPARE_JOBS = """
INSERT INTO jobcore.jobs (id, tenant, type, queue, status, attempts, lease_token, lease_expires_at,
                  started_at, callback_url)
SELECT id, 'bench', 'noop', 'default', 'running', 1, id, now() + interval '1 hour', now(),
       %(callback_url)s
FROM unnest(%(ids)s::uuid[]) AS id
"""

PHASES = ("no_callback", "callback")


async def listen(settings: Settings, heard: list[int], stop: asyncio.Event) -> None:
    async with await psycopg.AsyncConnection.connect(
        settings.database_url, autocommit=True
    ) as conn:
        await job_store.listen_done(conn)
        while not stop.is_set():
            async for _ in conn.notifies(timeout=0.2):
                heard[0] += 1


async def phase(
    conn: AsyncConn, name: str, jobs: int, batch: int, extra: CompletionParams
) -> float:
    """Seconds to succeed ``jobs`` fresh running jobs, ``batch`` per statement."""
    ids = [uuid.uuid4() for _ in range(jobs)]
    callback = "https://example.com/hook" if name == "callback" else None
    await conn.execute(PREPARE_JOBS, {"ids": ids, "callback_url": callback})
    started = time.perf_counter()
    for i in range(0, jobs, batch):
        chunk = ids[i : i + batch]
        await job_store.succeed_many(
            conn,
            {
                **extra,
                "ids": chunk,
                "lease_tokens": chunk,
                "results": [None] * len(chunk),
                "result_refs": [None] * len(chunk),
                "effects": "[]",
            },
        )
    return time.perf_counter() - started


async def run(args: argparse.Namespace) -> dict[str, Any]:
    base = load_settings()
    run_id = uuid.uuid4().hex[:10]
    async with scratch(
        load_settings(
            database_url=database_url(base.database_url, f"jobcore_bench_terminal_{run_id}"),
            amqp_prefix=f"bench.terminal.{run_id}",
        )
    ) as settings:
        extra = completion_params(Topology.from_settings(settings), settings)
        heard = [0]
        stop = asyncio.Event()
        listener = asyncio.create_task(listen(settings, heard, stop))
        seconds: dict[str, list[float]] = {name: [] for name in PHASES}
        async with await psycopg.AsyncConnection.connect(
            settings.database_url, autocommit=True, row_factory=dict_row
        ) as conn:
            await phase(conn, "no_callback", min(args.jobs, 500), args.batch, extra)  # warm-up
            for _ in range(args.rounds):
                for name in PHASES:
                    seconds[name].append(await phase(conn, name, args.jobs, args.batch, extra))
            cur = await conn.execute(
                "SELECT (SELECT count(*) FROM jobcore.webhook_deliveries) AS deliveries,"
                " (SELECT count(*) FROM jobcore.outbox WHERE message_type = 'webhook') AS messages"
            )
            written = await cur.fetchone()
        stop.set()
        await listener
    rates = {name: args.jobs / statistics.median(values) for name, values in seconds.items()}
    return {
        "batch": args.batch,
        "jobs_per_round": args.jobs,
        "rounds": args.rounds,
        **{f"{name}_jobs_per_s": round(rate) for name, rate in rates.items()},
        "callback_vs_no_callback": round(rates["callback"] / rates["no_callback"], 3),
        "notifications_heard": heard[0],
        "deliveries_written": written["deliveries"] if written else None,
        "webhook_messages_written": written["messages"] if written else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.terminal", description=__doc__.split("\n\n")[0] if __doc__ else ""
    )
    parser.add_argument("--jobs", type=int, default=3000, help="jobs per phase per round")
    parser.add_argument("--batch", type=int, default=50, help="jobs per success statement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    args = parser.parse_args(argv)
    results = asyncio.run(run(args))
    print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
    print(
        f"terminal statement, batch {results['batch']}: no callback "
        f"{results['no_callback_jobs_per_s']} jobs/s; with callback "
        f"{results['callback_jobs_per_s']} ({results['callback_vs_no_callback']}x)"
    )


if __name__ == "__main__":
    main()
