"""`jobcore workflows list|show|cancel|retry` against the real PostgreSQL, as a separate
process."""

from __future__ import annotations

import subprocess
import uuid
from typing import Any

import orjson

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.payloads import validate_payload
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.processes import jobcore_command, settings_env
from jobcore.usecases.workflows import create_workflow, steps_from_documents


def workflows_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """``jobcore workflows ARGS``; ``--actor NAME`` first is the root's option."""
    root: tuple[str, ...] = ()
    if args[:1] == ("--actor",):
        root, args = args[:2], args[2:]
    return subprocess.run(
        jobcore_command(*root, "workflows", *args),
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )


async def make_workflow(db: Database, topology: Topology) -> uuid.UUID:
    def resolve(name: str, payload: Any, _: int) -> tuple[Any, Any]:
        kind = default_registry.get(name)
        return kind, validate_payload(kind, payload)

    documents = [
        {"name": "fetch", "type": "echo", "payload": {"text": "a"}},
        {"name": "parse", "type": "echo", "payload": {"text": "b"}, "depends_on": ["fetch"]},
        {
            "name": "alert",
            "type": "echo",
            "payload": {"text": "c"},
            "depends_on": [{"name": "parse", "policy": "on_failure"}],
        },
    ]
    async with db.unit_of_work() as uow:
        created = await create_workflow(
            uow,
            topology,
            tenant="acme",
            steps=steps_from_documents(documents, resolve, "acme"),
            name="ingest",
        )
        await uow.commit()
    return created.id


async def test_show_list_and_cancel(settings: Settings, db: Database, topology: Topology) -> None:
    workflow_id = await make_workflow(db, topology)
    shown = workflows_cli(settings, "show", str(workflow_id))
    assert shown.returncode == 0, shown.stderr
    assert "ingest  running" in shown.stdout
    assert "0: fetch[pending]" in shown.stdout
    assert "2: alert[pending]" in shown.stdout
    assert "parse (on_failure)" in shown.stdout
    listed = workflows_cli(settings, "list", "--json")
    assert [row["id"] for row in orjson.loads(listed.stdout)] == [str(workflow_id)]
    cancelled = workflows_cli(
        settings, "--actor", "ops:alice", "cancel", str(workflow_id), "--json"
    )
    assert cancelled.returncode == 0, cancelled.stderr
    assert orjson.loads(cancelled.stdout)["cancelled"] == 3
    after = orjson.loads(workflows_cli(settings, "show", str(workflow_id), "--json").stdout)
    assert after["status"] == "cancelled"
    retried = workflows_cli(settings, "--actor", "ops:alice", "retry", str(workflow_id), "fetch")
    assert retried.returncode == 1
    assert retried.stderr.strip().count("\n") == 0
    assert "was cancelled" in retried.stderr
    # Both are audited as the single job's operations are: the cancel with the workflow's
    # status when it was decided, the refused retry as refused; each names its actor.
    async with db.connection() as conn:
        cursor = await conn.execute(
            "SELECT actor, action, target_type, target_id, tenant, outcome, details "
            "FROM audit_log ORDER BY id"
        )
        entries = await cursor.fetchall()
    assert [
        (e["actor"], e["action"], e["target_type"], e["target_id"], e["tenant"], e["outcome"])
        for e in entries
    ] == [
        ("ops:alice", "workflow.cancel", "workflow", str(workflow_id), "acme", "succeeded"),
        ("ops:alice", "workflow.retry", "workflow", str(workflow_id), "acme", "refused"),
    ]
    assert entries[0]["details"] == {"status": "running"}
    assert entries[1]["details"]["refused"] == "JobNotRetryable"


async def test_an_unknown_or_malformed_id_is_one_line(settings: Settings) -> None:
    missing = workflows_cli(settings, "show", str(uuid.uuid4()))
    assert missing.returncode == 1
    assert "no workflow" in missing.stderr
    assert missing.stderr.strip().count("\n") == 0
    malformed = workflows_cli(settings, "show", "nope")
    assert malformed.returncode == 2
