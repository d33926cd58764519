"""Completion webhooks as plain code: signing, the address policy, retry rules, envelopes."""

from __future__ import annotations

import base64
import ipaddress
import time
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
import standardwebhooks
from standardwebhooks.webhooks import WebhookVerificationError

from jobcore.execution.completion_webhooks import (
    Outcome,
    UnsafeCallbackUrl,
    WebhookMessage,
    check_callback_url,
    classify_status,
    decode_message,
    is_allowed_host,
    is_public,
    new_secret,
    parse_callback_url,
    retry_after_seconds,
    retry_delay,
    signature,
    signed_headers,
    signing_key,
    standard_form,
    standard_key,
)
from jobcore.kernel.errors import PoisonMessage

# Standard Webhooks' reference library's signing test (libraries/python/tests): a 24-byte
# secret, and the signature every implementation must produce for it.
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_MSG_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_PAYLOAD = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
# What jobcore issued before migration 0012: not base64 (URL-safe alphabet, no padding).
LEGACY_SECRET = "whsec_" + "Ab-_" * 10 + "xyz"


def test_the_signature_matches_the_reference_librarys_test_vector() -> None:
    key = standard_key(SPEC_SECRET)
    assert key is not None
    assert len(key) == 24
    assert signature(key, SPEC_MSG_ID, SPEC_TIMESTAMP, SPEC_PAYLOAD) == SPEC_SIGNATURE
    reference = standardwebhooks.Webhook(SPEC_SECRET).sign(
        SPEC_MSG_ID, datetime.fromtimestamp(SPEC_TIMESTAMP, UTC), SPEC_PAYLOAD.decode()
    )
    assert reference == SPEC_SIGNATURE


def test_new_secrets_are_whsec_and_base64_of_32_random_bytes() -> None:
    first, second = new_secret(), new_secret()
    assert first != second
    assert first.startswith("whsec_")
    assert base64.b64decode(first.removeprefix("whsec_"), validate=True) == standard_key(first)
    assert len(signing_key(first)) == 32
    assert standard_form(first) == first


@pytest.mark.parametrize(
    "secret",
    [
        "whsec_" + base64.b64encode(b"x" * 23).decode(),  # shorter than 24 bytes
        "whsec_" + base64.b64encode(b"x" * 65).decode(),  # longer than 64 bytes
        base64.b64encode(b"x" * 32).decode(),  # no prefix
        LEGACY_SECRET,
        "whsec_not base64 at all!",
    ],
)
def test_other_secrets_are_not_standard_and_keyed_by_their_utf8_bytes(secret: str) -> None:
    assert standard_key(secret) is None
    assert signing_key(secret) == secret.encode()


def test_a_standard_library_verifies_a_delivery_and_refuses_tampering() -> None:
    secret = new_secret()
    body = b'{"event":"job.succeeded"}'
    delivery = uuid.uuid4()
    headers = signed_headers(delivery, [secret], body)
    assert headers["webhook-id"] == str(delivery)
    assert headers["webhook-signature"].startswith("v1,")
    assert " " not in headers["webhook-signature"]
    assert standardwebhooks.Webhook(secret).verify(body, headers) == {"event": "job.succeeded"}
    with pytest.raises(WebhookVerificationError):
        standardwebhooks.Webhook(secret).verify(body + b" ", headers)
    with pytest.raises(WebhookVerificationError):
        standardwebhooks.Webhook(new_secret()).verify(body, headers)
    with pytest.raises(WebhookVerificationError):  # the id is signed too
        standardwebhooks.Webhook(secret).verify(body, {**headers, "webhook-id": "other"})
    stale = signed_headers(delivery, [secret], body, timestamp=int(time.time()) - 301)
    with pytest.raises(WebhookVerificationError):  # a replay, later
        standardwebhooks.Webhook(secret).verify(body, stale)


