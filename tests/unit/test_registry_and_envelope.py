import uuid

import orjson
import pytest
from pydantic import BaseModel

from jobcore.execution.registry import JobContext, JobType, Registry
from jobcore.kernel.envelope import JobMessage, decode
from jobcore.kernel.errors import (
    DuplicateRegistration,
    InvalidPayload,
    PoisonMessage,
    UnknownJobType,
)


class Payload(BaseModel):
    n: int


async def handler(ctx: JobContext[Payload]) -> int:
    return ctx.payload.n


def test_registry_registers_validates_and_routes() -> None:
    registry = Registry()
    registry.job("double", payload=Payload, queue="math", max_attempts=7, timeout=2, lease=3)(
        handler
    )
    job_type = registry.get("double")
    assert (job_type.queue, job_type.max_attempts, job_type.timeout, job_type.lease) == (
        "math",
        7,
        2,
        3,
    )
    assert registry.queues() == {"math"}
    assert job_type.validate_payload({"n": "4"}).n == 4
    with pytest.raises(InvalidPayload) as info:
        job_type.validate_payload({"n": "four"})
    assert info.value.errors[0]["loc"] == ["n"]  # type: ignore[attr-defined]
    with pytest.raises(UnknownJobType):
        registry.get("triple")


def test_registering_a_different_type_under_a_taken_name_fails() -> None:
    registry = Registry()
    registry.job("a", payload=Payload)(handler)
    registry.job("a", payload=Payload)(handler)  # the same definition again is harmless
    with pytest.raises(DuplicateRegistration):
        registry.job("a", payload=Payload, queue="other")(handler)


@pytest.mark.parametrize(
    "kwargs",
    [{"name": "Bad-Name"}, {"queue": "has space"}, {"max_attempts": 0}, {"timeout": 0}],
)
def test_job_type_rejects_bad_definitions(kwargs: dict[str, object]) -> None:
    base: dict[str, object] = {"name": "ok", "queue": "q", "payload_model": Payload}
    with pytest.raises(ValueError):  # noqa: PT011
        JobType(handler=handler, **{**base, **kwargs})  # type: ignore[arg-type]


def test_envelope_round_trips() -> None:
    message = JobMessage(job_id=uuid.uuid4(), attempt=2, type="noop")
    assert decode(message.encode()) == message


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\xff\xfe",
        b"[]",
        b'{"v": 2, "job_id": "00000000-0000-0000-0000-000000000000", "attempt": 1, "type": "x"}',
        b'{"v": 1, "job_id": "nope", "attempt": 1, "type": "x"}',
        b'{"v": 1, "job_id": "00000000-0000-0000-0000-000000000000", "attempt": 1}',
        b"{" * 100_000,
    ],
)
def test_malformed_envelopes_are_poison(body: bytes) -> None:
    with pytest.raises(PoisonMessage):
        decode(body)


# Not an integer in range: out of range, or another JSON type pydantic would coerce.
@pytest.mark.parametrize("attempt", ["0", "-1", "10001", str(2**40), "true", '"2"', "2.0"])
def test_an_attempt_that_is_not_an_integer_in_range_is_poison(attempt: str) -> None:
    body = (
        b'{"v": 1, "job_id": "00000000-0000-0000-0000-000000000000", "attempt": '
        + attempt.encode()
        + b', "type": "noop"}'
    )
    with pytest.raises(PoisonMessage):
        decode(body)


# PostgreSQL text cannot hold NUL, and no job type or id holds a control character: the
# worker would send such a type to the database (the note on the job of an unknown type).
CONTROL_CHARACTERS = ["\x00", "\x01", "\t", "\n", "\r", "\x1b", "\x1f", "\x7f"]


@pytest.mark.parametrize("char", CONTROL_CHARACTERS)
@pytest.mark.parametrize("where", ["alone", "first", "inside", "last"])
def test_a_type_with_a_control_character_is_poison(char: str, where: str) -> None:
    job_type = {"alone": char, "first": char + "noop", "inside": "no" + char + "op"}.get(
        where, "noop" + char
    )
    body = orjson.dumps(
        {"v": 1, "job_id": "00000000-0000-0000-0000-000000000000", "attempt": 1, "type": job_type}
    )
    with pytest.raises(PoisonMessage, match="bad envelope at type"):
        decode(body)


@pytest.mark.parametrize("char", CONTROL_CHARACTERS)
def test_a_job_id_with_a_control_character_is_poison(char: str) -> None:
    body = orjson.dumps(
        {"v": 1, "job_id": f"00000000-0000-0000-0000-00000000000{char}", "attempt": 1, "type": "x"}
    )
    with pytest.raises(PoisonMessage, match="bad envelope at job_id"):
        decode(body)


def test_printable_types_that_no_worker_knows_still_decode() -> None:
    # Not poison at parse time: the worker dead-letters them as unknown types, noting why
    # on the job when there is one.
    for job_type in ["nope", "Nope Nope", "é-ü/ß", "\u0085x", "x" * 200]:
        message = JobMessage(job_id=uuid.uuid4(), attempt=1, type=job_type)
        assert decode(message.encode()).type == job_type


@pytest.mark.parametrize(
    ("kind", "detail"),
    [
        (None, {}),
        ("", {}),
        ("k\x00", {}),
        ("sent", {"when": object()}),
        ("sent", {"text": "nul\x00inside"}),
    ],
)
def test_a_bad_effect_fails_the_handler_that_records_it(
    kind: object, detail: dict[str, object]
) -> None:
    ctx: JobContext[Payload] = JobContext(
        job_id=uuid.uuid4(),
        job_type="double",
        payload=Payload(n=1),
        attempt=1,
        max_attempts=1,
        idempotency_key="k",
        heartbeat=_no_heartbeat,
    )
    with pytest.raises(TypeError):
        ctx.record_effect(kind, detail)  # type: ignore[arg-type]
    assert ctx.effects == []
    ctx.record_effect("sent", {"to": "a@example.com"})
    assert [e.kind for e in ctx.effects] == ["sent"]


async def _no_heartbeat() -> None:
    return None
