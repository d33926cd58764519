"""Every span kind jobcore emits carries what the OpenTelemetry semantic conventions require.

The API (in-process over ASGI), a relay and a worker run against the real PostgreSQL and
RabbitMQ with an SDK tracer provider whose in-memory exporter collects their spans. A job
runs end to end, and each failure a span records is provoked once: a message the broker
returns (publish), a message that is no envelope (process), a statement PostgreSQL refuses
(database). Then every span of each kind is checked against its conventions' attributes of
requirement level "Required", and "Conditionally Required" where the condition holds:

- HTTP server: ``docs/http/http-spans.md`` (FastAPI's own spans);
- publish and process: ``docs/messaging/rabbitmq.md`` and ``messaging-spans.md``;
- database: ``docs/database/postgresql.md`` and ``database-spans.md``.

The worker emits no receive or settle spans (the acknowledgement is inside the process
span), so there are none to check.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.util._once import Once

import jobcore.telemetry.traces
from jobcore.amqp.topology import Topology
from jobcore.database.gateway import Database
from jobcore.execution.registry import default_registry
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from jobcore.usecases import keys as key_usecases
from services.api.app import create_app
from services.worker.app import Worker
from tests.integration.relay.helpers import fill_outbox, running_relay
from tests.integration.worker.support import relayed, worker_settings

pytestmark = pytest.mark.timeout(120)

POSTGRES_DEFAULT_PORT = 5432
KNOWN_METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "CONNECT", "TRACE"}

# Requirement level "Required" of each span kind, from the conventions' tables.
REQUIRED: dict[str, tuple[str, ...]] = {
    "http.server": ("http.request.method", "url.path", "url.scheme"),
    "messaging": (
        "messaging.system",
        "messaging.operation.name",
        # Conditionally Required "if applicable": both operations are of a defined type.
        "messaging.operation.type",
        # Required by the RabbitMQ conventions (one message per span).
        "messaging.destination.name",
    ),
    "db.client": ("db.system.name",),
}


@pytest.fixture
def recorded_spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider for this test alone, exporting to memory.

    OpenTelemetry installs a global provider once per process; like its own test kit
    (``opentelemetry.test.globals_test``), this resets the globals around the test so the
    tests after it run untraced again.
    """
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "jobcore-conventions"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(jobcore.telemetry.traces, "_recording", False)
    trace.set_tracer_provider(provider)
    try:
        yield memory
    finally:
        provider.shutdown()
        # monkeypatch puts back the untraced globals


def attributes(span: ReadableSpan) -> Mapping[str, Any]:
    return span.attributes or {}


def failed(span: ReadableSpan) -> bool:
    return span.status.status_code is StatusCode.ERROR


def missing(span: ReadableSpan, names: tuple[str, ...]) -> list[str]:
    return [name for name in names if attributes(span).get(name) in (None, "")]


def check_http_server(span: ReadableSpan, queries: Mapping[str, str]) -> list[str]:
    a = attributes(span)
    problems = missing(span, REQUIRED["http.server"])
    if a.get("http.request.method") not in KNOWN_METHODS | {"_OTHER"}:
        problems.append(f"http.request.method {a.get('http.request.method')!r}")
    if "http.response.status_code" not in a:  # a response was sent for every request
        problems.append("http.response.status_code")
    if "http.route" not in a:  # every request here matched a route
        problems.append("http.route")
    if queries.get(str(a.get("url.path"))) and "url.query" not in a:
        problems.append("url.query")
    if "server.address" in a and "server.port" not in a:
        problems.append("server.port")
    if failed(span) != ("error.type" in a):
        problems.append("error.type (set if and only if the request failed)")
    status = int(a.get("http.response.status_code", 0))
    if status >= 500 and "error.type" not in a:
        problems.append("error.type for a 5xx")
    return problems