def test_during_an_overlap_both_secrets_verify_and_the_new_one_signs_first() -> None:
    new, old = new_secret(), new_secret()
    body = b"{}"
    headers = signed_headers(uuid.uuid4(), [new, old], body, timestamp=SPEC_TIMESTAMP)
    first, second = headers["webhook-signature"].split(" ")
    stamp, msg_id = SPEC_TIMESTAMP, headers["webhook-id"]
    assert first == signature(signing_key(new), msg_id, stamp, body)
    assert second == signature(signing_key(old), msg_id, stamp, body)
    fresh = signed_headers(uuid.uuid4(), [new, old], body)
    for secret in (new, old):
        standardwebhooks.Webhook(secret).verify(body, fresh)
    with pytest.raises(WebhookVerificationError):
        standardwebhooks.Webhook(new_secret()).verify(body, fresh)


def test_a_legacy_secret_keeps_its_key_and_verifies_in_its_standard_spelling() -> None:
    body = b'{"id":"x"}'
    headers = signed_headers(uuid.uuid4(), [LEGACY_SECRET], body)
    spelled = standard_form(LEGACY_SECRET)
    assert spelled != LEGACY_SECRET
    assert standard_key(spelled) == LEGACY_SECRET.encode()  # the same key, 49 bytes
    standardwebhooks.Webhook(spelled).verify(body, headers)
    standardwebhooks.Webhook(LEGACY_SECRET.encode()).verify(body, headers)


def test_a_webhook_is_signed_with_at_least_one_secret() -> None:
    with pytest.raises(ValueError, match="at least one"):
        signed_headers(uuid.uuid4(), [], b"{}")


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("93.184.216.34", False),
        ("2606:2800:220:1:248:1893:25c8:1946", False),
        ("127.0.0.1", True),
        ("10.0.0.1", True),
        ("172.16.5.4", True),
        ("192.168.1.1", True),
        ("169.254.169.254", True),
        ("169.254.1.1", True),
        ("100.64.0.1", True),
        ("0.0.0.0", True),
        ("224.0.0.251", True),
        ("240.0.0.1", True),
        ("::1", True),
        ("::", True),
        ("fe80::1", True),
        ("fc00::1", True),
        ("fd00:ec2::254", True),
        ("::ffff:127.0.0.1", True),
        ("::ffff:10.0.0.1", True),
        ("2002:7f00:1::", True),  # 6to4 of 127.0.0.1
        ("2002:808:808::", False),  # 6to4 of 8.8.8.8
        ("ff02::1", True),
        ("ff0e::1", True),  # global-scope multicast: is_global, yet no TCP peer
        ("224.0.1.1", True),
        ("fec0::1", True),  # site-local: is_global in Python 3.11
        ("64:ff9b::a00:1", True),  # NAT64 of 10.0.0.1
        ("64:ff9b::808:808", False),  # NAT64 of 8.8.8.8
        ("64:ff9b:1::808:808", True),  # local-use NAT64: read as /48, 8.8.0.0 ... 0.0.0.0
        ("64:ff9b:1:808:8:808:808:808", False),  # 8.8.8.8 in every RFC 6052 reading
        ("64:ff9b:1:a00:0:108:808:808", True),  # /48 reading: 10.0.0.1
        ("::a00:1", True),  # IPv4-compatible (deprecated): reserved space
    ],
)
def test_only_public_addresses_may_receive_webhooks(address: str, refused: bool) -> None:
    assert is_public(ipaddress.ip_address(address)) is not refused


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/",
        "javascript:alert(1)",
        "http://user:pw@example.com/",
        "http://:80/",
        "https://example.com:0/",
        "https://example.com:70000/",
        "http://example.com/a b",
        "http://example.com/\x00",
        "http://example.com/" + "a" * 3000,
    ],
)
def test_malformed_callback_urls_are_refused(url: str) -> None:
    with pytest.raises(UnsafeCallbackUrl):
        parse_callback_url(url)


