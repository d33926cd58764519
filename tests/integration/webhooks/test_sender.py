"""The worker's HTTP side against a real receiver: no redirects, a bounded read,
Retry-After, the address check at send time."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator

import pytest

from jobcore.execution.completion_webhooks import Outcome
from jobcore.kernel.settings import Settings
from services.worker.webhook_sender import MAX_RESPONSE_BYTES, WebhookSender
from tests.integration.webhooks.support import Answer, receiving
from tests.support.resolver import resolving_to

BODY = b'{"event":"job.succeeded"}'
HEADERS = {"Content-Type": "application/json", "Webhook-Id": "test"}


@pytest.fixture
async def sender(hsettings: Settings) -> AsyncIterator[WebhookSender]:
    sender = WebhookSender(hsettings)
    try:
        yield sender
    finally:
        await sender.close()


async def test_a_redirect_is_not_followed_and_fails_the_delivery(sender: WebhookSender) -> None:
    async with receiving(Answer(302, headers={"Location": "/elsewhere"})) as receiver:
        result = await sender.send(receiver.url(), BODY, HEADERS)
        assert [r.path for r in receiver.requests] == ["/hooks/jobs"]
    assert result.outcome is Outcome.FAILED
    assert result.status_code == 302


async def test_retry_after_is_passed_on_for_a_429(sender: WebhookSender) -> None:
    async with receiving(Answer(429, headers={"Retry-After": "7"})) as receiver:
        result = await sender.send(receiver.url(), BODY, HEADERS)
    assert result.outcome is Outcome.RETRY
    assert result.retry_after == 7


async def test_no_more_than_64_kib_of_an_answer_is_read(sender: WebhookSender) -> None:
    # Far more than loopback's socket buffers take in before the hang-up reaches the
    # receiver (4 of 8 MiB were, once, on a loaded machine).
    huge = b"x" * (64 * 1024 * 1024)
    async with receiving(Answer(500, body=huge)) as receiver:
        result = await sender.send(receiver.url(), BODY, HEADERS)
        sent = receiver.bytes_sent
    assert result.outcome is Outcome.RETRY
    assert result.error is not None
    assert len(result.error) < 300
    # The sender hung up after its limit: most of the answer was never taken.
    assert sent < len(huge) // 2, sent
    assert MAX_RESPONSE_BYTES == 64 * 1024


async def test_the_request_is_signed_as_given_and_names_the_host(sender: WebhookSender) -> None:
    async with receiving() as receiver:
        result = await sender.send(receiver.url("/x?y=1"), BODY, HEADERS)
        [request] = receiver.requests
    assert result.outcome is Outcome.DELIVERED
    assert request.body == BODY
    assert request.path == "/x?y=1"
    assert request.headers["host"] == f"127.0.0.1:{receiver.port}"
    assert request.headers["webhook-id"] == "test"


async def test_a_private_address_is_refused_at_send_time(settings: Settings) -> None:
    # The URL was allowed when the job was enqueued; the setting no longer allows it.
    strict = WebhookSender(settings)
    try:
        async with receiving() as receiver:
            result = await strict.send(receiver.url(), BODY, HEADERS)
            assert receiver.requests == []
    finally:
        await strict.close()
    assert result.outcome is Outcome.FAILED
    assert result.error is not None
    assert "not public" in result.error
    # The error is shown to the tenant (GET /jobs/{id}/deliveries): no internal address.
    assert "127.0.0.1" not in result.error


async def test_a_name_rebound_to_an_internal_address_is_not_connected_to(
    sender: WebhookSender,
) -> None:
    # The name passed the check at enqueue; by delivery it resolves to the receiver's
    # loopback address (allowed by address in these settings, not by this name).
    async with receiving() as receiver:
        with resolving_to([ipaddress.ip_address("127.0.0.1")]) as asked:
            result = await sender.send(
                f"http://rebound.example:{receiver.port}/hooks/jobs", BODY, HEADERS
            )
        assert receiver.requests == []
    assert asked == ["rebound.example"]
    assert result.outcome is Outcome.FAILED


async def test_a_closed_port_is_a_network_error_worth_a_retry(sender: WebhookSender) -> None:
    async with receiving() as receiver:
        url = receiver.url()
    result = await sender.send(url, BODY, HEADERS)  # the receiver is gone
    assert result.outcome is Outcome.RETRY
    assert result.status_code is None
    assert result.error is not None
    assert "ConnectError" in result.error
