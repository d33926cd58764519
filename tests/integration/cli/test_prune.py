"""`jobcore prune [--dry-run] [--json]` as a separate process against the real PostgreSQL."""

from __future__ import annotations

import subprocess
from datetime import timedelta
from typing import Any

import orjson

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.maintenance import Maintainer, Pruner
from jobcore.storage.results import LocalResultStore
from jobcore.testing.processes import jobcore_command, settings_env
from services.worker.metrics import WorkerMetrics
from tests.support.retention import audit_entry, inbox_row, make_job, table_counts

EXPECTED_TABLES = {
    "jobs": 3,
    "job_effects": 3,
    "webhook_deliveries": 3,
    "outbox": 1,
    "inbox": 2,
    "audit_log": 1,
    "job_gates": 0,
    "job_keys": 0,
    "batches": 0,
    "workflows": 0,
    "result_files": 3,
}


def jobcore(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobcore_command(*args),
        env=settings_env(settings, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout)


async def old_rows(db: Database, topology: Topology, settings: Settings) -> None:
    store = LocalResultStore(settings.result_dir)
    await make_job(db, topology, age=timedelta(days=8), store=store, quarantined=True)
    await make_job(db, topology, age=timedelta(days=9), store=store)
    await make_job(db, topology, status="cancelled", age=timedelta(days=31), store=store)
    await make_job(db, topology, status="failed", age=timedelta(days=8), store=store)  # kept
    await make_job(db, topology, age=timedelta(days=1), store=store)  # kept
    for _ in range(2):
        await inbox_row(db, age=settings.inbox_retention + timedelta(hours=1))
    await audit_entry(db, age=settings.audit_retention + timedelta(hours=1))
    await audit_entry(db, age=settings.audit_retention - timedelta(hours=1))  # kept


async def audit_log(db: Database) -> list[dict[str, Any]]:
    async with db.connection() as conn:
        cur = await conn.execute(
            "SELECT actor, action, target_type, outcome, details FROM audit_log ORDER BY id"
        )
        return [dict(row) for row in await cur.fetchall()]


async def test_dry_run_shows_what_would_go_then_a_pass_deletes_exactly_that(
    db: Database, topology: Topology, settings: Settings
) -> None:
    await old_rows(db, topology, settings)
    before = await table_counts(db)
    files = sorted(p.name for p in settings.result_dir.iterdir())

    dry = as_json(jobcore(settings, "prune", "--dry-run", "--json"))

    assert await table_counts(db) == before
    assert sorted(p.name for p in settings.result_dir.iterdir()) == files
    assert dry["dry_run"] is True
    assert dry["tables"] == EXPECTED_TABLES
    by_kind = {(k["status"], k["type"]): k for k in dry["jobs"]}
    assert {kind: k["jobs"] for kind, k in by_kind.items()} == {
        ("cancelled", "noop"): 1,
        ("failed", "noop"): 0,
        ("succeeded", "noop"): 2,
    }
    assert by_kind[("succeeded", "noop")]["retention_seconds"] == 7 * 86_400
    assert by_kind[("failed", "noop")]["retention_seconds"] == 30 * 86_400

    table = jobcore(settings, "prune", "--dry-run")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == "finished jobs to prune (dry run), by status and type:"
    assert lines[1].split() == ["STATUS", "TYPE", "RETENTION", "OLDEST", "JOBS"]
    assert ["inbox", "2"] in [line.split() for line in lines]

    done = as_json(jobcore(settings, "prune", "--json", JOBCORE_ACTOR="ops:erin"))

    assert (done["dry_run"], done["complete"]) == (False, True)
    assert done["tables"] == EXPECTED_TABLES
    after = await table_counts(db)
    assert {t: before[t] - after[t] for t in after} == {
        t: n
        for t, n in EXPECTED_TABLES.items()
        if t not in ("result_files", "audit_log", "job_gates", "job_keys", "batches", "workflows")
    }
    # The old entry went, the recent one stayed, and the pass recorded what it deleted;
    # the dry run recorded nothing.
    kept, pass_ = await audit_log(db)
    assert kept["actor"] == "tests"
    assert (pass_["actor"], pass_["action"], pass_["outcome"]) == (
        "ops:erin",
        "prune",
        "succeeded",
    )
    assert pass_["details"]["tables"] == EXPECTED_TABLES
    assert pass_["details"]["complete"] is True
    assert len(list(settings.result_dir.iterdir())) == len(files) - 3
    # The lease was given back: a worker's pruner can take it at once.
    async with db.connection() as conn:
        cur = await conn.execute("SELECT count(*) AS n FROM maintenance_leases")
        assert await cur.fetchone() == {"n": 0}


async def test_refused_while_a_workers_pruner_holds_the_lease(
    db: Database, topology: Topology, settings: Settings
) -> None:
    # A worker leads maintenance; its pruner's round holds the pruner's row (nothing to
    # prune yet).
    holder = Maintainer(
        db, [Pruner.from_settings(settings, metrics=WorkerMetrics())], owner="worker-7"
    )
    await holder.tick()
    assert holder.is_leader
    await old_rows(db, topology, settings)
    before = await table_counts(db)

    refused = jobcore(settings, "prune")

    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("jobcore: the pruner lease is held by worker-7 until ")
    assert "nothing was pruned" in refused.stderr
    assert await table_counts(db) == before
    refusal = (await audit_log(db))[-1]
    assert (refusal["action"], refusal["outcome"]) == ("prune", "refused")
    assert refusal["details"] == {"refused": "PrunerBusy"}
    # Counting needs no lease.
    assert as_json(jobcore(settings, "prune", "--dry-run", "--json"))["tables"]["jobs"] == 3


def test_an_inbox_window_shorter_than_the_longest_redelivery_stops_start_up(
    settings: Settings,
) -> None:
    for command in (("prune",), ("worker",)):
        refused = jobcore(settings, *command, JOBCORE_INBOX_RETENTION="PT2H")
        assert refused.returncode == 1, command
        assert refused.stderr.count("\n") == 1
        assert refused.stderr.startswith("jobcore: JOBCORE_INBOX_RETENTION: 2:00:00 is shorter")
        for name in ("JOBCORE_AMQP_DELIVERY_LIMIT", "JOBCORE_AMQP_CONSUMER_TIMEOUT"):
            assert name in refused.stderr
    unknown = jobcore(settings, "prune", JOBCORE_RETENTION_TYPES='{"noop": {"done": "P1D"}}')
    assert unknown.returncode == 1
    assert unknown.stderr == (
        "jobcore: JOBCORE_RETENTION_TYPES: unknown status 'done' for job type 'noop' "
        "(use succeeded, failed, cancelled)\n"
    )
