"""The TypeScript client's tests (clients/typescript, `npm test`) against a real API, relay
and worker, with the result store in an S3 bucket of the suite's server.

Node runs them; this test starts the processes, makes the two keys they use (one of a
tenant allowed one enqueue a second, for the 429 path) and checks that every named test
passed. Node's own output is printed when one did not.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.usecases import keys as key_usecases
from jobcore.usecases import quotas as quota_usecases
from tests.e2e.stack import E2EStack
from tests.support import s3
from tests.support.typescript import CLIENT, require_packages

pytestmark = pytest.mark.timeout(420)

# tsc and about ten tests, most waiting on jobs: a guard against a hang, not a speed bar.
NPM_TIMEOUT = 300.0
LIMITED_TENANT = "ts-limited"
# clients/typescript/test/api/api.test.ts: each must be reported passing.
API_TESTS = (
    "enqueue answers the job, and the same Idempotency-Key answers the same job",
    "wait long-polls until the job has succeeded",
    "wait gives up at its timeout with the job's last view",
    "result: an inline result is its JSON",
    "result: a result in S3 comes through the 302, without the API key",
    "cancel: a pending job is cancelled; cancelling it again is a 409",
    "409: a live job holding the unique key, and a result not ready",
    "422: an invalid payload names its field; a reused key with another request is refused",
    "401: a key the API does not know is an AuthenticationError",
    "429: an enqueue over the tenant's rate is retried after Retry-After, with its key",
)
TAP_RESULT = re.compile(r"^(not )?ok \d+ - (.+?)(?: # .*)?$", re.MULTILINE)


@pytest.fixture
def bucket() -> Iterator[str]:
    try:
        name = s3.new_bucket()
    except Exception as exc:
        pytest.fail(f"the suite's S3 server is not reachable: {exc}", pytrace=False)
    yield name
    s3.remove_bucket(name)


@pytest.fixture
async def stack(settings: Settings, bucket: str, tmp_path: Path) -> AsyncIterator[E2EStack]:
    stack = E2EStack(s3.s3_settings(settings, bucket), tmp_path)
    try:
        await stack.start()
        yield stack
    finally:
        await stack.stop()


async def limited_key(settings: Settings) -> str:
    """A key of a tenant whose enqueues are admitted one a second, with a burst of one."""
    db = Database(settings, min_size=0, max_size=1, name="jobcore-e2e")
    await db.open(wait=True)
    try:
        await quota_usecases.set_quotas(db, LIMITED_TENANT, enqueue_rate=1.0, enqueue_burst=1)
        created = await key_usecases.create_key(db, LIMITED_TENANT, "ts", actor="tests")
    finally:
        await db.close()
    return created.key


async def test_typescript_client_against_the_api(stack: E2EStack) -> None:
    require_packages()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBCORE_")}
    env |= {
        "JOBCORE_TEST_API_URL": stack.url("api"),
        "JOBCORE_TEST_API_KEY": stack.api_key,
        "JOBCORE_TEST_LIMITED_API_KEY": await limited_key(stack.settings),
    }
    npm = await asyncio.create_subprocess_exec(
        "npm",
        "test",
        cwd=CLIENT,
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
    missing = [name for name in API_TESTS if name not in results]
    failed = sorted(name for name, passed in results.items() if not passed)
    report = (
        f"npm test exited {npm.returncode}; failed: {failed}; not run: {missing}\n{output}"
        f"\n--- api log ---\n{stack.logs('api')[-3000:]}"
    )
    assert not missing, report
    assert not failed, report
    assert npm.returncode == 0, report
