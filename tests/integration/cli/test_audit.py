"""The audit log: every admin action writes exactly one entry, in its own transaction, with
its actor; refusals are recorded as refused; secrets never reach it; `jobcore audit`
reads it back, filtered. Commands run as separate processes against the real PostgreSQL."""

from __future__ import annotations

import hashlib
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psycopg
import pytest

from jobcore.access.audit import AuditAction, Entry, Target, audited, cli_actor, record
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database, fetch_one
from jobcore.database.sql.api_keys import API_KEY_REVOKE
from jobcore.execution.registry import default_registry
from jobcore.kernel.errors import JobcoreError
from jobcore.kernel.settings import Settings
from jobcore.testing.jobtypes import EchoPayload
from jobcore.testing.processes import jobcore_command, settings_env
from jobcore.usecases import keys as key_usecases
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue

ENTRY_COLUMNS = "actor, action, target_type, target_id, tenant, outcome, details"


def jobcore(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobcore_command(*args),
        env=settings_env(settings, JOBCORE_WEBHOOK_ALLOWED_HOSTS="127.0.0.1", **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout)


def refused_in_one_line(done: subprocess.CompletedProcess[str], code: int = 1) -> str:
    assert done.returncode == code, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("jobcore: ")
    assert "Traceback" not in done.stderr
    return done.stderr


async def entries(db: Database) -> list[dict[str, Any]]:
    """Every entry, oldest first."""
    async with db.connection() as conn:
        cur = await conn.execute(f"SELECT {ENTRY_COLUMNS} FROM audit_log ORDER BY id")
        return [dict(row) for row in await cur.fetchall()]


async def whole_log_text(db: Database) -> str:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT coalesce(string_agg(a::text, ' '), '') AS t FROM audit_log a"
        )
        row = await cur.fetchone()
    assert row is not None
    return str(row["t"])


async def submit(db: Database, topology: Topology, tenant: str = "alpha") -> uuid.UUID:
    async with db.unit_of_work() as uow:
        result = await enqueue(
            uow,
            topology,
            EnqueueRequest(
                tenant=tenant, job_type=default_registry.get("echo"), payload=EchoPayload(text="x")
            ),
        )
        await uow.commit()
    return result.job_id


async def sql(db: Database, statement: str, *params: Any) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute(statement, params)
        return [dict(r) for r in await cur.fetchall()] if cur.description else []


async def test_key_changes_are_audited_with_their_actor_and_never_the_key(
    db: Database, settings: Settings
) -> None:
    created = as_json(
        jobcore(
            settings,
            "--actor",
            "ops:alice",
            "keys",
            "create",
            "--tenant",
            "acme",
            "--label",
            "billing",
            "--json",
        )
    )
    revoked = jobcore(settings, "keys", "revoke", created["id"], JOBCORE_ACTOR="ops:bob")
    assert revoked.returncode == 0, revoked.stderr
    unknown = str(uuid.uuid4())
    refused_in_one_line(jobcore(settings, "keys", "revoke", unknown, JOBCORE_ACTOR="ops:bob"))

    logged = await entries(db)
    assert [(e["actor"], e["action"], e["target_type"], e["target_id"]) for e in logged] == [
        ("ops:alice", "key.create", "api_key", created["id"]),
        ("ops:bob", "key.revoke", "api_key", created["id"]),
        ("ops:bob", "key.revoke", "api_key", unknown),
    ]
    assert [(e["tenant"], e["outcome"]) for e in logged] == [
        ("acme", "succeeded"),
        ("acme", "succeeded"),
        (None, "refused"),
    ]
    assert logged[0]["details"] == {"label": "billing", "scopes": ["enqueue", "read", "cancel"]}
    assert logged[2]["details"] == {"refused": "ApiKeyNotFound"}
    text = await whole_log_text(db)
    key = created["key"]
    for secret in (key, hashlib.sha256(key.encode()).hexdigest(), key[-16:]):
        assert secret not in text