def test_a_callback_url_is_parsed_with_its_effective_port() -> None:
    target = parse_callback_url("HTTPS://Example.COM/hooks?x=1")
    assert (target.scheme, target.host, target.port, target.host_header) == (
        "https",
        "example.com",
        443,
        "example.com",
    )
    v6 = parse_callback_url("http://[2001:db8::1]:8080/")
    assert (v6.host, v6.port, v6.host_header) == ("2001:db8::1", 8080, "[2001:db8::1]:8080")


def test_allowed_hosts_match_by_host_or_host_and_port() -> None:
    target = parse_callback_url("http://127.0.0.1:9000/x")
    assert is_allowed_host(target, ["127.0.0.1"])
    assert is_allowed_host(target, ["127.0.0.1:9000"])
    assert not is_allowed_host(target, ["127.0.0.1:9001"])
    assert not is_allowed_host(target, ["127.0.0.2"])
    assert is_allowed_host(parse_callback_url("http://[::1]:8/"), ["[::1]:8"])


async def test_checking_resolves_literals_and_refuses_unless_allowed() -> None:
    with pytest.raises(UnsafeCallbackUrl, match="not public") as refused:
        await check_callback_url("http://127.0.0.1:9/x", [])
    assert "127.0.0.1" not in str(refused.value)
    target, addresses = await check_callback_url("http://127.0.0.1:9/x", ["127.0.0.1"])
    assert addresses == [ipaddress.ip_address("127.0.0.1")]
    assert target.port == 9
    with pytest.raises(UnsafeCallbackUrl):
        await check_callback_url("http://localhost/x", [])  # resolves to loopback


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, Outcome.DELIVERED),
        (204, Outcome.DELIVERED),
        (301, Outcome.FAILED),
        (400, Outcome.FAILED),
        (404, Outcome.FAILED),
        (408, Outcome.RETRY),
        (410, Outcome.FAILED),
        (429, Outcome.RETRY),
        (500, Outcome.RETRY),
        (503, Outcome.RETRY),
    ],
)
def test_which_answers_are_retried(status: int, outcome: Outcome) -> None:
    assert classify_status(status) is outcome


def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert retry_after_seconds("120", now=now) == 120
    later = format_datetime(now + timedelta(seconds=90), usegmt=True)
    assert retry_after_seconds(later, now=now) == 90
    assert retry_after_seconds(format_datetime(now - timedelta(days=1), usegmt=True), now=now) == 0
    assert retry_after_seconds("soon", now=now) is None
    assert retry_after_seconds(None) is None


def test_retry_delays_grow_are_jittered_and_honour_retry_after_capped() -> None:
    low = [retry_delay(n, base=1, cap=1000, rng=lambda: 0.0) for n in range(1, 6)]
    high = [retry_delay(n, base=1, cap=1000, rng=lambda: 0.999999) for n in range(1, 6)]
    assert low == pytest.approx([0.6, 1.2, 2.4, 4.8, 9.6])
    assert high == pytest.approx([1, 2, 4, 8, 16], rel=1e-5)
    # The longest wait after attempt n is shorter than the shortest after attempt n + 1.
    assert all(h < lo for h, lo in zip(high, low[1:], strict=False))
    assert retry_delay(30, base=1, cap=50, rng=lambda: 0.999999) <= 50
    assert retry_delay(1, base=1, cap=50, retry_after=20) == 20
    assert retry_delay(1, base=1, cap=50, retry_after=5000) == 50


def test_webhook_messages_round_trip_and_garbage_is_poison() -> None:
    message = WebhookMessage(delivery_id=uuid.uuid4(), attempt=2)
    assert decode_message(message.encode()) == message
    # What the SQL writes (jsonb text, other key order, spaces) decodes the same.
    sql_written = f'{{"v": 1, "attempt": 2, "delivery_id": "{message.delivery_id}"}}'.encode()
    assert decode_message(sql_written) == message
    for bad in (b"", b"[]", b'{"v":1}', b'{"v":2,"delivery_id":"x","attempt":1}', b"\xff"):
        with pytest.raises(PoisonMessage):
            decode_message(bad)
