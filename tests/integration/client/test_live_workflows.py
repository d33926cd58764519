"""A workflow through the whole stack (API, relay, RabbitMQ, worker processes) with the
blocking client: a diamond runs in dependency order, each job once."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from jobcore.client import Client, Workflow
from jobcore.kernel.settings import Settings
from jobcore.testing.pipeline import Stack

pytestmark = pytest.mark.timeout(240)

WAIT = 90.0


def run_diamond(url: str, key: str) -> Workflow:
    def echo(name: str, *deps: str) -> dict[str, object]:
        return {"name": name, "type": "echo", "payload": {"text": name}, "depends_on": list(deps)}

    with Client(url, key) as client:
        created = client.create_workflow(
            [echo("a"), echo("b", "a"), echo("c", "a"), echo("d", "b", "c")], name="diamond"
        )
        deadline = time.monotonic() + WAIT
        while True:
            workflow = client.workflow(created.id)
            if workflow.is_finished or time.monotonic() > deadline:
                return workflow
            time.sleep(0.2)


async def test_a_diamond_through_the_stack(settings: Settings, tmp_path: Path) -> None:
    async with Stack(settings, tmp_path / "logs", relays=1, workers=2) as stack:
        workflow = await asyncio.to_thread(run_diamond, stack.api_url, stack.api_key)
    assert workflow.status == "succeeded", workflow
    jobs = {job.name: job for job in workflow.jobs}
    assert {job.attempts for job in jobs.values()} == {1}
    assert jobs["a"].finished_at is not None
    for later, earlier in (("b", "a"), ("c", "a"), ("d", "b"), ("d", "c")):
        started, finished = jobs[later].started_at, jobs[earlier].finished_at
        assert started is not None
        assert finished is not None
        assert started >= finished, (later, earlier)