async def test_webhook_secrets_and_endpoints_are_audited_without_the_secret_or_the_url(
    db: Database, settings: Settings
) -> None:
    shown = as_json(jobcore(settings, "webhooks", "secret", "--tenant", "acme", "--json"))
    rotated = as_json(
        jobcore(settings, "webhooks", "secret", "--tenant", "acme", "--rotate", "--json")
    )
    assert rotated["secret"] != shown["secret"]
    url = "http://127.0.0.1:8123/hooks/T0B0/tok3n-Zx9?sig=s1gnature"
    as_json(
        jobcore(settings, "webhooks", "endpoint", "set", "--tenant", "acme", "--url", url, "--json")
    )
    removed = jobcore(settings, "webhooks", "endpoint", "remove", "--tenant", "acme")
    assert removed.returncode == 0, removed.stderr
    refused_in_one_line(jobcore(settings, "webhooks", "endpoint", "remove", "--tenant", "acme"))

    logged = await entries(db)
    me = cli_actor()  # no --actor and no JOBCORE_ACTOR: the OS user at this host
    assert [
        (e["actor"], e["action"], e["target_id"], e["tenant"], e["outcome"]) for e in logged
    ] == [
        (me, "webhook_secret.reveal", "acme", "acme", "succeeded"),
        (me, "webhook_secret.rotate", "acme", "acme", "succeeded"),
        (me, "webhook_endpoint.set", "acme/*", "acme", "succeeded"),
        (me, "webhook_endpoint.remove", "acme/*", "acme", "succeeded"),
        (me, "webhook_endpoint.remove", "acme/*", None, "refused"),
    ]
    fingerprint = hashlib.sha256(url.encode()).hexdigest()[:16]
    assert logged[2]["details"] == {
        "job_type": "*",
        "url_origin": "http://127.0.0.1:8123",
        "url_sha256": fingerprint,
    }
    assert logged[0]["details"]["created"] is True
    assert logged[1]["details"]["overlap_seconds"] == 24 * 3600
    assert logged[1]["details"]["previous_expires_at"] is not None
    text = await whole_log_text(db)
    for secret in (shown["secret"], rotated["secret"], "tok3n-Zx9", "s1gnature"):
        assert secret not in text


async def test_job_actions_are_audited_and_refusals_recorded_as_refused(
    db: Database, topology: Topology, settings: Settings
) -> None:
    job = await submit(db, topology)
    env = {"JOBCORE_ACTOR": "ops:carol"}
    assert (
        as_json(jobcore(settings, "jobs", "cancel", str(job), "--json", **env))["status"]
        == "cancelled"
    )
    assert "cancelled" in refused_in_one_line(jobcore(settings, "jobs", "cancel", str(job), **env))
    copy = as_json(jobcore(settings, "jobs", "retry", str(job), "--json", **env))["job_id"]
    refused_in_one_line(jobcore(settings, "jobs", "retry", copy, **env))  # pending: refused

    # A pending job whose message vanished long ago: republish-stale publishes it again.
    stale = await submit(db, topology, tenant="beta")
    await sql(db, "DELETE FROM outbox WHERE job_id = %s", stale)
    await sql(
        db,
        "UPDATE jobs SET created_at = now() - interval '1 hour', "
        "updated_at = now() - interval '1 hour' WHERE id = %s",
        stale,
    )
    republished = as_json(
        jobcore(settings, "jobs", "republish-stale", "--stale-after", "60", "--json", **env)
    )
    assert [r["job_id"] for r in republished] == [str(stale)]

    logged = await entries(db)
    assert [(e["action"], e["target_type"], e["target_id"], e["outcome"]) for e in logged] == [
        ("job.cancel", "job", str(job), "succeeded"),
        ("job.cancel", "job", str(job), "refused"),
        ("job.retry", "job", str(job), "succeeded"),
        ("job.retry", "job", copy, "refused"),
        ("jobs.republish_stale", "jobs", None, "succeeded"),
    ]
    assert {e["actor"] for e in logged} == {"ops:carol"}
    assert [e["tenant"] for e in logged[:4]] == ["alpha"] * 4
    assert logged[0]["details"] == {"status": "cancelled"}
    assert logged[1]["details"] == {"refused": "JobNotCancellable"}
    assert logged[2]["details"] == {"new_job_id": copy, "type": "echo"}
    assert logged[3]["details"] == {"refused": "JobNotRetryable"}
    assert logged[4]["details"] == {
        "stale_after_seconds": 60.0,
        "jobs": 1,
        "job_ids": [str(stale)],
    }
    payload_text = orjson.dumps(EchoPayload(text="x").model_dump()).decode()
    assert payload_text not in await whole_log_text(db)


