"""jobcore.execution.outcomes: what an attempt ends in, as pure code (the worker and the testing kit
both write what it decides; tests/integration/worker/test_outcome_parity.py compares)."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest
from pydantic import BaseModel, ValidationError

from jobcore.execution.outcomes import (
    CANCEL,
    RESULT_FILE_AND_TOO_LARGE,
    Fail,
    GiveBack,
    OutcomeLimits,
    Retry,
    Succeed,
    attempt_failed,
    give_back_delay,
    handler_failed,
    invalid_payload,
    store_failed,
    success,
)
from jobcore.execution.registry import InvalidPayloadError, JobContext
from jobcore.kernel.errors import PermanentError, StoreRefused
from jobcore.storage.results import ResultNotFound, StoreUnavailable

LIMITS = OutcomeLimits(inline_result_max_bytes=20, retry_backoff_base=1.0, retry_backoff_cap=8.0)
TOKEN = uuid.UUID(int=7)


async def _no_heartbeat() -> None:
    return None


def context(*, result_ref: str | None = None) -> JobContext[Any]:
    ctx: JobContext[Any] = JobContext(
        job_id=uuid.UUID(int=1),
        job_type="t",
        payload=None,
        attempt=1,
        max_attempts=3,
        idempotency_key="k",
        heartbeat=_no_heartbeat,
    )
    ctx.result_ref = result_ref
    return ctx


def test_a_small_result_is_kept_in_the_row_with_the_effects() -> None:
    ctx = context()
    ctx.record_effect("sent", {"n": 1})
    outcome = success({"ok": True}, ctx, TOKEN, LIMITS)
    assert outcome == Succeed(
        '{"ok":true}',
        None,
        [
            {
                "job_id": str(ctx.job_id),
                "lease_token": str(TOKEN),
                "kind": "sent",
                "detail": {"n": 1},
            }
        ],
    )


def test_a_result_over_the_limit_goes_to_the_store() -> None:
    outcome = success({"blob": "x" * 30}, context(), TOKEN, LIMITS)
    assert isinstance(outcome, Succeed)
    assert (outcome.result, outcome.result_ref) == (None, None)
    assert outcome.to_store == orjson.dumps({"blob": "x" * 30})
    assert outcome.stored("abc.json") == Succeed(None, "abc.json", [])


def test_a_result_file_keeps_its_ref_and_refuses_a_large_result() -> None:
    assert success(None, context(result_ref="f.csv"), TOKEN, LIMITS) == Succeed(None, "f.csv", [])
    large = success({"blob": "x" * 30}, context(result_ref="f.csv"), TOKEN, LIMITS)
    assert large == Fail(RESULT_FILE_AND_TOO_LARGE)


def test_an_unstorable_result_fails_the_job() -> None:
    assert success({"t": "\x00"}, context(), TOKEN, LIMITS) == Fail(
        "the handler's result or effects contain a NUL character"
    )
    outcome = success({"t": object()}, context(), TOKEN, LIMITS)
    assert isinstance(outcome, Fail)
    assert outcome.error.startswith("the handler's result or effects are not JSON")


def test_a_failed_attempt_is_retried_after_the_backoff_until_the_last() -> None:
    exc = RuntimeError("down")
    retry = attempt_failed(exc, attempt=3, max_attempts=4, limits=LIMITS, rng=lambda: 0.5)
    assert retry == Retry("RuntimeError: down", 2.0)  # ceiling 1 * 2**2, half of it
    assert attempt_failed(exc, attempt=4, max_attempts=4, limits=LIMITS) == Fail(
        "RuntimeError: down"
    )
    during = attempt_failed(exc, attempt=4, max_attempts=4, limits=LIMITS, during="storing it")
    assert during == Fail("storing it failed: RuntimeError: down")


def test_a_long_error_is_cut() -> None:
    outcome = attempt_failed(
        RuntimeError("x" * 5000), attempt=9, max_attempts=9, limits=LIMITS, during="d"
    )
    assert isinstance(outcome, Fail)
    assert len(outcome.error) == 2000


def test_what_the_handler_raised_decides() -> None:
    kwargs: dict[str, Any] = {"attempt": 1, "max_attempts": 3, "limits": LIMITS}
    assert handler_failed(PermanentError("no"), **kwargs) == Fail("PermanentError: no")
    assert handler_failed(StoreUnavailable("s3 down"), **kwargs) == GiveBack(
        "running the handler failed: object store unavailable: StoreUnavailable: s3 down",
        "running the handler",
    )
    assert isinstance(handler_failed(ValueError("v"), **kwargs), Retry)


def test_a_store_failure_gives_back_only_an_outage() -> None:
    kwargs: dict[str, Any] = {"during": "reading the payload", "max_attempts": 3, "limits": LIMITS}
    assert isinstance(store_failed(StoreUnavailable("x"), attempt=3, **kwargs), GiveBack)
    assert store_failed(ResultNotFound("gone"), attempt=3, **kwargs) == Fail(
        "reading the payload failed: ResultNotFound: gone"
    )
    assert isinstance(store_failed(OSError("disk"), attempt=1, **kwargs), Retry)


def test_a_refusal_of_the_store_fails_the_attempt_it_is_no_outage() -> None:
    refused = StoreRefused("object store s3://b refused the request (HTTP 403): ...")
    kwargs: dict[str, Any] = {"during": "storing the result", "max_attempts": 3, "limits": LIMITS}
    assert store_failed(refused, attempt=3, **kwargs) == Fail(
        "storing the result failed: StoreRefused: object store s3://b refused the request "
        "(HTTP 403): ..."
    )
    assert isinstance(store_failed(refused, attempt=1, **kwargs), Retry)
    handler = handler_failed(refused, attempt=3, max_attempts=3, limits=LIMITS)
    assert isinstance(handler, Fail)
    assert handler.error.startswith("StoreRefused: ")


def test_an_outage_gives_back_a_bounded_number_of_times_then_counts() -> None:
    limits = OutcomeLimits(
        inline_result_max_bytes=20,
        retry_backoff_base=1.0,
        retry_backoff_cap=8.0,
        max_store_give_backs=2,
    )
    down = StoreUnavailable("s3 down")
    kwargs: dict[str, Any] = {"during": "storing the result", "limits": limits}
    for given_back in (0, 1):
        outcome = store_failed(down, attempt=1, max_attempts=1, give_backs=given_back, **kwargs)
        assert isinstance(outcome, GiveBack)
    counted = "storing the result failed: object store unavailable, and the job was given back "
    assert store_failed(down, attempt=1, max_attempts=1, give_backs=2, **kwargs) == Fail(
        counted + "2 times already: StoreUnavailable: s3 down"
    )
    retried = store_failed(down, attempt=1, max_attempts=3, give_backs=5, **kwargs)
    assert isinstance(retried, Retry)
    assert retried.error.startswith(counted + "5 times already")
    # The handler's own upload meeting the outage is bounded the same way.
    handler = handler_failed(down, attempt=1, max_attempts=1, limits=limits, give_backs=2)
    assert handler == Fail(
        "running the handler failed: object store unavailable, and the job was given back "
        "2 times already: StoreUnavailable: s3 down"
    )
    never = OutcomeLimits(20, 1.0, 8.0, max_store_give_backs=0)
    assert isinstance(store_failed(down, attempt=1, max_attempts=1, limits=never, during="x"), Fail)


@pytest.mark.parametrize(("outages", "low", "high"), [(1, 0.5, 1.0), (3, 2.0, 4.0), (9, 4.0, 8.0)])
def test_a_give_back_waits_at_least_half_the_ceiling(outages: int, low: float, high: float) -> None:
    assert give_back_delay(outages, LIMITS, rng=lambda: 0.0) == low
    assert give_back_delay(outages, LIMITS, rng=lambda: 0.999999) == pytest.approx(high, rel=1e-5)


class _Mail(BaseModel):
    to: str
    cc: list[int] = []


def test_an_invalid_payload_names_its_fields() -> None:
    try:
        _Mail.model_validate({"cc": [1, "x"]})
    except ValidationError as error:
        exc = InvalidPayloadError("mail", error)
    assert invalid_payload(exc) == Fail(
        "payload does not validate against the job type's model: to: Field required; "
        "cc.1: Input should be a valid integer, unable to parse string as an integer"
    )
    assert CANCEL.error == "cancelled"
