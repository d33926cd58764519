"""Schemathesis's own command, ``st run --checks all``, against a live ``jobcore api``
process: every operation in /openapi.json, with requests valid and invalid for it, and
every check schemathesis has — no answer is a 500; status, content type, headers and body
are as documented; valid requests are accepted and invalid ones refused; a 405 and an
OPTIONS answer list exactly the methods of their path; requests without the key are
refused — plus one of ours: every error is this API's problem JSON.

What the document cannot state is in tests/security/schemathesis_hooks.py (``run_at`` and
``delay`` exclude each other, a cursor is one the API handed out, a key reused with a
different request is refused, callback hosts resolve): it adjusts the requests
schemathesis generates as valid, never what counts as a failure. The API runs with a
1 s cap on long-polls (the stateful phase waits on the jobs it creates, and no worker
ends them) and allows the loopback callback host the hooks use.

The test seeds what the operations on one row need to get past 404: two quarantined outbox
rows, one succeeded job, a workflow and an open batch. The seed is fixed so the run is the
same each time; run the command in ``schemathesis.toml`` (or the README) without
``--seed`` to explore further.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from jobcore.database.gateway import Database, execute, fetch_one
from jobcore.database.sql import Query
from jobcore.kernel.scopes import Scope
from jobcore.kernel.settings import Settings
from jobcore.testing.processes import ROOT, jobcore_process
from jobcore.testing.waiting import eventually_sync
from jobcore.usecases import keys as key_usecases
from tests.e2e.stack import free_port
from tests.security.schemathesis_hooks import CALLBACK_HOST

pytestmark = pytest.mark.timeout(540)

CONFIG = Path(__file__).with_name("schemathesis.toml")
# Per operation and phase: about 35 s for the whole API on this 2-core machine.
EXAMPLES = 20
SEED = "20261201"
START_TIMEOUT = 60.0
# A guard against a hang, not a speed bar: quiet, the run takes about 45 s; beside three
# test workers and benchmarks on the same two cores it once passed 240 s.
RUN_TIMEOUT = 420.0


QUARANTINE = Query(
    "test_quarantine_job_message",
    "Quarantine a job's outbox row as the relay would on an unpublishable message.",
    """
    UPDATE jobcore.outbox SET quarantined_at = now(), attempts = 1, failing_since = now(),
                      last_error = 'refused by the broker'
    WHERE job_id = %(id)s
    RETURNING id
    """,
)

SUCCEED = Query(
    "test_succeed_job",
    "End a job as a worker would, with a small inline result.",
    """
    UPDATE jobcore.jobs SET status = 'succeeded', attempts = 1, result = '{"rows": 3}'::jsonb,
                    started_at = now(), finished_at = now(), updated_at = now()
    WHERE id = %(id)s
    """,
)


async def _create_key(settings: Settings) -> str:
    db = Database(settings, min_size=0, max_size=1)
    await db.open(wait=True)
    try:
        created = await key_usecases.create_key(
            db, "schemathesis", "contract", scopes=list(Scope), actor="tests"
        )
        return created.key
    finally:
        await db.close()


async def _seed(settings: Settings, job_ids: list[str]) -> list[int]:
    """The outbox row ids of the first two of ``job_ids``, quarantined; the third succeeded."""
    db = Database(settings, min_size=0, max_size=1)
    await db.open(wait=True)
    try:
        async with db.unit_of_work() as uow:
            rows = [await fetch_one(uow, QUARANTINE({"id": uuid.UUID(j)})) for j in job_ids[:2]]
            await execute(uow, SUCCEED({"id": uuid.UUID(job_ids[2])}))
            await uow.commit()
    finally:
        await db.close()
    return [int(row["id"]) for row in rows if row is not None]


def _config_with_data(path: Path, url: str, key: str, settings: Settings) -> Path:
    """The module config, plus a quarantined outbox row for each of the two routes that
    act on one, a succeeded job for the result and payload routes, a cancelled job for the
    admin retry, a workflow for the retry of one of its jobs, and an open batch to add jobs
    to: without them these only ever answer 404 (or 409), unless the stateful phase happens
    on an id first."""
    auth = {"Authorization": f"Bearer {key}"}
    job_ids = [
        httpx.post(f"{url}/jobs/echo", json={"text": "q"}, headers=auth, timeout=10).json()[
            "job_id"
        ]
        for _ in range(3)
    ]
    requeue, discard = asyncio.run(_seed(settings, job_ids))
    workflow = httpx.post(
        f"{url}/workflows",
        json={"jobs": [{"name": "only", "type": "noop", "payload": {}}]},
        headers=auth,
        timeout=10,
    )
    assert workflow.status_code == 201, workflow.text
    cancelled = httpx.post(
        f"{url}/jobs/echo", json={"text": "c"}, params={"delay": 600}, headers=auth, timeout=10
    ).json()["job_id"]
    answer = httpx.post(f"{url}/jobs/{cancelled}/cancel", headers=auth, timeout=10)
    assert answer.status_code == 200, answer.text
    batch = httpx.post(f"{url}/batches", json={"open": True}, headers=auth, timeout=10)
    assert batch.status_code == 201, batch.text
    path.write_text(
        CONFIG.read_text()
        + f"""
