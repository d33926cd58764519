"""Job queues dead-letter at least once; queues declared before that keep working.

RabbitMQ refuses to declare an existing queue with other arguments (PRECONDITION_FAILED,
which closes the channel), so these tests tell the arguments a queue has by declaring it
again with others.
"""

from __future__ import annotations

import subprocess
from typing import Any

import aio_pika
import aiormq
import orjson
import pytest

from jobcore.amqp.publisher import ConfirmedPublisher
from jobcore.amqp.topology import WEBHOOKS_QUEUE, Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.jobtypes import EffectPayload
from jobcore.testing.processes import jobcore_command, settings_env
from jobcore.testing.waiting import eventually
from tests.integration.worker.conftest import StartWorker
from tests.integration.worker.support import OutboxPump, status_is, submit

OLD_QUEUES = ("testq", WEBHOOKS_QUEUE)


def topology_cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobcore_command("topology", *args),
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def declare_raw(settings: Settings, name: str, arguments: dict[str, Any]) -> str | None:
    """Declare a queue with these arguments; the broker's refusal, or None if it took it."""
    connection = await aio_pika.connect(settings.amqp_url, timeout=5)
    async with connection:
        channel = await connection.channel()
        try:
            await channel.declare_queue(name, durable=True, arguments=arguments)
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            return str(exc)
    return None


async def test_job_queues_and_the_webhooks_queue_dead_letter_at_least_once(
    settings: Settings, topology: Topology, broker_cleanup: None
) -> None:
    result = topology_cli(settings, "--json")
    assert result.returncode == 0, result.stderr
    declared = orjson.loads(result.stdout)
    assert {q["dead_lettering"] for q in declared["queues"]} == {"at-least-once"}
    assert declared["dead_letter_notes_queue"] == topology.dead_letter_notes_queue
    names = [q["queue"] for q in declared["queues"]]
    assert topology.queue_name(WEBHOOKS_QUEUE) in names
    assert topology.queue_name("testq") in names
    for name in names:
        refusal = await declare_raw(settings, name, topology.at_most_once_arguments)
        assert refusal is not None
        assert "x-dead-letter-strategy" in refusal
        assert await declare_raw(settings, name, topology.queue_arguments) is None


async def test_queues_declared_before_keep_working_and_are_named(
    db: Database,
    wsettings: Settings,
    topology: Topology,
    pump: OutboxPump,
    start_worker: StartWorker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for queue in OLD_QUEUES:  # as an earlier release declared them
        name = topology.queue_name(queue)
        assert await declare_raw(wsettings, name, topology.at_most_once_arguments) is None

    result = topology_cli(wsettings, "--json")
    assert result.returncode == 0, result.stderr
    strategies = {q["queue"]: q["dead_lettering"] for q in orjson.loads(result.stdout)["queues"]}
    old = {topology.queue_name(q) for q in OLD_QUEUES}
    assert {name for name, s in strategies.items() if s == "at-most-once"} == old
    warnings = [line for line in result.stderr.splitlines() if "Queue arguments" in line]
    assert len(warnings) == len(OLD_QUEUES)

    # The relay's declaration path takes them as they are.
    publisher = ConfirmedPublisher(wsettings, queues=default_registry.queues())
    try:
        await publisher.connect()
        assert publisher.connected
    finally:
        await publisher.close()

    # And a worker consumes them (its declaration runs on its consuming channel).
    with caplog.at_level("WARNING", logger="jobcore.amqp.topology"):
        await start_worker()
    assert any(topology.queue_name("testq") in r.getMessage() for r in caplog.records)
    job_id = await submit(db, topology, "effect", EffectPayload())
    await eventually(lambda: status_is(db, job_id, "succeeded"), what="the job to run")
    # Still the old arguments: nothing re-declared them.
    refusal = await declare_raw(wsettings, topology.queue_name("testq"), topology.queue_arguments)
    assert refusal is not None


async def test_a_queue_with_other_arguments_fails_in_one_line(
    settings: Settings, topology: Topology, broker_cleanup: None
) -> None:
    other = Topology(settings.amqp_prefix, delivery_limit=settings.amqp_delivery_limit + 1)
    name = other.queue_name("testq")
    assert await declare_raw(settings, name, other.queue_arguments) is None

    result = topology_cli(settings)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert f"queue {name} exists with other arguments" in result.stderr
    assert "JOBCORE_AMQP_DELIVERY_LIMIT" in result.stderr
