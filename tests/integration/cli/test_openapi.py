"""`jobcore openapi` prints the document `GET /openapi.json` serves, for the job types of
JOBCORE_JOB_MODULES, without a database, broker or running API (the TypeScript client is
generated from it: scripts/ts_client.sh).

Both sides run in processes of their own: job types register in one registry per process,
so this test process (which has imported every test job type) would serve them all."""

from __future__ import annotations

import subprocess
import sys

import orjson

from jobcore.kernel.settings import Settings
from jobcore.testing.processes import jobcore_command, settings_env

UNREACHABLE = "postgresql://nobody@127.0.0.1:1/nothing"
# The app built from the same environment, asked over HTTP (in process, through ASGI).
SERVED = """
import asyncio, sys, httpx
from services.api.app import create_app

async def main():
    transport = httpx.ASGITransport(create_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://jobcore.test") as client:
        answer = await client.get("/openapi.json")
    answer.raise_for_status()
    sys.stdout.write(answer.text)

asyncio.run(main())
"""


def test_openapi_prints_the_served_document(settings: Settings) -> None:
    offline = settings.model_copy(update={"database_url": UNREACHABLE})
    env = settings_env(offline, JOBCORE_JOB_MODULES="jobcore.testing.jobtypes")
    printed = subprocess.run(
        jobcore_command("openapi"), env=env, capture_output=True, timeout=60, check=False
    )
    assert printed.returncode == 0, printed.stderr.decode()
    served = subprocess.run(
        [sys.executable, "-c", SERVED], env=env, capture_output=True, timeout=60, check=False
    )
    assert served.returncode == 0, served.stderr.decode()
    document = orjson.loads(printed.stdout)
    assert document == orjson.loads(served.stdout)
    assert "/jobs/echo" in document["paths"]
    assert "/jobs/noop" not in document["paths"]
