"""`jobcore tenants set-quota|show|list` against the real PostgreSQL, as a separate
process: overrides are stored and shown, bad input is one line and a non-zero exit."""

from __future__ import annotations

import subprocess
from typing import Any

import orjson
import pytest

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.errors import TooManyUnfinishedJobs
from jobcore.kernel.settings import Settings
from jobcore.testing.jobtypes import EchoPayload
from jobcore.testing.processes import jobcore_command, settings_env
from jobcore.usecases.enqueue.submit import EnqueueRequest, enqueue


def tenants_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobcore_command("tenants", *args),
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )


def shown(settings: Settings, tenant: str) -> Any:
    result = tenants_cli(settings, "show", tenant, "--json")
    assert result.returncode == 0, result.stderr
    return orjson.loads(result.stdout)


async def test_set_show_and_list(db: Database, topology: Topology, settings: Settings) -> None:
    before = shown(settings, "acme")
    assert before["enqueue_rate"] == settings.quota_enqueue_rate
    assert before["max_unfinished"] == settings.quota_max_unfinished
    assert not before["enqueue_rate_set"]

    result = tenants_cli(
        settings,
        "set-quota",
        "acme",
        "--enqueue-rate",
        "600/min",
        "--enqueue-burst",
        "20",
        "--max-unfinished",
        "1",
        "--max-long-polls",
        "unlimited",
    )
    assert result.returncode == 0, result.stderr
    assert "10/s (override)" in result.stdout
    after = shown(settings, "acme")
    assert (after["enqueue_rate"], after["enqueue_burst"]) == (10.0, 20)
    assert (after["max_unfinished"], after["max_long_polls"]) == (1, 0)

    # The override is what the enqueue enforces (the defaults here are unlimited).
    for attempt in range(2):
        async with db.unit_of_work() as uow:
            try:
                await enqueue(
                    uow,
                    topology,
                    EnqueueRequest(
                        tenant="acme",
                        job_type=default_registry.get("echo"),
                        payload=EchoPayload(text="x"),
                    ),
                )
            except TooManyUnfinishedJobs:
                assert attempt == 1
            else:
                assert attempt == 0
            await uow.commit()
    assert shown(settings, "acme")["unfinished"] == 1

    # Naming one quota keeps the others; `default` drops an override.
    assert tenants_cli(settings, "set-quota", "acme", "--enqueue-rate", "default").returncode == 0
    again = shown(settings, "acme")
    assert not again["enqueue_rate_set"]
    assert again["enqueue_rate"] == settings.quota_enqueue_rate
    assert (again["enqueue_burst"], again["max_unfinished"]) == (20, 1)

    listed = tenants_cli(settings, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = orjson.loads(listed.stdout)
    assert row["tenant"] == "acme"
    assert (row["enqueue_rate"], row["enqueue_burst"], row["unfinished"]) == (None, 20, 1)


@pytest.mark.parametrize(
    "args",
    [
        ("set-quota", "acme", "--enqueue-rate", "fast"),
        ("set-quota", "acme", "--enqueue-rate", "-1/s"),
        ("set-quota", "acme", "--enqueue-rate", "5/fortnight"),
        ("set-quota", "acme", "--enqueue-burst", "0"),
        ("set-quota", "acme", "--max-unfinished", "1.5"),
        ("set-quota", "acme", "--max-long-polls", "many"),
        ("set-quota", "acme"),
        ("set-quota", "not a tenant", "--max-unfinished", "5"),
        ("show", "not a tenant"),
    ],
)
def test_bad_input_is_one_line_and_a_non_zero_exit(settings: Settings, args: tuple[str]) -> None:
    result = tenants_cli(settings, *args)
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("jobcore: ")
    assert "Traceback" not in result.stderr
    # Nothing was stored.
    assert shown(settings, "acme")["updated_at"] is None
