"""`jobcore batches list|show|close|cancel` against the real PostgreSQL, as a separate
process."""

from __future__ import annotations

import subprocess
from typing import Any

import orjson

from jobcore.access.audit import AuditAction
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.jobtypes import EchoPayload
from jobcore.testing.processes import jobcore_command, settings_env
from jobcore.usecases.batches import Callback, create_batch
from jobcore.usecases.enqueue.submit import EnqueueRequest


def batches_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobcore_command("batches", *args),
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )


def batches_json(settings: Settings, *args: str) -> Any:
    result = batches_cli(settings, *args, "--json")
    assert result.returncode == 0, result.stderr
    return orjson.loads(result.stdout)


def echo(text: str) -> EnqueueRequest:
    return EnqueueRequest(
        tenant="alpha", job_type=default_registry.get("echo"), payload=EchoPayload(text=text)
    )


async def test_list_show_close_cancel(db: Database, topology: Topology, settings: Settings) -> None:
    done = Callback(default_registry.get("batch_done"), {"note": "x"})
    written = await create_batch(
        db,
        topology,
        tenant="alpha",
        members=[echo("a"), echo("b")],
        callbacks={"on_complete": done},
        close=False,
        description="nightly",
    )
    listed = batches_json(settings, "list", "--tenant", "alpha")
    assert [(b["id"], b["status"], b["total"]) for b in listed] == [
        (str(written.batch_id), "open", 2)
    ]
    shown = batches_json(settings, "show", str(written.batch_id))
    assert shown["callbacks"] == {"on_complete": {"type": "batch_done", "job_id": None}}
    closed = batches_json(settings, "close", str(written.batch_id))
    assert closed["status"] == "closed"
    cancelled = batches_json(settings, "cancel", str(written.batch_id))
    assert (cancelled["status"], cancelled["cancelled"]) == ("cancelled", 2)
    assert cancelled["callbacks"]["on_complete"]["job_id"] is not None
    table = batches_cli(settings, "show", str(written.batch_id))
    assert table.returncode == 0, table.stderr
    assert "on_complete" in table.stdout
    async with db.connection() as conn:
        cursor = await conn.execute("SELECT action FROM audit_log ORDER BY id")
        actions = [row["action"] for row in await cursor.fetchall()]
    assert actions == [AuditAction.BATCH_CLOSE.value, AuditAction.BATCH_CANCEL.value]


async def test_a_bad_or_unknown_id_is_one_line(settings: Settings) -> None:
    bad = batches_cli(settings, "show", "nope")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == ["jobcore: not a batch id: 'nope'"]
    unknown = batches_cli(settings, "close", "0b6f3c2e-5d1c-4a43-9a55-0f1d2e3c4b5a")
    assert unknown.returncode == 1
    assert len(unknown.stderr.strip().splitlines()) == 1
