"""Three `jobcore worker` processes with the same every-second schedule: each tick makes
exactly one job, also across the scheduler leader's death (SIGKILL), and no process ever
found a tick another had made."""

from __future__ import annotations

import os
import signal
from contextlib import ExitStack
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from jobcore.database.gateway import Database, fetch_all, fetch_one
from jobcore.database.sql import Query
from jobcore.kernel.settings import Settings
from jobcore.testing.processes import jobcore_process
from jobcore.testing.waiting import eventually
from tests.integration.worker.support import worker_env

SCHEDULE = {"job_type": "noop", "cron": "* * * * * *", "missed": "catch_up:60"}
TICKS = Query(
    "test_schedule_ticks",
    "Each tick's key and how many jobs carry it.",
    """
    SELECT idempotency_key, count(*) AS jobs FROM jobs
    WHERE entity_id = 'schedule:every_second' GROUP BY idempotency_key ORDER BY 1
    """,
)
LEADER = Query(
    "test_scheduler_leader",
    "Who holds the scheduler lease.",
    "SELECT owner FROM maintenance_leases WHERE name = 'scheduler' AND expires_at > now()",
)


async def ticks(db: Database) -> list[dict[str, Any]]:
    async with db.unit_of_work() as uow:
        return [dict(r) for r in await fetch_all(uow, TICKS({}))]


async def leader(db: Database) -> str | None:
    async with db.unit_of_work() as uow:
        row = await fetch_one(uow, LEADER({}))
    return None if row is None else str(row["owner"])


def instant(key: str) -> datetime:
    return datetime.fromisoformat(key.removeprefix("schedule:every_second:"))


async def test_three_workers_make_each_tick_once_across_the_leaders_death(
    wsettings: Settings, db: Database, broker_cleanup: None, tmp_path: Path
) -> None:
    env = {
        **worker_env(wsettings),
        "JOBCORE_SCHEDULES": orjson.dumps({"every_second": SCHEDULE}).decode(),
        "JOBCORE_SCHEDULER_INTERVAL": "0.2",
    }
    logs = [tmp_path / f"worker-{n}.log" for n in range(3)]
    with ExitStack() as stack:
        procs = [
            stack.enter_context(jobcore_process(wsettings, "worker", log_path=log, **env))
            for log in logs
        ]

        async def made(count: int) -> list[dict[str, Any]] | None:
            found = await ticks(db)
            return found if len(found) >= count else None

        await eventually(lambda: made(4), timeout=60, what="four ticks' jobs")
        first_leader = await eventually(lambda: leader(db), timeout=10, what="a leader")
        pid = int(first_leader.split(":")[1])
        killed = next(p for p in procs if p.pid == pid)
        before = len(await ticks(db))
        os.kill(pid, signal.SIGKILL)
        killed.wait(timeout=10)

        async def new_leader() -> str | None:
            holder = await leader(db)
            return holder if holder not in (None, first_leader) else None

        await eventually(new_leader, timeout=15, what="another worker taking the lease")
        await eventually(lambda: made(before + 4), timeout=30, what="ticks after the takeover")
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            assert proc.wait(timeout=30) in (0, -signal.SIGKILL)

    found = await ticks(db)
    assert all(row["jobs"] == 1 for row in found), found
    instants = [instant(row["idempotency_key"]) for row in found]
    # Every second from the first tick to the last has its job: none lost in the takeover
    # (catch_up covers the seconds the lease took to change hands), none twice.
    expected = [instants[0] + timedelta(seconds=n) for n in range(len(instants))]
    assert instants == expected
    texts = [log.read_text(errors="replace") for log in logs]
    assert not any("schedule tick already enqueued" in text for text in texts)
    announced = sum(text.count('"schedule tick enqueued"') for text in texts)
    # Each job was announced by the one process that made it (the killed leader may have
    # died between a commit and its log line).
    assert len(found) - 1 <= announced <= len(found)
    assert sum(1 for text in texts if '"schedule tick enqueued"' in text) >= 2
