"""Buffers per call of the hot statements while a transaction pins the xmin horizon, as
the dead rows behind it pile up: ``.venv/bin/python scripts/horizon_buffers.py``.

Deterministic, with no timing in what it measures: on a scratch database cloned from the
migrated template (the server of ``JOBCORE_DATABASE_URL``), one connection holds a
REPEATABLE READ snapshot and an XID for the whole run, so nothing written after it can be
vacuumed away. Then, for each N in ``--steps``, N more jobs go through the statements the
services run (batch enqueue with the tenant's usage lock, the relay's delete of published
rows, the worker's inbox row, claim and success as status updates), and after a pause
longer than the relay's look period a steady slice of ``--steady`` jobs goes through the
same way (the traffic of the last seconds), a few rows are left due and a few leases
expired. Each hot statement is then run as the pools run it (a generic plan, prepared
once) under EXPLAIN (ANALYZE, BUFFERS) in a transaction rolled back, and its shared
buffers (hit + read) are printed per N: a statement whose cost follows the dead rows
grows down its column; one bounded by a low-water mark stays flat.

Every ``--drained-every``-th batch of the bulk goes to a second tenant, left with no live
row: the fair claim's lane lookup has a lane of dead entries only to step over. The fair
claim and the FIFO claim are measured with the relay's window and unbounded (its full
look); a tree whose statements take no window runs them unbounded both times.

The relay's and the reaper's marks are computed by their own code (services.relay.
low_water, jobcore.maintenance.reaper) when the tree has them, so the same script measures
the design before and after. Also prints the hot tables' bytes and dead tuples grown per
job pushed behind the pin.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jobcore.database.schema import HOT_TABLES
from jobcore.database.sql import Query, native_placeholders
from jobcore.database.sql import outbox as outbox_sql
from jobcore.database.sql.jobs import enqueue as enqueue_sql
from jobcore.database.sql.jobs import recovery
from jobcore.database.sql.tenant_quotas import TENANT_USAGE_LOCK
from jobcore.kernel.priorities import WEIGHTS
from jobcore.kernel.settings import load_settings
from jobcore.testing import scratch

TENANT = "pinned"
# The script's own statements name jobcore's tables without their schema.
SEARCH_PATH = "-c search_path=jobcore"
BATCH = 100
# The tenant's rate limit (jobs/s; 0: none). A rate-limited tenant's usage row takes a
# version per admission (its rate_tat): --rate shows what that costs behind the pin.
RATE = {"per_second": 0.0}
# Every so many batches of the bulk go to this tenant (--drained-every; 0: none), whose
# rows are all published: a lane with only dead entries behind the pin.
DRAINED_TENANT = "drained"
DRAINED = {"every": 4}
# The relay's claims a second while pinned in the full pressure run (25,725 in 600 s).
CLAIMS_PER_SECOND = 43.0
# The relay's bounded claim and its looks as the code in this tree makes them.
try:  # the low-water mark
    from services.relay import low_water as relay_low_water
except ImportError:  # pragma: no cover - the design before it
    relay_low_water = None  # type: ignore[assignment]
from jobcore.maintenance import reaper as reaper_module  # noqa: E402
from services.relay import relay as relay_module  # noqa: E402


def batch_params(n: int, *, run_at: Any = None, tenant: str = TENANT) -> dict[str, Any]:
    ids = [uuid.uuid4() for _ in range(n)]
    return {
        "ns": list(range(n)),
        "ids": ids,
        "idempotency_keys": [None] * n,
        "fingerprints": ["f"] * n,
        "payloads": [Jsonb({"n": i}) for i in range(n)],
        "entity_ids": [None] * n,
        "max_attempts": [3] * n,
        "run_ats": [run_at] * n,
        "unique_keys": [None] * n,
        "message_ids": [uuid.uuid4() for _ in range(n)],
        "bodies": [b'{"type":"noop","attempt":1}'] * n,
        "concurrency_keys": [None] * n,
        "rate_keys": [None] * n,
        "priorities": [0] * n,
        "callback_urls": [None] * n,
        "traceparents": [None] * n,
        "tracestates": [None] * n,
        "headers": [Jsonb({}) for _ in range(n)],
        "event_details": [Jsonb({}) for _ in range(n)],
        "tenant": tenant,
        "type": "noop",
        "queue": "default",
        "routing_key": "default",
        "exchange": "jobcore.jobs",
        "channel": "jobcore_outbox",
        "notify": False,
        "key_id": None,
        "concurrency_limit": None,
        "rate_per_second": None,
        "rate_burst": None,
        "ordering_blocks": False,
        "default_rate": RATE["per_second"],
        "default_burst": max(1, int(RATE["per_second"])),
        "default_max_unfinished": 0,
        "default_max_long_polls": 0,
        "batch_id": None,
    }


def enqueue(conn: psycopg.Connection[Any], n: int, tenant: str = TENANT) -> list[uuid.UUID]:
    params = batch_params(n, tenant=tenant)
    with conn.transaction():
        conn.execute(TENANT_USAGE_LOCK.sql, {"tenant": tenant})
        conn.execute(enqueue_sql.JOB_INSERT_MANY.sql, params)
    return list(params["ids"])


def publish(conn: psycopg.Connection[Any], job_ids: list[uuid.UUID]) -> None:
    """The relay's part for these jobs' rows: deleted as confirmed, with their events."""
    with conn.transaction():
        ids = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM outbox WHERE job_id = ANY(%s) FOR UPDATE", (job_ids,)
            ).fetchall()
        ]
        conn.execute(outbox_sql.OUTBOX_DELETE_PUBLISHED.sql, {"ids": ids, "relay": "script"})


def run(conn: psycopg.Connection[Any], job_ids: list[uuid.UUID], *, finish: bool = True) -> None:
    """The worker's part: the message's inbox row, the claim (a lease), the success."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO inbox (consumer, message_id) SELECT 'worker', gen_random_uuid() "
            "FROM unnest(%s::uuid[])",
            (job_ids,),
        )
        conn.execute(
            "UPDATE jobs SET status = 'running', attempts = attempts + 1, started_at = now(),"
            " lease_token = gen_random_uuid(), lease_expires_at = now(),"
            " worker_id = 'script', updated_at = now() WHERE id = ANY(%s)",
            (job_ids,),
        )
    if finish:
        with conn.transaction():
            conn.execute(
                "UPDATE jobs SET status = 'succeeded', finished_at = now(), result = '{}',"
                " lease_token = NULL, lease_expires_at = NULL, updated_at = now()"
                " WHERE id = ANY(%s)",
                (job_ids,),
            )