[[operations]]
include-path = "/admin/outbox/{{row}}/requeue"
parameters = {{ "path.row" = "{requeue}" }}

[[operations]]
include-path = "/admin/outbox/{{row}}/discard"
parameters = {{ "path.row" = "{discard}" }}

[[operations]]
include-path = "/jobs/{{job_id}}/result"
parameters = {{ "path.job_id" = "{job_ids[2]}" }}

[[operations]]
include-path = "/jobs/{{job_id}}/payload"
parameters = {{ "path.job_id" = "{job_ids[2]}" }}

[[operations]]
include-path = "/admin/jobs/{{job_id}}/retry"
parameters = {{ "path.job_id" = "{cancelled}" }}

[[operations]]
include-path = "/workflows/{{workflow_id}}/jobs/{{name}}/retry"
parameters = {{ "path.workflow_id" = "{workflow.json()["id"]}", "path.name" = "only" }}

[[operations]]
include-path = "/batches/{{batch_id}}/jobs"
parameters = {{ "path.batch_id" = "{batch.json()["id"]}" }}
"""
    )
    return path


def _st() -> str:
    found = Path(sys.executable).with_name("st")
    return str(found) if found.exists() else shutil.which("st") or "st"


def _ready(url: str, api: subprocess.Popen[bytes], log: Path) -> bool:
    if api.poll() is not None:
        raise AssertionError(f"jobcore api exited:\n{log.read_text(errors='replace')[-3000:]}")
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_st_run_with_every_check_finds_nothing(settings: Settings, tmp_path: Path) -> None:
    key = asyncio.run(_create_key(settings))
    url = f"http://127.0.0.1:{free_port()}"
    log = tmp_path / "api.log"
    with jobcore_process(
        settings,
        "api",
        "--port",
        url.rsplit(":", 1)[1],
        log_path=log,
        JOBCORE_WEBHOOK_ALLOWED_HOSTS=CALLBACK_HOST,
        JOBCORE_API_MAX_WAIT="1",
    ) as api:
        eventually_sync(
            lambda: _ready(url, api, log), timeout=START_TIMEOUT, what="jobcore api to be ready"
        )
        paths = httpx.get(f"{url}/openapi.json", timeout=10).json()["paths"]
        operations = [f"{method} {path}" for path, item in paths.items() for method in item]
        command = [
            _st(),
            "--config-file",
            str(_config_with_data(tmp_path / "schemathesis.toml", url, key, settings)),
            "run",
            f"{url}/openapi.json",
            "--checks",
            "all",
            "--max-examples",
            str(EXAMPLES),
            "--seed",
            SEED,
            # One worker: with several, Hypothesis's ast.parse (describing a strategy)
            # failed here in another thread ("AST constructor recursion depth mismatch").
            "--workers",
            "1",
            "--no-color",
        ]
        env = {**os.environ, "JOBCORE_ST_API_KEY": key, "PYTHONPATH": str(ROOT)}
        run = subprocess.run(
            command,
            env=env,
            cwd=tmp_path,  # anything schemathesis writes stays out of the checkout
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            check=False,
        )
    output = run.stdout + run.stderr
    (tmp_path / "st.out").write_text(output)  # the whole report, for a failing run
    # The key is filtered from schemathesis's output; make sure before showing any of it.
    assert key not in output
    assert run.returncode == 0, output[-12000:]
    summary = output.strip().splitlines()[-1]
    assert re.fullmatch(r"=+ .* in [\d.]+s =+", summary), summary
    assert not re.search(r"\b(failures?|errors?)\b", summary), summary
    assert re.search(r"(\d+) generated, \1 passed", output), output[-3000:]
    # The seeded rows and job were reached: no operation answered only 404.
    assert "Missing test data" not in output, output[-3000:]
    # Every operation was tested, the eight /admin ones among them: jobs (list, show,
    # cancel, retry), the outbox (list, requeue, discard) and keys.
    assert f"Selected: {len(operations)}/{len(operations)}" in output, output[-3000:]
    assert f"Tested: {len(operations)}" in output, output[-3000:]
    assert len(operations) >= 16
    assert sum("/admin/" in operation for operation in operations) == 8
