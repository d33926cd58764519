"""`jobcore.testing.run_inline`: one attempt of a handler, checked as the API and the worker
check it, without a broker or a database."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobcore.examples.jobtypes import SendEmailPayload
from jobcore.execution.attempts import JobTimedOut, UnstorableOutcome
from jobcore.execution.payloads import UnstorablePayload
from jobcore.execution.registry import InvalidPayloadError
from jobcore.kernel.errors import PermanentError
from jobcore.testing import run_inline, run_inline_job
from tests.integration.testing_kit.jobtypes import REGISTRY


async def test_the_result_comes_back_as_clients_read_it(tmp_path: Path) -> None:
    run = await run_inline_job(
        "kit_note", {"text": "hello"}, registry=REGISTRY, result_dir=tmp_path
    )
    assert run.result == {"text": "hello", "job": str(run.context.job_id), "padding": ""}
    assert [(e.kind, e.detail) for e in run.effects] == [("noted", {"text": "hello"})]
    assert run.heartbeats == 1
    assert run.result_ref is None


async def test_a_large_result_goes_to_the_result_store(tmp_path: Path) -> None:
    run = await run_inline_job(
        "kit_note", {"text": "big", "size": 50_000}, registry=REGISTRY, result_dir=tmp_path
    )
    assert run.result_ref is not None
    stored = run.context.result_store
    assert stored is not None
    assert stored.get(run.result_ref) == run.stored_result


async def test_payloads_are_checked_as_the_api_checks_them(tmp_path: Path) -> None:
    with pytest.raises(InvalidPayloadError) as invalid:
        await run_inline("send_email", {"to": "not an address", "subject": "Hi"})
    assert invalid.value.errors[0]["loc"] == ["to"]
    with pytest.raises(UnstorablePayload):
        await run_inline("send_email", {"to": "a@example.com", "subject": "Hi", "body": "\x00"})
    model = SendEmailPayload(to="a@example.com", subject="Hi")
    assert (await run_inline("send_email", model, result_dir=tmp_path))["delivered"] is True


async def test_the_handlers_error_is_raised() -> None:
    with pytest.raises(PermanentError, match="refused: no"):
        await run_inline("kit_refuse", {"text": "no"}, registry=REGISTRY)


async def test_the_job_types_timeout_applies() -> None:
    with pytest.raises(JobTimedOut, match=r"timed out after 0\.2s"):
        await run_inline("kit_sleepy", {"text": "zz"}, registry=REGISTRY)


async def test_a_result_the_worker_could_not_store_is_refused() -> None:
    with pytest.raises(UnstorableOutcome, match="not JSON"):
        await run_inline("kit_unjson", {"text": "?"}, registry=REGISTRY)


async def test_a_later_attempt_can_be_run() -> None:
    with pytest.raises(ConnectionError):
        await run_inline("kit_flaky", {"succeed_on_attempt": 2}, registry=REGISTRY)
    result = await run_inline("kit_flaky", {"succeed_on_attempt": 2}, registry=REGISTRY, attempt=2)
    assert result == {"attempt": 2}
