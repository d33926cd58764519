"""Whatever is published to a job queue, a running worker process survives it.

The envelope's own fuzz test (test_envelope_fuzz.py) feeds the decoder; the worker's tests
(tests/integration/worker/test_poison.py) publish a few chosen poison messages to an
in-process worker. Here Hypothesis generates the messages — arbitrary bodies, arbitrary
AMQP headers and properties, JSON that is almost an envelope, envelopes naming types that
do not exist or disagreeing with their own ``type`` property — and publishes each to the
job queue of a real ``jobcore worker`` process. Each must end in the dead-letter queue,
the process must still run, and a good job submitted after it must succeed with its
effect recorded once.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aio_pika
import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.jobtypes import EffectPayload
from jobcore.testing.processes import jobcore_process
from jobcore.testing.waiting import eventually
from tests.integration.worker.support import OutboxPump, effects, status_is, submit, worker_env

QUEUE = "testq"
KNOWN_TYPES = {job_type.name for job_type in default_registry}

# Values AMQP field tables can carry (pamqp encodes these), nested a little.
header_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**31), max_value=2**31 - 1)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
headers = st.dictionaries(
    st.sampled_from(["traceparent", "tracestate", "x-envelope-version", "x-delivery-count"])
    | st.text(min_size=1, max_size=20),
    header_values,
    max_size=5,
)
# Integers beyond 64 bits are valid JSON a foreign publisher may send, so bodies are
# written with the standard library (orjson refuses to encode them).
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
unknown_types = st.text(max_size=40).filter(lambda t: t not in KNOWN_TYPES)


def envelope(job_type: str, **overrides: Any) -> bytes:
    body = {"v": 1, "job_id": str(uuid.uuid4()), "attempt": 1, "type": job_type, **overrides}
    return json_bytes(body)


def json_bytes(value: Any) -> bytes:
    return json.dumps(value).encode()


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _not_a_valid_envelope(body: bytes) -> bool:
    raw = orjson.loads(body)
    try:
        return not (
            raw["v"] == 1
            and _is_uuid(str(raw["job_id"]))
            and type(raw["attempt"]) is int
            and raw["type"] in KNOWN_TYPES
            and set(raw) == {"v", "job_id", "attempt", "type"}
        )
    except (KeyError, TypeError):
        return True


# Each one is a (body, message_id, type property) that can never be run.
poison = st.one_of(
    # Anything at all as the body (the decoder refuses it), any id and type.
    st.tuples(st.binary(max_size=600), st.none() | st.text(max_size=40), st.none() | st.text()),
    # Valid JSON that is not an envelope.
    st.tuples(
        json_values.map(json_bytes), st.uuids().map(str), st.none() | st.sampled_from(["echo"])
    ),
    # An envelope for a type no worker knows.
    st.tuples(unknown_types.map(envelope), st.uuids().map(str), st.none()),
    # An envelope whose ``type`` property disagrees with its body.
    st.tuples(
        st.sampled_from(sorted(KNOWN_TYPES)).map(envelope),
        st.uuids().map(str),
        unknown_types.filter(bool),
    ),
    # A good envelope whose message id is not a UUID (the inbox could not dedupe it). Not
    # empty: the client library fills in a random UUID for a missing message id.
    st.tuples(
        st.just(envelope("effect")),
        st.text(min_size=1, max_size=40).filter(lambda t: not _is_uuid(t)),
        st.none(),
    ),
    # Envelopes with a field wrong or extra.
    st.tuples(
        st.builds(
            lambda key, value: envelope("effect", **{key: value}),
            st.sampled_from(["v", "job_id", "attempt", "type", "extra"]),
            json_values,
        ).filter(_not_a_valid_envelope),
        st.uuids().map(str),
        st.none(),
    ),
)


async def dead_letters(channel: aio_pika.abc.AbstractChannel, topology: Topology) -> int:
    queue = await channel.declare_queue(topology.dead_letter_queue, passive=True)
    return int(queue.declaration_result.message_count or 0)


@pytest.fixture
async def worker_process(settings: Settings, tmp_path: Path) -> AsyncIterator[Any]:
    log = tmp_path / "worker.log"
    env = {**worker_env(settings), "JOBCORE_WORKER_HEALTH_PORT": "0"}
    with jobcore_process(settings, "worker", log_path=log, **env) as proc:

        async def consuming() -> bool:
            assert proc.poll() is None, log.read_text()
            return "worker consuming" in log.read_text(errors="replace")

        await eventually(consuming, timeout=60, interval=0.05, what="the worker to consume")
        yield proc, log


@pytest.fixture
async def publisher(settings: Settings, db: Database) -> AsyncIterator[OutboxPump]:
    pump = OutboxPump(settings, db)
    try:
        yield pump
    finally:
        await pump.close()
        connection = await aio_pika.connect(settings.amqp_url, timeout=10)
        async with connection:
            topology = Topology.from_settings(settings)
            await topology.delete(await connection.channel(), default_registry.queues())


@pytest.mark.timeout(300)
@settings(
    max_examples=80,
    deadline=None,
    # One worker process for every example is the point: none may break it.
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(message=poison, message_headers=headers)
# Found by this test: a type PostgreSQL cannot take (NUL) was requeued until the delivery
# limit. Pinned here, since the saved-examples database is not in the repository.
@example(message=(envelope("\x00"), str(uuid.uuid4()), None), message_headers={})
async def test_whatever_is_published_ends_in_the_dead_letter_queue_and_the_worker_lives_on(
    worker_process: Any,
    publisher: OutboxPump,
    db: Database,
    topology: Topology,
    message: tuple[bytes, str | None, str | None],
    message_headers: dict[str, Any],
) -> None:
    proc, log = worker_process
    body, message_id, message_type = message
    channel = await publisher.channel()
    before = await dead_letters(channel, topology)
    exchange = await channel.get_exchange(topology.jobs_exchange)
    await exchange.publish(
        aio_pika.Message(
            body,
            headers=message_headers,
            message_id=message_id,
            type=message_type,
            content_type="application/json",
        ),
        routing_key=QUEUE,
        mandatory=True,
    )

    async def dead_lettered() -> bool:
        return await dead_letters(channel, topology) == before + 1

    await eventually(
        dead_lettered,
        timeout=20,
        what=f"the message in the dead-letter queue: {message!r} {message_headers!r}",
    )
    assert proc.poll() is None, log.read_text()[-3000:]

    # The next good job runs, exactly once.
    job_id = await submit(db, topology, "effect", EffectPayload(n=1))
    await publisher.drain()
    await eventually(lambda: status_is(db, job_id, "succeeded"), timeout=20, what="a good job")
    assert len(await effects(db, job_id)) == 1
    assert proc.poll() is None
