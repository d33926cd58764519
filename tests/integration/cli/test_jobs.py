"""`jobcore jobs list|show|cancel|retry` against the real PostgreSQL, as a separate process."""

from __future__ import annotations

import subprocess
import uuid
from typing import Any

import orjson

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.examples.jobtypes import NoopPayload
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.jobtypes import EchoPayload
from jobcore.testing.processes import jobcore_command, settings_env
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue


def jobs_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobcore_command("jobs", *args),
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )


def jobs_json(settings: Settings, *args: str) -> Any:
    result = jobs_cli(settings, *args, "--json")
    assert result.returncode == 0, result.stderr
    return orjson.loads(result.stdout)


async def submit(db: Database, topology: Topology, tenant: str, text: str) -> uuid.UUID:
    async with db.unit_of_work() as uow:
        result = await enqueue(
            uow,
            topology,
            EnqueueRequest(
                tenant=tenant,
                job_type=default_registry.get("echo"),
                payload=EchoPayload(text=text),
                entity_id=f"e-{text}",
            ),
        )
        await uow.commit()
    return result.job_id


async def test_list_and_show(db: Database, topology: Topology, settings: Settings) -> None:
    a = await submit(db, topology, "alpha", "a")
    b = await submit(db, topology, "beta", "b")
    listed = jobs_json(settings, "list")
    assert [row["id"] for row in listed] == [str(b), str(a)]  # newest first, all tenants
    only_alpha = jobs_json(settings, "list", "--tenant", "alpha")
    assert [row["id"] for row in only_alpha] == [str(a)]
    assert jobs_json(settings, "list", "--status", "running") == []
    table = jobs_cli(settings, "list")
    assert table.returncode == 0
    assert table.stdout.splitlines()[0].split()[:4] == ["ID", "TENANT", "TYPE", "STATUS"]

    shown = jobs_json(settings, "show", str(a))
    assert shown["tenant"] == "alpha"
    assert shown["payload"] == {"text": "a", "count": 1}
    assert shown["status"] == "pending"


async def test_cancel_pending_then_retry_the_copy(
    db: Database, topology: Topology, settings: Settings
) -> None:
    job = await submit(db, topology, "alpha", "x")
    cancelled = jobs_json(settings, "cancel", str(job))
    assert cancelled["status"] == "cancelled"

    again = jobs_cli(settings, "cancel", str(job))
    assert again.returncode == 1
    assert again.stderr.count("\n") == 1
    assert "cancelled" in again.stderr

    retried = jobs_json(settings, "retry", str(job))
    copy = uuid.UUID(retried["job_id"])
    assert copy != job
    shown = jobs_json(settings, "show", str(copy))
    assert (shown["tenant"], shown["type"], shown["status"]) == ("alpha", "echo", "pending")
    assert shown["payload"] == {"text": "x", "count": 1}
    assert shown["entity_id"] == "e-x"
    assert jobs_json(settings, "show", str(job))["status"] == "cancelled"  # the original stays


async def test_retry_refuses_a_job_that_is_not_finished_badly(
    db: Database, topology: Topology, settings: Settings
) -> None:
    async with db.unit_of_work() as uow:
        result = await enqueue(
            uow,
            topology,
            EnqueueRequest(
                tenant="t", job_type=default_registry.get("noop"), payload=NoopPayload()
            ),
        )
        await uow.commit()
    refused = jobs_cli(settings, "retry", str(result.job_id))
    assert refused.returncode == 1
    assert "only failed or cancelled" in refused.stderr


async def test_retry_of_a_job_whose_unique_key_another_holds_is_one_line_naming_it(
    db: Database, topology: Topology, settings: Settings
) -> None:
    echo = default_registry.get("echo")
    async with db.unit_of_work() as uow:
        first = await enqueue(
            uow,
            topology,
            EnqueueRequest(
                tenant="t", job_type=echo, payload=EchoPayload(text="a"), unique_key="u"
            ),
        )
        await uow.commit()
    assert jobs_json(settings, "cancel", str(first.job_id))["status"] == "cancelled"
    async with db.unit_of_work() as uow:
        holder = await enqueue(
            uow,
            topology,
            EnqueueRequest(
                tenant="t", job_type=echo, payload=EchoPayload(text="b"), unique_key="u"
            ),
        )
        await uow.commit()
    refused = jobs_cli(settings, "retry", str(first.job_id))
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1
    assert f"job {holder.job_id} (pending) holds this unique key" in refused.stderr
    assert jobs_json(settings, "show", str(holder.job_id))["unique_key"] == "u"


def test_bad_arguments_give_one_line_and_a_non_zero_exit(settings: Settings) -> None:
    bad_id = jobs_cli(settings, "show", "not-a-uuid")
    assert bad_id.returncode == 2
    assert bad_id.stderr.strip() == "jobcore: not a job id: 'not-a-uuid'"
    unknown = jobs_cli(settings, "show", str(uuid.uuid4()))
    assert unknown.returncode == 1
    assert unknown.stderr.startswith("jobcore: no job ")
    bad_status = jobs_cli(settings, "list", "--status", "exploded")
    assert bad_status.returncode == 2
    assert bad_status.stderr.count("\n") == 1