def check_messaging(span: ReadableSpan, operation: str) -> list[str]:
    a = attributes(span)
    problems = missing(span, REQUIRED["messaging"])
    if a.get("messaging.system") != "rabbitmq":
        problems.append("messaging.system = rabbitmq")
    destination = a.get("messaging.destination.name")
    if span.name != f"{a.get('messaging.operation.name')} {destination}":
        problems.append(f"name {span.name!r} is not '{{operation}} {{destination}}'")
    routing_key = a.get("messaging.rabbitmq.destination.routing_key")
    if operation == "publish":
        if span.kind is not SpanKind.PRODUCER or a.get("messaging.operation.type") != "send":
            problems.append("a publish is a PRODUCER span of type send")
        # Destination "{exchange}:{routing key}" (only the non-empty parts): the routing
        # key is Conditionally Required "if not empty".
        if str(destination).count(":") == 1 and not routing_key:
            problems.append("messaging.rabbitmq.destination.routing_key")
    else:
        if span.kind is not SpanKind.CONSUMER or a.get("messaging.operation.type") != "process":
            problems.append("a process is a CONSUMER span of type process")
        # Available on every delivery: Conditionally Required "when available".
        if not isinstance(a.get("messaging.rabbitmq.message.delivery_tag"), int):
            problems.append("messaging.rabbitmq.message.delivery_tag")
    # Conditionally Required "if available": the broker's address is configured.
    if "server.address" not in a:
        problems.append("server.address")
    if failed(span) != ("error.type" in a):
        problems.append("error.type (set if and only if the operation failed)")
    return problems


def check_database(span: ReadableSpan, settings: Settings) -> list[str]:
    a = attributes(span)
    problems = missing(span, REQUIRED["db.client"])
    if span.kind is not SpanKind.CLIENT:
        problems.append("kind CLIENT")
    if a.get("db.system.name") != "postgresql":
        problems.append("db.system.name = postgresql")
    # Conditionally Required "if available without an additional network call".
    database = urlsplit(settings.database_url).path.lstrip("/")
    if a.get("db.namespace") != database:
        problems.append(f"db.namespace = {database}")
    # Conditionally Required "if using a port other than the default and server.address
    # is set".
    port = urlsplit(settings.database_url).port or POSTGRES_DEFAULT_PORT
    if "server.address" in a and port != POSTGRES_DEFAULT_PORT and a.get("server.port") != port:
        problems.append("server.port")
    if "db.query.summary" in a and span.name != a["db.query.summary"]:
        problems.append("the span is named by db.query.summary")
    if failed(span) != ("error.type" in a):
        problems.append("error.type (set if and only if the statement failed)")
    return problems


def kind_of(span: ReadableSpan) -> str | None:
    a = attributes(span)
    if span.kind is SpanKind.SERVER and "http.request.method" in a:
        return "http.server"
    if "messaging.system" in a or span.name.startswith(("publish ", "process ")):
        return str(a.get("messaging.operation.name", "messaging"))
    if "db.system.name" in a or "db.system" in a:
        return "db.client"
    return None


