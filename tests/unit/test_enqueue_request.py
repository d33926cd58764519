"""An EnqueueRequest checks its fields when built, naming the field (never an HTTP
location), and computes the request fingerprint that the single and the batch enqueue
both store; the API locates the field errors where its routes take the fields."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import BaseModel

from jobcore.amqp.topology import Topology
from jobcore.execution.registry import JobContext, JobType, Registry
from jobcore.kernel.errors import (
    InvalidField,
    InvalidIdempotencyKey,
    InvalidPayload,
    InvalidUniqueKey,
)
from jobcore.kernel.priorities import Priority
from jobcore.kernel.states import JobStatus
from jobcore.usecases.enqueue import submit as enqueue_usecase
from jobcore.usecases.enqueue.submit import EnqueueRequest, request_fingerprint
from jobcore.usecases.enqueue.write_many import BatchItem, BatchResult
from jobcore.usecases.enqueue.write_one import EnqueueResult
from services.api.problems import located, problem_document
from services.api.routes.enqueue import field_location

HTTP_WORDS = {"query", "body", "header", "items"}


class Account(BaseModel):
    account: str | int | None = None
    note: str = ""


async def handler(ctx: JobContext[Account]) -> None:
    return None


def job_type() -> JobType[Any]:
    registry = Registry()
    registry.job("sync", payload=Account, unique_field="account")(handler)
    return registry.get("sync")


SYNC = job_type()


def request(**fields: Any) -> EnqueueRequest:
    payload = fields.pop("payload", Account())
    return EnqueueRequest(tenant="t", job_type=SYNC, payload=payload, **fields)


def refused(**fields: Any) -> InvalidField:
    with pytest.raises(InvalidField) as info:
        request(**fields)
    error = info.value
    # Named as the request names it: nothing about where an HTTP request carries it.
    assert not HTTP_WORDS & {error.field, *map(str, error.path)}, error
    return error


def test_bad_fields_raise_errors_that_name_the_field() -> None:
    now = datetime.now(UTC)
    cases: list[tuple[dict[str, Any], str, tuple[str | int, ...], str]] = [
        ({"idempotency_key": ""}, "idempotency_key", (), "idempotency_key"),
        ({"idempotency_key": "é"}, "idempotency_key", (), "idempotency_key"),
        ({"idempotency_key": "k" * 256}, "idempotency_key", (), "idempotency_key"),
        ({"run_at": now, "delay": 5.0}, "delay", (), "conflict"),
        ({"run_at": datetime(2030, 1, 1)}, "run_at", (), "timezone"),
        ({"run_at": now + timedelta(days=367)}, "run_at", (), "range"),
        ({"unique_key": ""}, "unique_key", (), "unique_key"),
        ({"unique_key": "a\x00b"}, "unique_key", (), "unique_key"),
        ({"unique_key": "k" * 256}, "unique_key", (), "unique_key"),
        ({"payload": Account(account="a" * 256)}, "payload", ("account",), "unique_key"),
    ]
    for fields, field, path, kind in cases:
        error = refused(**fields)
        assert (error.field, error.path, error.kind) == (field, path, kind), fields
        assert str(error).startswith(".".join(map(str, (field, *path))) + ": "), str(error)
    assert isinstance(refused(idempotency_key=""), InvalidIdempotencyKey)
    # A unique key that cannot be one is an invalid payload, the others invalid requests.
    assert isinstance(refused(unique_key=""), InvalidUniqueKey)
    assert isinstance(refused(unique_key=""), InvalidPayload)
    assert not isinstance(refused(run_at=datetime(2030, 1, 1)), InvalidPayload)


def test_a_valid_request_says_when_it_is_due_and_which_unique_key_it_holds() -> None:
    assert request().held_key is None
    assert request(payload=Account(account="acct-1")).held_key == "acct-1"
    # Not a string: canonical JSON. The request's own key wins over the payload's.
    assert request(payload=Account(account=7)).held_key == "7"
    assert request(payload=Account(account="a"), unique_key="mine").held_key == "mine"
    plus_two = timezone(timedelta(hours=2))
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=plus_two)
    assert request(run_at=at).due_at == at
    assert request(run_at=at).due_at.tzinfo is UTC  # type: ignore[union-attr]
    before = datetime.now(UTC)
    due = request(delay=60.0).due_at
    assert due is not None
    assert before + timedelta(seconds=60) <= due
    assert request().due_at is None


def test_the_api_locates_each_field_where_its_route_takes_it() -> None:
    delay = problem_document(located_for_enqueue(run_at=datetime.now(UTC), delay=1.0))
    assert delay["type"].endswith("/invalid-request")
    assert delay["detail"] == "The request's parameters are invalid."
    assert delay["errors"] == [
        {"loc": ["query", "delay"], "msg": "give run_at or delay, not both", "type": "conflict"}
    ]
    long_field = problem_document(located_for_enqueue(payload=Account(account="a" * 256)))
    assert long_field["type"].endswith("/invalid-payload")
    [error] = long_field["errors"]
    assert (error["loc"], error["type"]) == (["body", "account"], "unique_key")
    assert long_field["detail"] == error["msg"]
    key = problem_document(located_for_enqueue(idempotency_key=""))
    assert (key["status"], key["type"].rsplit("/", 1)[-1]) == (400, "invalid-idempotency-key")
    assert key["detail"] == "An Idempotency-Key is 1 to 255 printable ASCII characters."
    assert "errors" not in key


def located_for_enqueue(**fields: Any) -> Any:
    error = refused(**fields)
    return located(error, field_location(error.field))


# What request_fingerprint gave for these requests before EnqueueRequest existed: jobs
# store it, so a client's retry across the upgrade must hash the same.
PLAIN = "3290d59d9f9b6f9e896fa3ad4c720fbcc0368e65420abda593596937b950e32b"
DELAYED = "d33cb5508b0e2b2833e68739b1bce0eaf9db8c694d1a86ed7e698a6a901b122d"
FULL = "95df2518614f3df794e93e2be49288cc327f42b99647278caa0e52c17f5f7e40"


class Numbered(BaseModel):
    n: int = 0
    a: str = ""
    b: list[int] = []


def numbered_type() -> JobType[Any]:
    registry = Registry()
    registry.job("numbered", payload=Numbered)(handler)
    return registry.get("numbered")


NUMBERED = numbered_type()


def numbered(**fields: Any) -> EnqueueRequest:
    sent = fields.pop("sent")
    payload = Numbered.model_validate(sent)
    return EnqueueRequest(tenant="t", job_type=NUMBERED, payload=payload, sent=sent, **fields)


def test_the_fingerprint_is_the_requests_as_sent_and_did_not_change() -> None:
    plain = numbered(sent={"n": 1})
    assert plain.fingerprint == request_fingerprint(plain) == PLAIN
    # Computed from the payload as sent: the model's defaults are not in it.
    assert EnqueueRequest(
        tenant="t", job_type=plain.job_type, payload=plain.payload
    ).fingerprint not in (PLAIN, "")
    # A delay is the same request whenever it is retried, though it is due later.
    delayed = numbered(sent={"n": 1}, delay=30.0)
    assert delayed.fingerprint == numbered(sent={"n": 1}, delay=30.0).fingerprint == DELAYED
    full = {
        "callback_url": "https://example.com/h",
        "max_attempts": 3,
        "entity_id": "order-1",
        "unique_key": "u",
        "priority": Priority.HIGH,
        "ordering_key": "k",
        # Key order does not matter, nor the offset of the same instant.
        "run_at": datetime(2026, 1, 2, 1, 4, 5, tzinfo=UTC),
    }
    assert numbered(sent={"b": [1, 2], "a": "x"}, **full).fingerprint == FULL
    at_plus_two = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2)))
    reordered = numbered(sent={"a": "x", "b": [1, 2]}, **{**full, "run_at": at_plus_two})
    assert reordered.fingerprint == FULL
    # Who asks and from where is not the request: a schedule's origin, the API key.
    assert numbered(sent={"n": 1}, origin={"schedule": "s"}).fingerprint == PLAIN


async def test_single_and_batch_enqueues_store_the_requests_fingerprint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    written: list[str] = []

    async def write_job(uow: Any, params: Any, **_: Any) -> EnqueueResult:
        written.append(params["payload_fingerprint"])
        return EnqueueResult("t", params["id"], JobStatus.PENDING, datetime.now(UTC), False)

    async def write_batch(uow: Any, topology: Any, *, items: Sequence[BatchItem], **_: Any) -> Any:
        written.extend(item.fingerprint for item in items)
        return BatchResult("t", [])

    monkeypatch.setattr(enqueue_usecase, "write_job", write_job)
    monkeypatch.setattr(enqueue_usecase, "write_batch", write_batch)
    one, two = numbered(sent={"n": 1}), numbered(sent={"n": 2})
    await enqueue_usecase.enqueue(UOW, TOPOLOGY, one)
    await enqueue_usecase.enqueue_many(UOW, TOPOLOGY, [one, two])
    assert written == [PLAIN, PLAIN, two.fingerprint]
    assert two.fingerprint != PLAIN


async def test_a_batch_takes_only_what_one_statement_writes() -> None:
    other_tenant = EnqueueRequest(tenant="other", job_type=SYNC, payload=Account())
    cases = [
        ([], "at least one"),
        ([request(), other_tenant], "share their tenant"),
        ([request(priority=Priority.HIGH)], "no priority"),
    ]
    for requests, why in cases:
        with pytest.raises(ValueError, match=why):
            await enqueue_usecase.enqueue_many(UOW, TOPOLOGY, requests)


# Never used: the statements are replaced, or the request is refused first.
UOW: Any = None
TOPOLOGY = Topology("test")
