"""One trace from the HTTP request to the handler, across three processes.

The API, a relay and a worker run as separate processes and append their spans to one
file. The request span, the enqueue span, the publish span, the process span and the
handler span must share the trace id of the caller's ``traceparent`` and form one chain
of parents. A retry (documented in docs/explanation/tracing.md) stays in the same
trace: its message carries the job's stored context, so the second publish is a child
of the same enqueue span.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from jobcore.kernel.settings import Settings
from tests.e2e.stack import E2EStack, until
from tests.integration.worker.support import relayed

pytestmark = pytest.mark.timeout(240)

CLIENT_TRACE_ID = os.urandom(16).hex()
CLIENT_SPAN_ID = os.urandom(8).hex()


@pytest.fixture
async def stack(settings: Settings, tmp_path: Path) -> AsyncIterator[E2EStack]:
    # Relayed: the trace's publish span is a relay's (a job a worker takes from the outbox
    # itself has none; its process span continues the request's trace from the job row).
    stack = E2EStack(relayed(settings), tmp_path)
    try:
        await stack.start()
        yield stack
    finally:
        await stack.stop()


def traceparent(trace_id: str, span_id: str) -> str:
    return f"00-{trace_id}-{span_id}-01"


async def stopped_spans(stack: E2EStack, trace_id: str, wanted: int) -> list[dict[str, Any]]:
    """Stop the processes (they flush at exit); the trace's spans once ``wanted`` of the
    pipeline's spans arrived (bounded by a deadline)."""
    codes = await stack.stop()
    assert codes == {"api": 0, "relay": 0, "worker": 0}, codes
    names = {"POST /jobs/echo", "POST /jobs/flaky", "enqueue", "handler"}
    found: list[dict[str, Any]] = []

    async def flushed() -> bool:
        found[:] = [s for s in stack.spans() if s["trace_id"] == trace_id]
        return sum(1 for s in found if s["name"] in names or messaging(s)) >= wanted

    await until(flushed, timeout=10, what=f"{wanted} spans of trace {trace_id}")
    return found


def messaging(span: dict[str, Any]) -> str | None:
    """A messaging span's operation (publish, process), None for any other span."""
    operation = span["attributes"].get("messaging.operation.name")
    return str(operation) if operation is not None else None


def named(span: dict[str, Any], name: str) -> bool:
    """``publish`` and ``process`` stand for the messaging spans, whose names carry their
    destination (``publish {exchange}:{routing key}``)."""
    return messaging(span) == name or span["name"] == name


def one(spans: list[dict[str, Any]], name: str, **where: Any) -> dict[str, Any]:
    matching = [s for s in spans if named(s, name) and all(s.get(k) == v for k, v in where.items())]
    assert len(matching) == 1, f"{name} {where}: {matching}"
    return matching[0]


def children(
    spans: list[dict[str, Any]], parent: dict[str, Any], name: str
) -> list[dict[str, Any]]:
    return [s for s in spans if s["parent_span_id"] == parent["span_id"] and named(s, name)]