async def test_every_span_kind_carries_its_required_attributes(
    recorded_spans: InMemorySpanExporter, settings: Settings, topology: Topology
) -> None:
    # Relayed: the happy path's publish span is a relay's (a job a worker takes from the
    # outbox itself has none).
    settings = relayed(settings)
    wsettings = worker_settings(settings)
    # Opened now that tracing is on, so its pool uses the traced cursor.
    db = Database(settings)
    await db.open(wait=True)
    worker = Worker(wsettings)
    app = create_app(settings)
    try:
        key = (await key_usecases.create_key(db, "semconv", "tests", actor="tests")).key
        auth = {"Authorization": f"Bearer {key}"}
        await worker.start()

        async def consuming() -> bool:
            return worker.consumer.consuming

        await eventually(consuming, what="the worker to consume")
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app), base_url="http://jobcore.test:8080"
            ) as client,
            running_relay(settings, db),
        ):
            # The happy path: request, enqueue, publish, process, handler, statements.
            answer = await client.post("/jobs/echo", json={"text": "conventions"}, headers=auth)
            assert answer.status_code == 202, answer.text
            job_id = answer.json()["job_id"]

            async def succeeded() -> bool:
                reply = await client.get(f"/jobs/{job_id}", params={"wait": "1"}, headers=auth)
                return bool(reply.json()["status"] == "succeeded")

            await eventually(succeeded, timeout=30, what="the job to succeed")
            # A refused request: no error on a server span for a 4xx.
            assert (await client.post("/jobs/echo", json={}, headers=auth)).status_code == 422

            # publish failure: a route no queue is bound to; the broker returns it.
            await fill_outbox(db, topology, 1, routing_key=f"nowhere.{uuid.uuid4().hex[:6]}")
            # process failure: not an envelope, sent through the default exchange.
            connection = await aio_pika.connect(settings.amqp_url, timeout=5)
            async with connection:
                channel = await connection.channel()
                await channel.default_exchange.publish(
                    aio_pika.Message(b"not an envelope", message_id=str(uuid.uuid4())),
                    routing_key=topology.queue_name("testq"),
                )

            def spans() -> list[ReadableSpan]:
                return list(recorded_spans.get_finished_spans())

            async def failures_recorded() -> bool:
                publish = [s for s in spans() if kind_of(s) == "publish" and failed(s)]
                process = [s for s in spans() if kind_of(s) == "process" and failed(s)]
                return bool(publish and process)

            await eventually(failures_recorded, timeout=30, what="a failed publish and process")
        # database failure: a statement PostgreSQL refuses, inside a recorded span.
        with trace.get_tracer("tests").start_as_current_span("caller"):
            async with db.connection() as conn:
                with pytest.raises(Exception, match="division by zero"):
                    await conn.execute("SELECT 1 / 0")
    finally:
        await worker.stop()
        await db.close()
        await _delete_topology(settings, topology)

    by_kind: dict[str, list[ReadableSpan]] = {}
    for span in recorded_spans.get_finished_spans():
        kind = kind_of(span)
        if kind is not None:
            by_kind.setdefault(kind, []).append(span)
    assert set(by_kind) == {"http.server", "publish", "process", "db.client"}, by_kind.keys()

    queries = {f"/jobs/{job_id}": "wait=1"}
    problems = {
        f"{kind} {span.name!r}": found
        for kind, spans_of_kind in by_kind.items()
        for span in spans_of_kind
        if (
            found := (
                check_http_server(span, queries)
                if kind == "http.server"
                else check_database(span, settings)
                if kind == "db.client"
                else check_messaging(span, kind)
            )
        )
    }
    assert problems == {}

    # Each failure is described by its error.type, and only failures are.
    publish_errors = {attributes(s).get("error.type") for s in by_kind["publish"]}
    assert publish_errors == {None, "returned"}
    process_errors = {attributes(s).get("error.type") for s in by_kind["process"]}
    assert process_errors == {None, "bad_envelope"}
    [refused] = [s for s in by_kind["db.client"] if failed(s)]
    assert attributes(refused)["error.type"] == "22012"  # division_by_zero
    assert attributes(refused)["db.response.status_code"] == "22012"

    # A process span is the child of its message's publish span and links to it.
    publishes = {s.context.span_id for s in by_kind["publish"] if s.context is not None}
    [job_process] = [s for s in by_kind["process"] if s.parent and s.parent.span_id in publishes]
    assert job_process.parent is not None
    assert [link.context.span_id for link in job_process.links] == [job_process.parent.span_id]

    # The default exchange is left out of the process destination; a named one is not.
    destinations = {attributes(s)["messaging.destination.name"] for s in by_kind["process"]}
    queue = topology.queue_name("testq")
    assert queue in destinations
    assert any(d.startswith(f"{topology.jobs_exchange}:") for d in destinations), destinations
    # The statement that inserts the job has one operation; its span names it (a job with
    # no idempotency or unique key: the plain insert's statement).
    [insert] = [s for s in by_kind["db.client"] if s.name == "job_insert_plain"]
    assert attributes(insert)["db.operation.name"] == "INSERT"
    requests = [attributes(s) for s in by_kind["http.server"]]
    assert {(r["http.request.method"], r["http.route"]) for r in requests} >= {
        ("POST", "/jobs/echo"),
        ("GET", "/jobs/{job_id}"),
    }


async def _delete_topology(settings: Settings, topology: Topology) -> None:
    connection = await aio_pika.connect(settings.amqp_url, timeout=5)
    async with connection:
        await topology.delete(await connection.channel(), default_registry.queues())
