"""`jobcore queues|types list|pause|resume` as separate processes against the real
PostgreSQL: the pauses shown and changed, the actor audited, bad names refused in one
line with exit 2."""

from __future__ import annotations

import subprocess
from typing import Any

import orjson

from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.testing.processes import jobcore_command, settings_env


def cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobcore_command("--actor", "ops:alice", *args),
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )


def ok(settings: Settings, *args: str) -> Any:
    result = cli(settings, *args, "--json")
    assert result.returncode == 0, result.stderr
    return orjson.loads(result.stdout)


async def test_pause_list_and_resume_a_type_and_a_queue_audited_as_the_actor(
    settings: Settings, db: Database
) -> None:
    assert ok(settings, "types", "pause", "export_csv")["was_paused"] is False
    assert ok(settings, "types", "pause", "export_csv")["was_paused"] is True
    assert ok(settings, "queues", "pause", "reports")["paused"] is True

    pauses = ok(settings, "types", "list")
    assert [(p["kind"], p["name"], p["paused_by"]) for p in pauses] == [
        ("queue", "reports", "ops:alice"),
        ("type", "export_csv", "ops:alice"),
    ]
    queues = ok(settings, "queues", "list")
    assert [(q["queue"], q["paused"], q["pending"]) for q in queues] == [("reports", True, 0)]

    assert ok(settings, "types", "resume", "export_csv")["was_paused"] is True
    assert ok(settings, "queues", "resume", "reports")["was_paused"] is True
    assert ok(settings, "queues", "resume", "reports")["was_paused"] is False
    assert ok(settings, "types", "list") == []

    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT actor, action, target_type, target_id, details->>'was_paused' AS was "
            "FROM audit_log ORDER BY id"
        )
        entries = [tuple(row.values()) for row in await cur.fetchall()]
    assert entries == [
        ("ops:alice", "type.pause", "type", "export_csv", "false"),
        ("ops:alice", "type.pause", "type", "export_csv", "true"),
        ("ops:alice", "queue.pause", "queue", "reports", "false"),
        ("ops:alice", "type.resume", "type", "export_csv", "true"),
        ("ops:alice", "queue.resume", "queue", "reports", "true"),
        ("ops:alice", "queue.resume", "queue", "reports", "false"),
    ]


def test_a_bad_name_is_one_line_and_exit_2_and_changes_nothing(settings: Settings) -> None:
    for args in (("queues", "pause", "Bad-Name"), ("types", "resume", "x" * 64)):
        result = cli(settings, *args)
        assert result.returncode == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1
        assert lines[0].startswith("jobcore: bad ")
    assert ok(settings, "types", "list") == []