async def test_request_enqueue_publish_process_handler_are_one_trace(stack: E2EStack) -> None:
    async with stack.client() as client:
        answer = await client.post(
            "/jobs/echo",
            json={"text": "traced"},
            headers={"traceparent": traceparent(CLIENT_TRACE_ID, CLIENT_SPAN_ID)},
        )
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["job_id"]
        await stack.wait_status(client, job_id, "succeeded")

    spans = await stopped_spans(stack, CLIENT_TRACE_ID, wanted=5)

    request = one(spans, "POST /jobs/echo")
    assert request["kind"] == "SERVER"
    assert request["service"] == "jobcore-api-e2e"
    assert request["parent_span_id"] == CLIENT_SPAN_ID  # continues the caller's trace
    assert request["attributes"]["http.route"] == "/jobs/echo"
    assert request["attributes"]["http.response.status_code"] == 202

    enqueue = one(spans, "enqueue")
    assert enqueue["parent_span_id"] == request["span_id"]
    assert enqueue["kind"] == "INTERNAL"
    assert enqueue["attributes"]["job.id"] == job_id
    assert enqueue["attributes"]["job.type"] == "echo"
    assert enqueue["attributes"]["tenant"] == "e2e"
    # The enqueue statement is a database span under it, named after its Query; the key
    # lookup, which comes before anything else, is the request's only other statement.
    statements = [
        s["attributes"]["db.query.summary"]
        for s in spans
        if s["parent_span_id"] == enqueue["span_id"] and "db.query.summary" in s["attributes"]
    ]
    assert statements == ["job_insert_plain"]  # a job with no idempotency or unique key
    assert [
        s["attributes"]["db.query.summary"]
        for s in spans
        if s["parent_span_id"] == request["span_id"] and "db.query.summary" in s["attributes"]
    ] == ["api_key_authenticate"]

    publish = one(spans, "publish")
    assert publish["service"] == "jobcore-relay-e2e"
    assert publish["kind"] == "PRODUCER"
    assert publish["parent_span_id"] == enqueue["span_id"]
    destination = publish["attributes"]["messaging.destination.name"]
    assert publish["name"] == f"publish {destination}"

    process = one(spans, "process")
    assert process["service"] == "jobcore-worker-e2e"
    assert process["kind"] == "CONSUMER"
    assert process["parent_span_id"] == publish["span_id"]
    assert process["name"] == f"process {process['attributes']['messaging.destination.name']}"
    assert (
        process["attributes"]["messaging.message.id"]
        == publish["attributes"]["messaging.message.id"]
    )

    handler = one(spans, "handler")
    assert handler["parent_span_id"] == process["span_id"]
    assert handler["attributes"]["job.id"] == job_id
    assert handler["attributes"]["job.type"] == "echo"
    assert handler["attributes"]["job.attempt"] == 1
    assert (
        handler["attributes"]["messaging.message.id"]
        == publish["attributes"]["messaging.message.id"]
    )
    assert handler["status"] != "ERROR"
    # The claim statement ran inside the process span (echo has no gate: the claim that
    # takes no gate lock).
    assert any(
        s["attributes"].get("db.query.summary") == "job_claim_ungated"
        for s in children(spans, process, "job_claim_ungated")
    )

    # Every log line the worker wrote about this job inside its spans names the trace.
    worker_lines = [line for line in stack.logs("worker").splitlines() if job_id in line]
    assert all(CLIENT_TRACE_ID in line for line in worker_lines if '"span_id"' in line)


async def test_a_retry_stays_in_the_trace_of_the_request(stack: E2EStack) -> None:
    trace_id = os.urandom(16).hex()
    async with stack.client() as client:
        answer = await client.post(
            "/jobs/flaky",
            json={"succeed_on_attempt": 2},
            headers={"traceparent": traceparent(trace_id, os.urandom(8).hex())},
        )
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["job_id"]
        job = await stack.wait_status(client, job_id, "succeeded")
        assert job["attempts"] == 2

    # request, enqueue, and two of each of publish, process and handler
    spans = await stopped_spans(stack, trace_id, wanted=8)

    enqueue = one(spans, "enqueue")
    publishes = children(spans, enqueue, "publish")
    assert len(publishes) == 2, "each attempt's message is published as a child of enqueue"
    handlers: dict[int, dict[str, Any]] = {}
    for publish in publishes:
        [process] = children(spans, publish, "process")
        [handler] = children(spans, process, "handler")
        handlers[handler["attributes"]["job.attempt"]] = handler
    assert sorted(handlers) == [1, 2]
    assert handlers[1]["status"] == "ERROR"  # attempt 1 raised; the retry was scheduled
    assert handlers[1]["attributes"]["error.type"]  # the exception's class
    assert "error.type" not in handlers[2]["attributes"]
    assert handlers[2]["status"] != "ERROR"
    assert handlers[1]["start"] < handlers[2]["start"]