def push(conn: psycopg.Connection[Any], jobs: int) -> None:
    for start in range(0, jobs, BATCH):
        # Every so many batches go to a tenant whose lane is left with no live row: the
        # fair claim's lane lookup must step over it.
        every = DRAINED["every"]
        tenant = DRAINED_TENANT if every and (start // BATCH) % every == every - 1 else TENANT
        ids = enqueue(conn, min(BATCH, jobs - start), tenant)
        publish(conn, ids)
        run(conn, ids)


def explain(url: str, query: Query[Any], params: dict[str, Any], before: str = "") -> int:
    """Shared buffers (hit + read) of one call, run as the pools run it, rolled back."""
    sql, names = native_placeholders(query.sql)
    with psycopg.connect(url, cursor_factory=psycopg.ClientCursor) as conn:
        cur = conn.cursor()
        values = ", ".join(cur.mogrify("%s", (params[name],)) for name in names)
        conn.execute("SET plan_cache_mode = force_generic_plan")
        if before:
            conn.execute(before, {"tenant": TENANT})
        conn.execute(f"PREPARE measured AS {sql}")
        execute = f"EXECUTE measured({values})" if names else "EXECUTE measured"
        blocks = []
        for _ in range(3):  # the last of three: warm, and hint bits set by the first
            conn.execute("SAVEPOINT measured")
            row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {execute}").fetchone()
            conn.execute("ROLLBACK TO SAVEPOINT measured")
            assert row is not None
            plan = row[0][0]["Plan"]
            hit, read = plan.get("Shared Hit Blocks", 0), plan.get("Shared Read Blocks", 0)
            blocks.append(int(hit) + int(read))
        conn.rollback()
    return blocks[-1]


def fair_params(window: float) -> dict[str, Any]:
    """The fair claim's parameters as the relay passes them: one routing key with room for
    a batch, the priorities' weights."""
    return {
        "routing_keys": ["default"],
        "budgets": [100],
        "other_budget": 100,
        "limit": 100,
        "priorities": [int(p) for p in WEIGHTS],
        "weights": list(WEIGHTS.values()),
        "window": window,
    }


async def look(url: str, mark: Any) -> None:
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, row_factory=dict_row
    ) as conn:
        await mark.look(conn)