async def test_outbox_requeue_and_discard_are_audited(
    db: Database, topology: Topology, settings: Settings
) -> None:
    jobs = [await submit(db, topology) for _ in range(2)]
    rows = await sql(
        db,
        "UPDATE outbox SET quarantined_at = now() WHERE job_id = ANY(%s) "
        "RETURNING id, message_id, job_id",
        jobs,
    )
    by_job = {r["job_id"]: r for r in rows}
    requeued, discarded = by_job[jobs[0]], by_job[jobs[1]]
    env = {"JOBCORE_ACTOR": "ops:dan"}
    assert jobcore(settings, "outbox", "requeue", str(requeued["id"]), **env).returncode == 0
    done = jobcore(settings, "outbox", "discard", str(discarded["message_id"]), **env)
    assert done.returncode == 0, done.stderr
    again = jobcore(settings, "outbox", "requeue", str(requeued["id"]), **env)
    assert "not quarantined" in refused_in_one_line(again)

    logged = await entries(db)
    assert [(e["action"], e["target_id"], e["outcome"]) for e in logged] == [
        ("outbox.requeue", str(requeued["id"]), "succeeded"),
        ("outbox.discard", str(discarded["message_id"]), "succeeded"),
        ("outbox.requeue", str(requeued["id"]), "refused"),
    ]
    assert logged[1]["details"] == {
        "id": discarded["id"],
        "message_id": str(discarded["message_id"]),
        "job_id": str(jobs[1]),
    }
    assert logged[2]["details"]["refused"] == "OutboxRowNotQuarantined"


async def test_a_redelivery_is_audited_with_its_tenant(
    db: Database, topology: Topology, settings: Settings
) -> None:
    job = await submit(db, topology, tenant="gamma")
    delivery = uuid.uuid4()
    await sql(
        db,
        "INSERT INTO webhook_deliveries (id, job_id, tenant, url, event, status) "
        "VALUES (%s, %s, 'gamma', 'http://127.0.0.1:1/h', 'job.succeeded', 'failed')",
        delivery,
        job,
    )
    assert jobcore(settings, "webhooks", "redeliver", str(delivery)).returncode == 0
    [entry] = await entries(db)
    assert (entry["action"], entry["target_id"], entry["tenant"]) == (
        "webhook.redeliver",
        str(delivery),
        "gamma",
    )
    assert entry["details"] == {"job_id": str(job), "attempt": 1}


async def _new_key(db: Database) -> uuid.UUID:
    return (await key_usecases.create_key(db, "acme", actor="tests")).record.id


async def _revoked(db: Database, key_id: uuid.UUID) -> bool:
    rows = await sql(db, "SELECT revoked_at FROM api_keys WHERE id = %s", key_id)
    return rows[0]["revoked_at"] is not None


async def test_an_action_that_rolls_back_leaves_no_entry(db: Database) -> None:
    key_id = await _new_key(db)
    await sql(db, "DELETE FROM audit_log")  # not the use case under test: the setup's entry
    target = Target("api_key", str(key_id))

    # The action ran, then its transaction rolled back (a failure before commit).
    with pytest.raises(RuntimeError):
        async with audited(db, actor="t", action=AuditAction.KEY_REVOKE, target=target) as work:
            await fetch_one(work.uow, API_KEY_REVOKE({"id": key_id}))
            raise RuntimeError("crashed before commit")
    assert not await _revoked(db, key_id)
    assert await entries(db) == []

    # An entry that cannot be written takes its action with it: no action without one.
    with pytest.raises(ValueError, match="must not carry"):
        async with audited(db, actor="t", action=AuditAction.KEY_REVOKE, target=target) as work:
            await fetch_one(work.uow, API_KEY_REVOKE({"id": key_id}))
            work.entry.details = {"secret": "whsec_x"}
            await work.commit()
    assert not await _revoked(db, key_id)
    assert await entries(db) == []

    # The same action committed has exactly one entry.
    async with audited(db, actor="t", action=AuditAction.KEY_REVOKE, target=target) as work:
        await fetch_one(work.uow, API_KEY_REVOKE({"id": key_id}))
        await work.commit()
    assert await _revoked(db, key_id)
    assert [(e["action"], e["outcome"]) for e in await entries(db)] == [("key.revoke", "succeeded")]


async def test_entries_are_never_updated(db: Database) -> None:
    async with db.unit_of_work() as uow:
        await record(uow, Entry("t", AuditAction.PRUNE, Target("retention")))
        await uow.commit()
    with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
        await sql(db, "UPDATE audit_log SET actor = 'someone else'")
    assert [e["actor"] for e in await entries(db)] == ["t"]


