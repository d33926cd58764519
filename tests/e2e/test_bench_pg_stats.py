"""`jobcore bench e2e --pg-stats` on the bench's own cluster (scripts/pg_stats_cluster.sh,
127.0.0.1:5451, started here when it does not run): the per-statement and wait tables are
in the report, shaped as documented. Structure only: no figure's size is asserted, only
counts that hold on any machine (the enqueue statement runs once per POSTed job)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
import psycopg
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.database.sql.jobs.enqueue import JOB_INSERT
from jobcore.examples.jobtypes import NoopPayload
from jobcore.execution.registry import load_job_modules
from jobcore.kernel.settings import Settings
from jobcore.testing import scratch
from jobcore.testing.processes import ROOT
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue
from services.bench import pgstats
from services.bench import report as report_module
from services.bench.pgstats import BENCH_MARK
from tests.e2e.test_bench_smoke import bench_cli

SCRIPT = ROOT / "scripts" / "pg_stats_cluster.sh"
PORT = 5451
START_TIMEOUT = 120.0


@pytest.fixture(scope="module")
def stats_url() -> str:
    """The stats cluster's URL, the cluster created and started unless it runs."""
    try:
        result = subprocess.run(
            [str(SCRIPT), "start"],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
            env={"PATH": "/usr/sbin:/usr/bin:/bin", "PG_STATS_PORT": str(PORT)},
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{SCRIPT} start did not finish in {START_TIMEOUT:g}s", pytrace=False)
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip()[-2000:]
        pytest.fail(f"{SCRIPT} start failed ({result.returncode}): {said}", pytrace=False)
    return result.stdout.strip().splitlines()[-1]


TITLES = [
    "e2e run 1: statements by PostgreSQL exec time, per job",
    "e2e run 1: what the backends were doing (pg_stat_activity)",
    "e2e run 1: ungranted locks (pg_locks)",
    "pipeline drain: statements by PostgreSQL exec time, per job",
    "pipeline drain: what the backends were doing (pg_stat_activity)",
    "pipeline drain: ungranted locks (pg_locks)",
]


@pytest.mark.timeout(400)
def test_pg_stats_adds_per_statement_and_wait_tables_to_e2e(
    settings: Settings, stats_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    jobs = 60
    # Coalescing off: each POST is then exactly one enqueue statement, which the table's
    # counts are checked against (coalesced, the split between single and group writes
    # depends on timing).
    result = bench_cli(
        settings,
        *("e2e", "--pg-stats", "--pg-stats-url", stats_url),
        *("--jobs", str(jobs), "--runs", "1", "--out", str(out)),
        JOBCORE_API_ENQUEUE_COALESCE_MAX="1",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    document = orjson.loads((out / "report.json").read_bytes())
    # The report names the server, never its whole URL.
    assert document["options"]["pg_stats_url"] == f"127.0.0.1:{PORT}"
    [section] = document["scenarios"]
    tables = section["details"]["tables"]
    assert [t["title"] for t in tables] == TITLES
    for statements in (tables[0], tables[3]):
        assert statements["columns"][:4] == ["statement", "top-level", "calls/job", "exec ms/job"]
        assert statements["rows"], statements["title"]
        totals = statements["totals"]
        assert totals["calls"] > 0
        assert totals["exec_ms"] > 0
        assert totals["wal_bytes"] > 0
        assert totals["cpu_ms"] > 0, "the stats cluster's CPU over the window"
        shown = [row[0] for row in statements["rows"]]
        assert not [s for s in shown if BENCH_MARK in s], "the bench's own statements are out"
        for row in statements["rows"]:
            assert len(row) == len(statements["columns"])
            assert row[1] in ("yes", "nested")
    # Every POST inserted one job: the enqueue (JOB_INSERT) ran once per job, as one
    # top-level row of the table (a statement is summed over its entries: ANALYZE, say,
    # gives a prepared statement a new one). On failure, each statement's row, whole.
    enqueue = pgstats.short(JOB_INSERT.sql)[:60]
    inserts = [row for row in tables[0]["rows"] if row[0].startswith(enqueue)]
    shown = "\n".join(repr(row[:3] + row[6:7]) for row in tables[0]["rows"])
    assert [(row[1], row[2]) for row in inserts] == [("yes", 1.0)], shown
    assert inserts[0][6] >= 1, shown
    # The drain's claims and completions: each row of theirs is one job.
    assert any(row[1] == "yes" and row[6] == 1.0 for row in tables[3]["rows"])
    for waits in (tables[1], tables[4]):
        assert "samples, every 50 ms" in waits["note"]
        assert waits["rows"], "a backend was busy in some sample"
        assert all(len(row) == len(waits["columns"]) for row in waits["rows"])
    markdown = (out / "report.md").read_text()
    for title in TITLES:
        assert f"**{title}**" in markdown
    # The tables render again from the JSON alone.
    again = tmp_path / "again"
    report_module.write(again, *report_module.load(out))
    assert (again / "report.md").read_text() == markdown


def test_pg_stats_refuses_a_server_it_cannot_use_in_one_line(settings: Settings) -> None:
    # Nothing listens on port 1; the password must not reach the output.
    unreachable = bench_cli(
        settings,
        *("e2e", "--pg-stats", "--pg-stats-url", "postgresql://postgres:hunter2@127.0.0.1:1/x"),
        timeout=60,
    )
    assert unreachable.returncode != 0
    said = (unreachable.stderr + unreachable.stdout).strip()
    assert "pg_stats_cluster.sh start" in said, said
    assert "127.0.0.1:1" in said, said
    assert "hunter2" not in said
    assert len(said.splitlines()) == 1, said
    # The shared server does not preload pg_stat_statements (and is never restarted for it).
    shared = bench_cli(
        settings, "e2e", "--pg-stats", "--pg-stats-url", settings.database_url, timeout=60
    )
    assert shared.returncode != 0
    assert "does not preload pg_stat_statements" in shared.stderr + shared.stdout


# The enqueue statement's entries in this database.
ENQUEUE_QUERYIDS = """
    SELECT count(DISTINCT queryid) FROM pg_stat_statements
    WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND query LIKE 'WITH existing AS%%'
"""


async def test_a_statement_made_again_after_an_analyze_is_one_row_of_the_table(
    stats_url: str,
) -> None:
    """An ANALYZE of a table a prepared statement reads (the maintenance leader's analyzer
    runs during a window) gives the statement, made again, a new queryid with the same
    text: the table sums them, so the enqueue still counts once per job."""
    admin = Settings(database_url=stats_url)
    database_url = scratch.clone_database(admin, scratch.ensure_template(admin))
    settings = Settings(database_url=database_url)
    db = Database(settings, min_size=1, max_size=1, name="pg-stats", generic_plans=True)
    try:
        await pgstats.enable(database_url)
        await db.open(wait=True)
        topology = Topology.from_settings(settings)
        noop = load_job_modules(("jobcore.examples.jobtypes",)).get("noop")
        statements = pgstats.Statements(database_url)
        await statements.start()

        async def enqueued(n: int) -> None:
            for _ in range(n):
                request = EnqueueRequest(tenant="stats", job_type=noop, payload=NoopPayload())
                async with db.session() as session:
                    await enqueue(session, topology, request, quotas=settings.quota_defaults)

        await enqueued(8)  # past psycopg's prepare threshold: a prepared statement
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute(f"{BENCH_MARK} ANALYZE jobcore.jobs")
            ids = await conn.execute(f"{BENCH_MARK} {ENQUEUE_QUERYIDS}")
            assert await ids.fetchone() == (1,)
        await enqueued(4)
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            ids = await conn.execute(f"{BENCH_MARK} {ENQUEUE_QUERYIDS}")
            assert await ids.fetchone() == (2,), "the case this test is about: made again"
        await statements.stop()
    finally:
        await db.close()
        scratch.drop_database(settings)
    [row] = [r for r in statements.table("t", 12)["rows"] if r[0].startswith("WITH existing AS")]
    assert (row[1], row[2], row[6]) == ("yes", 1.0, 1.0), row