def measure(url: str, mark: Any) -> dict[str, int]:
    if mark is None:  # the window before the mark: up to its unbounded look's period
        few_window = relay_module.UNBOUNDED_LOOK_EVERY + getattr(
            relay_module, "FEW_WINDOW_SLACK", 1.0
        )
        live_window = 0.0
    else:
        live_window = mark.window()
        asyncio.run(look(url, mark))
        few_window = mark.window()
    reap_window = 5.0 + reaper_module.WINDOW_SLACK  # the default interval's round
    out = {
        "outbox_claim_few (bounded)": explain(
            url, outbox_sql.OUTBOX_CLAIM_FEW, {"limit": 100, "window": few_window}
        ),
        "outbox_claim_few (full look)": explain(
            url, outbox_sql.OUTBOX_CLAIM_FEW, {"limit": 100, "window": 1e9}
        ),
        # The FIFO claim (fairness off, and the testing kit's drain), and the fair claim:
        # bounded by the same window when this tree's statements take one (before: the
        # window is ignored, every call is the full look).
        "outbox_claim_due (bounded)": explain(
            url, outbox_sql.OUTBOX_CLAIM_DUE, {"limit": 100, "window": few_window}
        ),
        "outbox_claim_due (full look)": explain(
            url, outbox_sql.OUTBOX_CLAIM_DUE, {"limit": 100, "window": 1e9}
        ),
        "outbox_claim_fair (bounded)": explain(
            url, outbox_sql.OUTBOX_CLAIM_FAIR, fair_params(few_window)
        ),
        "outbox_claim_fair (full look)": explain(
            url, outbox_sql.OUTBOX_CLAIM_FAIR, fair_params(1e9)
        ),
        "outbox_any_due": explain(url, outbox_sql.OUTBOX_ANY_DUE, {"window": few_window}),
        "job_lock_expired (bounded)": explain(
            url, recovery.JOB_LOCK_EXPIRED, {"limit": 100, "window": reap_window}
        ),
        "job_lock_expired (full look)": explain(
            url, recovery.JOB_LOCK_EXPIRED, {"limit": 100, "window": 1e9}
        ),
        "tenant_usage_lock": explain(url, TENANT_USAGE_LOCK, {"tenant": TENANT}),
        "job_insert_many (10 jobs)": explain(
            url, enqueue_sql.JOB_INSERT_MANY, batch_params(10), before=TENANT_USAGE_LOCK.sql
        ),
    }
    if mark is not None:
        out["outbox_oldest_writer (look)"] = explain(url, outbox_sql.OUTBOX_OLDEST_WRITER, {})
        out["outbox_oldest_live (look)"] = explain(
            url, outbox_sql.OUTBOX_OLDEST_LIVE, {"window": live_window}
        )
        out["job_oldest_expired"] = explain(
            url, recovery.JOB_OLDEST_EXPIRED, {"window": reap_window}
        )
    # What the relay's claims cost on average: the bounded claim, plus its looks and its
    # unbounded look shared out over the claims of their periods.
    if mark is None:
        full_every, looks = relay_module.UNBOUNDED_LOOK_EVERY, 0
    else:
        full_every = relay_module.UNBOUNDED_LOOK_EVERY
        looks = out["outbox_oldest_writer (look)"] + out["outbox_oldest_live (look)"]
    look_every = relay_low_water.LOOK_EVERY if relay_low_water is not None else full_every
    out["relay, mean per claim at 43/s"] = round(
        out["outbox_claim_few (bounded)"]
        + looks / (look_every * CLAIMS_PER_SECOND)
        + out["outbox_claim_few (full look)"] / (full_every * CLAIMS_PER_SECOND)
    )
    return out