async def test_timeline_and_show_say_where_the_job_is(
    db: Database, topology: Topology, settings: Settings
) -> None:
    job = await submit(db, topology, "alpha", "t")
    # A retry of an operator's: its `accepted` event names the job it retries.
    assert jobs_cli(settings, "cancel", str(job)).returncode == 0
    copy = uuid.UUID(jobs_json(settings, "retry", str(job))["job_id"])

    timeline = jobs_json(settings, "timeline", str(job))
    assert (timeline["job_id"], timeline["tenant"], timeline["status"]) == (
        str(job),
        "alpha",
        "cancelled",
    )
    assert [e["kind"] for e in timeline["events"]] == ["accepted", "cancelled"]
    assert timeline["where"].startswith("cancelled at ")
    copied = jobs_json(settings, "timeline", str(copy))
    assert copied["events"][0]["detail"] == {"retry_of": str(job)}
    assert copied["where"].endswith(": relay lag")

    shown = jobs_json(settings, "show", str(copy))
    assert shown["where"].endswith(": relay lag")
    assert "message_outbox_id" not in shown

    table = jobs_cli(settings, "timeline", str(job))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == f"{job}  echo  cancelled  (tenant alpha)"
    assert lines[1].startswith("where: cancelled at ")
    assert lines[2].split() == ["AT", "KIND", "ATTEMPT", "DETAIL"]
    assert [line.split()[2] for line in lines[3:]] == ["accepted", "cancelled"]


def test_timeline_of_an_unknown_or_malformed_id_is_one_line(settings: Settings) -> None:
    unknown = uuid.uuid4()
    missing = jobs_cli(settings, "timeline", str(unknown))
    assert missing.returncode == 1
    assert missing.stderr.strip() == f"jobcore: no job {unknown}"
    bad = jobs_cli(settings, "timeline", "nope")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "jobcore: not a job id: 'nope'"


HOLD_AND_FAIL = """
UPDATE jobs SET status = CASE WHEN id = %(failed)s THEN 'failed' ELSE status END,
                finished_at = CASE WHEN id = %(failed)s THEN now() END,
                held_reason = CASE WHEN id = %(held)s THEN 'ordering' END,
                held_since = CASE WHEN id = %(held)s THEN now() END
WHERE id IN (%(failed)s, %(held)s)
"""


async def test_held_and_unblock(db: Database, topology: Topology, settings: Settings) -> None:
    ids = []
    for text in ("first", "second"):
        async with db.unit_of_work() as uow:
            result = await enqueue(
                uow,
                topology,
                EnqueueRequest(
                    tenant="alpha",
                    job_type=default_registry.get("echo"),
                    payload=EchoPayload(text=text),
                    ordering_key="k",
                ),
            )
            await uow.commit()
        ids.append(result.job_id)
    first, second = ids
    # As the worker leaves them: the first failed, the second held behind it.
    async with db.connection() as conn:
        await conn.execute(HOLD_AND_FAIL, {"failed": first, "held": second})

    assert jobs_json(settings, "held") == [{"held_reason": "ordering", "type": "echo", "held": 1}]
    listed = {row["id"]: row for row in jobs_json(settings, "list")}
    assert listed[str(second)]["held_reason"] == "ordering"
    shown = jobs_json(settings, "show", str(second))
    assert shown["ordering_key"] == "k"
    assert shown["ordering_seq"] == 2

    assert jobs_json(settings, "unblock", str(first)) == {
        "job_id": str(first),
        "ordering_key": "k",
        "blocks": False,
    }
    async with db.connection() as conn:
        cur = await conn.execute("SELECT ordering_blocks FROM jobs WHERE id = %s", (first,))
        assert (await cur.fetchone())["ordering_blocks"] is False  # type: ignore[index]
    # Once is enough; a job that blocks nothing is refused in one line.
    refused = jobs_cli(settings, "unblock", str(second))
    assert refused.returncode != 0
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "only a failed job of an ordering key" in refused.stderr


async def test_edit_changes_a_pending_job_of_the_version_shown(
    db: Database, topology: Topology, settings: Settings
) -> None:
    job = await submit(db, topology, "alpha", "x")
    version = jobs_json(settings, "show", str(job))["version"]
    edited = jobs_json(
        settings,
        "edit",
        str(job),
        "--version",
        version,
        "--priority",
        "low",
        "--payload",
        '{"text": "y"}',
    )
    assert edited["changed"] == "priority,payload"
    assert edited["version"] != version
    shown = jobs_json(settings, "show", str(job))
    assert (shown["payload"], shown["priority"]) == ({"text": "y", "count": 1}, 0)

    stale = jobs_cli(settings, "edit", str(job), "--version", version, "--priority", "high")
    assert stale.returncode == 1
    assert stale.stderr.count("\n") == 1
    assert "changed since" in stale.stderr
    assert jobs_json(settings, "show", str(job))["priority"] == 0  # unchanged
