"""Checks of flow control from job rows (overlapping runs, start rates, order per key),
and the rows the flow tests write."""

from __future__ import annotations

import itertools
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from jobcore.database.gateway import Database


def max_overlap(intervals: Iterable[tuple[datetime, datetime]]) -> int:
    """The most intervals [start, end] that share an instant (an end before a start at the
    same instant: a slot freed and taken again is not an overlap)."""
    events = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
        key=lambda event: (event[0], event[1]),
    )
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def overlap_per_key(rows: Sequence[dict[str, Any]], key: str) -> dict[str, int]:
    by_key: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
    for row in rows:
        by_key[row[key]].append((row["started_at"], row["finished_at"]))
    return {k: max_overlap(v) for k, v in by_key.items()}


def most_starts_in_a_second(starts: Sequence[datetime]) -> int:
    """The most starts within any window [t, t + 1 s)."""
    ordered = sorted(starts)
    most = 0
    first = 0
    for last, start in enumerate(ordered):
        while start - ordered[first] >= timedelta(seconds=1):
            first += 1
        most = max(most, last - first + 1)
    return most


def order_violations(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Per ordering key: each job started after the one before it (in enqueue order)
    finished, and in that order. Rows need tenant, ordering_key, ordering_seq, started_at,
    finished_at and id."""
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_key[(row["tenant"], row["ordering_key"])].append(row)
    problems: list[str] = []
    for key, jobs in by_key.items():
        jobs.sort(key=lambda row: row["ordering_seq"])
        for before, after in itertools.pairwise(jobs):
            if not before["finished_at"] < after["started_at"]:
                problems.append(
                    f"{key}: job {after['id']} (#{after['ordering_seq']}) started at "
                    f"{after['started_at']}, before job {before['id']} "
                    f"(#{before['ordering_seq']}) finished at {before['finished_at']}"
                )
    return problems


async def run(db: Database, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
    async with db.connection() as conn:
        cur = await conn.execute(sql, params)
        return await cur.fetchall() if cur.description else []


async def job(db: Database, status: str = "pending", **columns: Any) -> uuid.UUID:
    job_id = uuid.uuid4()
    names = ["id", "tenant", "type", "queue", "status", *columns]
    values = {"id": job_id, "tenant": "t", "type": "flow_x", "queue": "testq", "status": status}
    values.update(columns)
    await run(
        db,
        f"INSERT INTO jobcore.jobs ({', '.join(names)})"
        f" VALUES ({', '.join(f'%({n})s' for n in names)})",
        values,
    )
    return job_id
