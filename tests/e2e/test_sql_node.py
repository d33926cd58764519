"""The SQL enqueue from Node's pg (clients/sql-examples/node, `npm test`) against a real
database, relay and worker: a job enqueued in the application's transaction runs once at
its commit, a rollback leaves nothing, and refusals arrive as errors with their SQLSTATE.

Node runs the tests; this test starts the processes, adds the application's own table and
checks that every named test passed. Node's own output is printed when one did not.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest

from jobcore.kernel.settings import Settings
from tests.e2e.stack import E2EStack, until
from tests.support.typescript import SQL_NODE, require_packages

pytestmark = pytest.mark.timeout(300)

# A handful of tests, one waiting on a job: a guard against a hang, not a speed bar.
NPM_TIMEOUT = 180.0
# clients/sql-examples/node/test/enqueue.test.mjs: each must be reported passing.
NODE_TESTS = (
    "an order and its job commit together, and the job runs once",
    "a rollback leaves neither the order nor the job",
    "refusals are errors with their SQLSTATE and argument; a savepoint keeps the transaction",
)
TAP_RESULT = re.compile(r"^(not )?ok \d+ - (.+?)(?: # .*)?$", re.MULTILINE)


@pytest.fixture
async def stack(settings: Settings, tmp_path: Path) -> AsyncIterator[E2EStack]:
    stack = E2EStack(settings, tmp_path)
    try:
        await stack.start()
        yield stack
    finally:
        await stack.stop()


async def registered(settings: Settings) -> bool:
    """Whether the worker has recorded its job types (on its pool's first connection)."""
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        cur = await conn.execute("SELECT 1 FROM job_type_registry WHERE type = 'echo'")
        return await cur.fetchone() is not None


async def test_node_pg_enqueues_in_its_transaction(stack: E2EStack) -> None:
    require_packages(SQL_NODE)
    settings = stack.settings
    async with await psycopg.AsyncConnection.connect(settings.database_url) as conn:
        await conn.execute("CREATE TABLE public.orders (id int PRIMARY KEY, total int NOT NULL)")
        await conn.commit()
    await until(lambda: registered(settings), timeout=60, what="the worker's job types")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBCORE_")}
    env["JOBCORE_TEST_DATABASE_URL"] = settings.database_url
    npm = await asyncio.create_subprocess_exec(
        "npm",
        "test",
        cwd=SQL_NODE,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        raw, _ = await asyncio.wait_for(npm.communicate(), NPM_TIMEOUT)
    except TimeoutError:
        npm.kill()
        await npm.wait()
        raise
    output = raw.decode(errors="replace")
    results = {name: not failed for failed, name in TAP_RESULT.findall(output)}
    missing = [name for name in NODE_TESTS if name not in results]
    failed = sorted(name for name, passed in results.items() if not passed)
    report = (
        f"npm test exited {npm.returncode}; failed: {failed}; not run: {missing}\n{output}"
        f"\n--- worker log ---\n{stack.logs('worker')[-3000:]}"
    )
    assert not missing, report
    assert not failed, report
    assert npm.returncode == 0, report