async def test_an_invalid_actor_is_refused_in_one_line_before_anything_is_done(
    db: Database, topology: Topology, settings: Settings
) -> None:
    job = await submit(db, topology)
    for bad in ("ops\x1b[2Jalice", "x" * 201):
        done = jobcore(settings, "jobs", "cancel", str(job), JOBCORE_ACTOR=bad)
        assert refused_in_one_line(done).startswith("jobcore: JOBCORE_ACTOR: ")
    for bad in ("", "two\nlines", "x" * 201):
        done = jobcore(settings, "--actor", bad, "jobs", "cancel", str(job))
        assert refused_in_one_line(done, code=2).startswith("jobcore: --actor: ")
    assert (await sql(db, "SELECT status FROM jobs WHERE id = %s", job))[0]["status"] == "pending"
    assert await entries(db) == []
    with pytest.raises(JobcoreError, match="printable"):
        await key_usecases.revoke_key(db, uuid.uuid4(), actor="")


async def _entry_at(
    db: Database, age: timedelta, actor: str, action: str, tenant: str | None, target_id: str = "1"
) -> None:
    await sql(
        db,
        "INSERT INTO audit_log (at, actor, action, target_type, target_id, tenant, outcome) "
        "VALUES (now() - %s, %s, %s, 'thing', %s, %s, 'succeeded')",
        age,
        actor,
        action,
        target_id,
        tenant,
    )


async def test_jobcore_audit_shows_newest_first_and_filters(
    db: Database, settings: Settings
) -> None:
    await _entry_at(db, timedelta(days=3), "ops:alice", "key.create", "acme", "k1")
    await _entry_at(db, timedelta(hours=5), "ops:bob", "key.revoke", "acme", "k1")
    await _entry_at(db, timedelta(hours=1), "ops:alice", "job.cancel", "beta", "j1")
    await _entry_at(db, timedelta(minutes=1), "ops:bob", "prune", None, "\x1b[31mred")

    def targets(*args: str) -> list[str]:
        return [e["target_id"] for e in as_json(jobcore(settings, "audit", *args, "--json"))]

    assert targets() == ["\x1b[31mred", "j1", "k1", "k1"]
    assert targets("--since", "2h") == ["\x1b[31mred", "j1"]
    assert targets("--since", "PT6H") == ["\x1b[31mred", "j1", "k1"]
    since = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S")
    assert targets("--since", since) == ["\x1b[31mred", "j1", "k1"]
    assert targets("--actor", "ops:alice") == ["j1", "k1"]
    assert targets("--action", "key.revoke") == ["k1"]
    assert targets("--tenant", "acme") == ["k1", "k1"]
    assert targets("--tenant", "acme", "--actor", "ops:bob") == ["k1"]
    assert targets("--limit", "2") == ["\x1b[31mred", "j1"]

    table = jobcore(settings, "audit")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["AT", "ACTOR", "ACTION", "TARGET", "TENANT", "OUTCOME", "DETAILS"]
    assert len(lines) == 5
    assert "\x1b" not in table.stdout  # a hostile value is shown escaped, not obeyed
    assert "thing:\\x1b[31mred" in lines[1]
    assert lines[2].split()[2:6] == ["ops:alice", "job.cancel", "thing:j1", "beta"]

    for bad in (("--since", "yesterday"), ("--action", "key.steal"), ("--limit", "0")):
        refused_in_one_line(jobcore(settings, "audit", *bad), code=2)


async def test_a_key_rotation_is_audited_with_both_keys_ids_and_neither_key(
    settings: Settings, db: Database
) -> None:
    created = as_json(jobcore(settings, "keys", "create", "--tenant", "acme", "--json"))
    rotated = as_json(
        jobcore(settings, "--actor", "ops:carol", "keys", "rotate", created["id"], "--json")
    )
    again = jobcore(settings, "--actor", "ops:carol", "keys", "rotate", created["id"])
    refused_in_one_line(again)

    rotations = [e for e in await entries(db) if e["action"] == "key.rotate"]
    assert [(e["actor"], e["target_id"], e["tenant"], e["outcome"]) for e in rotations] == [
        ("ops:carol", created["id"], "acme", "succeeded"),
        ("ops:carol", created["id"], "acme", "refused"),
    ]
    assert rotations[0]["details"]["new_key_id"] == rotated["id"]
    assert rotations[1]["details"]["refused"] == "RotationRefused"
    text = await whole_log_text(db)
    for key in (created["key"], rotated["key"]):
        assert key not in text
        assert hashlib.sha256(key.encode()).hexdigest() not in text