def sizes(conn: psycopg.Connection[Any]) -> dict[str, dict[str, int]]:
    conn.execute("SELECT pg_stat_force_next_flush()")
    rows = conn.execute(
        "SELECT relname, pg_total_relation_size(relid), n_dead_tup"
        " FROM pg_stat_user_tables WHERE relname = ANY(%s)",
        (list(HOT_TABLES),),
    ).fetchall()
    return {name: {"bytes": size, "dead": dead} for name, size, dead in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps", default="0,5000,10000,20000", help="jobs pushed before each measure"
    )
    parser.add_argument("--steady", type=int, default=200, help="jobs of the last seconds")
    parser.add_argument("--settle", type=float, default=7.0, help="pause before the steady slice")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="the tenant's rate limit, jobs/s (0: none)"
    )
    parser.add_argument(
        "--drained-every",
        type=int,
        default=DRAINED["every"],
        help="every so many batches of the bulk go to a tenant left with no live row (0: none)",
    )
    args = parser.parse_args()
    RATE["per_second"] = args.rate
    DRAINED["every"] = args.drained_every
    settings = load_settings()
    template = scratch.ensure_template(settings)
    url = scratch.clone_database(settings, template, prefix="jobcore_horizon_")
    name = url.rsplit("/", 1)[1]
    mark = relay_low_water.LowWaterMark() if relay_low_water is not None else None
    results: list[dict[str, Any]] = []
    try:
        with (
            psycopg.connect(url, autocommit=True, options=SEARCH_PATH) as conn,
            psycopg.connect(url, autocommit=True, options=SEARCH_PATH) as pin,
        ):
            conn.execute("ANALYZE")
            # The pin: a snapshot and an XID held for the whole run.
            pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            pin.execute("SELECT txid_current(), count(*) FROM jobs")
            start = sizes(conn)
            pushed = 0
            for target in (int(s) for s in args.steps.split(",")):
                push(conn, target - pushed)
                pushed = target
                time.sleep(args.settle)  # the bulk falls behind the relay's look period
                if mark is not None:  # the relay's look during the pause
                    asyncio.run(look(url, mark))
                push(conn, args.steady)
                # Live work for the claims to find: due rows, and expired leases.
                enqueue(conn, 10)
                run(conn, enqueue(conn, 5), finish=False)
                conn.execute(
                    "UPDATE jobs SET lease_expires_at = now() - interval '1 s'"
                    " WHERE status = 'running'"
                )
                figures = measure(url, mark)
                results.append({"dead_jobs_behind_pin": target, "buffers": figures})
                print(f"N={target}: {json.dumps(figures)}", flush=True)
                with conn.transaction():  # leave no live work behind for the next step
                    conn.execute("DELETE FROM outbox")
                    conn.execute(
                        "UPDATE jobs SET status = 'succeeded', lease_expires_at = NULL"
                        " WHERE status <> 'succeeded'"
                    )
            end = sizes(conn)
            pin.execute("ROLLBACK")
    finally:
        with psycopg.connect(settings.maintenance_database_url(), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    jobs = pushed + len(results) * (args.steady + 15)
    print_table(results, start, end, jobs)
    if args.json:
        args.json.write_text(json.dumps({"steps": results, "start": start, "end": end}, indent=1))


def print_table(
    results: list[dict[str, Any]], start: dict[str, Any], end: dict[str, Any], jobs: int
) -> None:
    names = list(results[0]["buffers"])
    steps = " | ".join(f"N={r['dead_jobs_behind_pin']:,}" for r in results)
    print(f"\n| statement | {steps} |")
    print("|---|" + "---|" * len(results))
    for statement in names:
        cells = " | ".join(f"{r['buffers'][statement]:,}" for r in results)
        print(f"| {statement} | {cells} |")
    print(f"\nBehind the pin, per job ({jobs:,} jobs): bytes and dead tuples grown")
    print("| table | bytes/job | dead/job |\n|---|---|---|")
    for table in sorted(end):
        grown = end[table]["bytes"] - start.get(table, {"bytes": 0})["bytes"]
        dead = end[table]["dead"] - start.get(table, {"dead": 0})["dead"]
        print(f"| {table} | {grown / jobs:,.0f} | {dead / jobs:.2f} |")


if __name__ == "__main__":
    main()
