"""A service started while PostgreSQL is down makes its schema check once it answers: a
schema more than one release newer stops `jobcore worker`, `jobcore api` and
`jobcore relay` with exit 1 and the same one line as when the database was up at start,
and `jobcore api --workers 2` too (its processes would otherwise be started again, and
again, by uvicorn's supervisor).

PostgreSQL here is a cluster of the test's own (tests/support/pg_stoppable.py, 5452),
stopped and started by the test; the machine's own (5432) is never touched.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from jobcore.database.schema_version import Marker
from jobcore.kernel.settings import Settings
from jobcore.testing import scratch
from jobcore.testing.processes import jobcore_command, settings_env
from jobcore.testing.waiting import eventually_sync
from tests.support import pg_stoppable

# What each command logs once it runs (the database still down).
STARTED = {
    "worker": "worker consuming",
    "api": "api started",
    "relay": "relay waiting for the database",
}
REFUSAL = "jobcore: the database schema is jobcore 9.0.0's (revision 9999)"


@pytest.fixture
def stoppable(settings: Settings) -> Iterator[Settings]:
    """``settings`` on a fresh migrated database of the stoppable cluster, whose schema a
    release two ahead migrated (9.0.0, running with 8.0.0's code at revision 9000)."""
    with pg_stoppable.locked():
        pg_stoppable.ensure()
        admin = Settings(database_url=pg_stoppable.url("postgres"))
        template = scratch.ensure_template(admin)
        database_url = scratch.clone_database(admin, template)
        try:
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute("UPDATE alembic_version SET version_num = '9999'")
                comment = Marker("9999", "9.0.0", "9000", "8.0.0").comment()
                conn.execute(f"COMMENT ON TABLE alembic_version IS '{comment}'")
            yield settings.model_copy(update={"database_url": database_url})
        finally:
            pg_stoppable.start()
            scratch.drop_database(Settings(database_url=database_url))


# Above the sum of the test's own deadlines, so that one of them, with its message, is what
# fails: the stoppable cluster's lock (up to 300 s while another variant, on another xdist
# worker, holds it: a CI run waited 57 s), the start (60 s) and the exit (90 s).
@pytest.mark.timeout(480)
@pytest.mark.parametrize(
    "argv",
    [(command,) for command in sorted(STARTED)] + [("api", "--workers", "2")],
    ids=lambda argv: " ".join(argv),
)
def test_a_service_started_while_postgresql_is_down_refuses_a_newer_schema_once_it_is_up(
    stoppable: Settings, argv: tuple[str, ...], tmp_path: Path
) -> None:
    command = argv[0]
    env = settings_env(
        stoppable,
        JOBCORE_API_PORT="0",
        JOBCORE_WORKER_HEALTH_PORT="0",
        JOBCORE_RELAY_HEALTH_PORT="0",
        # The relay waits this long for its first connection at start.
        JOBCORE_DB_CONNECT_TIMEOUT="60",
    )
    log = tmp_path / "stderr.log"
    pg_stoppable.stop()
    with log.open("w") as stderr:
        process = subprocess.Popen(
            jobcore_command(*argv), env=env, stdout=subprocess.DEVNULL, stderr=stderr, text=True
        )
    try:
        eventually_sync(
            lambda: STARTED[command] in log.read_text() or process.poll() is not None,
            timeout=60,
            what=f"`jobcore {command}` running with PostgreSQL down",
        )
        assert process.poll() is None, log.read_text()
        pg_stoppable.start()
        code = process.wait(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    said = log.read_text()
    assert code == 1, said
    assert said.splitlines()[-1].startswith(REFUSAL), said
    assert "more than one release older" in said.splitlines()[-1]
    assert "Traceback" not in said
