"""Completion webhooks as plain code: the message envelope, the request body and its
signature, which addresses a callback may reach, and when an attempt is retried.

The worker sends (``services/worker/webhooks.py``); the API checks callback URLs at
enqueue; the terminal-status statements record deliveries (``jobcore.sql.webhook_deliveries``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import ipaddress
import random
import secrets
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Any, Literal
from urllib.parse import urlsplit

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from jobcore.amqp.topology import WEBHOOKS_QUEUE, Topology
from jobcore.channels import OUTBOX_CHANNEL
from jobcore.errors import JobcoreError, PoisonMessage
from jobcore.retry import backoff_delay
from jobcore.settings import Settings
from jobcore.store import CompletionParams

# Standard Webhooks (github.com/standard-webhooks/standard-webhooks, spec 1.0.0): secrets
# are "whsec_" + base64 of 24 to 64 random bytes, the HMAC key is the decoded bytes, and
# "v1" names the HMAC-SHA256 signature scheme.
SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, so people recognise a secret
SECRET_BYTES = 32
MIN_SECRET_BYTES = 24
MAX_SECRET_BYTES = 64
SIGNATURE_VERSION = "v1"
MAX_URL_LENGTH = 2048
# The share of a retry's backoff ceiling that is random: the wait is in [0.6c, c].
JITTER_SHARE = 0.4
# How long resolving a callback's host may take before the URL is refused.
RESOLVE_TIMEOUT = 3.0

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# IPv6 prefixes that carry an IPv4 address a gateway will forward to (RFC 6052 NAT64): the
# IPv4 address is what gets reached, so it is what is checked. The well-known prefix is
# only ever used in the /96 format; the local-use one (RFC 8215) in any RFC 6052 format
# the operator picks, so every reading of it must be public.
NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
NAT64_LOCAL_USE = ipaddress.IPv6Network("64:ff9b:1::/48")
# Where the 32 bits of the IPv4 address sit in each RFC 6052 format (byte slices of the
# 16-byte address; byte 8, the "u" octet, is always skipped).
_RFC6052_LAYOUTS: tuple[tuple[slice, ...], ...] = (
    (slice(6, 8), slice(9, 11)),  # /48
    (slice(7, 8), slice(9, 12)),  # /56
    (slice(9, 13),),  # /64
    (slice(12, 16),),  # /96
)


class UnsafeCallbackUrl(JobcoreError):
    """The callback URL was refused."""


class CallbackHostUnresolved(UnsafeCallbackUrl):
    """The callback URL was refused: its host does not resolve."""

    # At delivery this is worth another attempt; an address that is not public is not.


class NonPublicCallbackAddress(UnsafeCallbackUrl):
    """The callback URL was refused: its host resolves to an address that is not public."""


class WebhookMessage(BaseModel):
    """The outbox/AMQP body of one delivery attempt (no job data: the row holds it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    v: Literal[1] = 1
    delivery_id: uuid.UUID
    attempt: int = Field(ge=1)

    def encode(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"))


def decode_message(body: bytes) -> WebhookMessage:
    """Parse a webhook message body; :class:`PoisonMessage` for anything malformed."""
    try:
        raw = orjson.loads(body)
        return WebhookMessage.model_validate(raw)
    except (orjson.JSONDecodeError, ValidationError) as exc:
        raise PoisonMessage(f"bad webhook message: {str(exc).splitlines()[0]}") from None


def completion_params(topology: Topology, settings: Settings) -> CompletionParams:
    """The parameters of the webhook CTEs every terminal-status statement carries."""
    return {
        "webhook_exchange": topology.jobs_exchange,
        "webhook_routing_key": topology.routing_key(WEBHOOKS_QUEUE),
        "webhook_max_attempts": settings.webhook_max_attempts,
        "webhook_outbox_channel": OUTBOX_CHANNEL,
    }


# --- the request receivers get -------------------------------------------------------------

_JOB_FIELDS = (
    "type",
    "entity_id",
    "last_error",
    "result_ref",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
)


def webhook_body(delivery: Mapping[str, Any]) -> bytes:
    """The body of a delivery: the event and the job's view — never its payload or result.

    ``delivery`` is a row of ``WEBHOOK_DELIVERY_GET_FOR_ATTEMPT``. The same delivery gives the same
    bytes on every attempt (a terminal job no longer changes).
    """
    job_id = delivery["job_id"]
    path = f"/jobs/{job_id}"
    job: dict[str, Any] = {"id": job_id}
    job.update({field: delivery[field] for field in _JOB_FIELDS})
    job["status"] = delivery["job_status"]
    job["attempts"] = delivery["job_attempts"]
    job["max_attempts"] = delivery["job_max_attempts"]
    job["links"] = {"self": path, "result": f"{path}/result"}
    body = {"id": delivery["id"], "event": delivery["event"], "job": job}
    return orjson.dumps(body, option=orjson.OPT_UTC_Z)


def new_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` and the base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def standard_key(secret: str) -> bytes | None:
    """The HMAC key a Standard Webhooks secret stands for (``whsec_`` + base64 of 24 to 64
    bytes), or None for a secret in any other form."""
    if not secret.startswith(SECRET_PREFIX):
        return None
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except binascii.Error:
        return None
    return key if MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES else None


def signing_key(secret: str) -> bytes:
    """The HMAC key of a stored secret.

    A Standard Webhooks secret is keyed by the bytes it encodes. Any other (those issued
    before migration 0012: ``whsec_`` + URL-safe base64 without padding, which is not
    valid base64) keeps the key it always had, its UTF-8 bytes: receivers hold that key
    already, so it is not re-interpreted under them."""
    key = standard_key(secret)
    return key if key is not None else secret.encode()


def is_standard_secret(secret: str) -> bool:
    return standard_key(secret) is not None


def standard_form(secret: str) -> str:
    """The secret as receivers give it to a Standard Webhooks library: itself when it is
    in that form, else ``whsec_`` + the base64 of its key (the same key, spelled so that
    ``standardwebhooks.Webhook(...)`` decodes it)."""
    if is_standard_secret(secret):
        return secret
    return SECRET_PREFIX + base64.b64encode(signing_key(secret)).decode()


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,`` and the base64 HMAC-SHA256 of ``{msg_id}.{timestamp}.{body}`` (Standard
    Webhooks' symmetric scheme)."""
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return f"{SIGNATURE_VERSION},{base64.b64encode(mac.digest()).decode()}"


def signed_headers(
    delivery_id: uuid.UUID,
    signing_secrets: Sequence[str],
    body: bytes,
    *,
    timestamp: int | None = None,
) -> dict[str, str]:
    """The request's headers: one signature per secret, the current one first, space
    separated (during a rotation's overlap, the new secret's and then the old one's)."""
    if not signing_secrets:
        raise ValueError("a webhook is signed with at least one secret")
    stamp = int(time.time()) if timestamp is None else timestamp
    msg_id = str(delivery_id)
    return {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(stamp),
        "webhook-signature": " ".join(
            signature(signing_key(secret), msg_id, stamp, body) for secret in signing_secrets
        ),
    }


# --- where a callback may go ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CallbackTarget:
    url: str
    scheme: str
    host: str  # lower case; an IPv6 address without brackets
    port: int
    explicit_port: bool

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}" if self.explicit_port else host

    def literal_address(self) -> IPAddress | None:
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None


def parse_callback_url(url: str) -> CallbackTarget:
    """An absolute http(s) URL with a host and no credentials, else :class:`UnsafeCallbackUrl`."""
    if len(url) > MAX_URL_LENGTH:
        raise UnsafeCallbackUrl(f"a callback URL is at most {MAX_URL_LENGTH} characters")
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise UnsafeCallbackUrl("a callback URL has no whitespace or control characters")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in {"http", "https"}:
        raise UnsafeCallbackUrl("a callback URL must be http:// or https://")
    if parts.username is not None or parts.password is not None:
        raise UnsafeCallbackUrl("a callback URL must not carry credentials")
    host = (parts.hostname or "").lower()
    if not host:
        raise UnsafeCallbackUrl("a callback URL must name a host")
    try:
        port = parts.port
    except ValueError:
        raise UnsafeCallbackUrl("the callback URL's port is not a number from 0 to 65535") from None
    if port == 0:
        raise UnsafeCallbackUrl("the callback URL's port cannot be 0")
    default_port = 443 if scheme == "https" else 80
    return CallbackTarget(url, scheme, host, port or default_port, port is not None)


def is_allowed_host(target: CallbackTarget, allowed: Iterable[str]) -> bool:
    """Listed in JOBCORE_WEBHOOK_ALLOWED_HOSTS as ``host`` (any port) or ``host:port``."""
    host = f"[{target.host}]" if ":" in target.host else target.host
    return any(entry in (target.host, host, f"{host}:{target.port}") for entry in allowed)


def unwrap(address: IPAddress) -> tuple[IPAddress, ...]:
    """The addresses a connection to ``address`` actually reaches: the IPv4 address inside
    an IPv4-mapped, 6to4 or NAT64 address (every RFC 6052 reading of a local-use NAT64
    one), else the address itself."""
    if isinstance(address, ipaddress.IPv4Address):
        return (address,)
    embedded = address.ipv4_mapped or address.sixtofour
    if embedded is not None:
        return (embedded,)
    packed = address.packed
    if address in NAT64_WELL_KNOWN:
        return (ipaddress.IPv4Address(packed[12:16]),)
    if address in NAT64_LOCAL_USE:
        return tuple(
            ipaddress.IPv4Address(b"".join(packed[part] for part in layout))
            for layout in _RFC6052_LAYOUTS
        )
    return (address,)


def is_public(address: IPAddress) -> bool:
    """Whether a webhook may be sent to ``address``: everything it reaches is a globally
    routable unicast address.

    ``is_global`` is the rule (an allow rule: no list of bad networks to keep current);
    the three further predicates close what Python 3.11's ``is_global`` still lets through
    and a TCP connection must never reach: multicast, reserved space (IPv4-compatible
    ``::a.b.c.d`` among it) and the deprecated IPv6 site-local ``fec0::/10``, which
    networks still route internally.
    """
    return all(
        reached.is_global
        and not reached.is_multicast
        and not reached.is_reserved
        and not (isinstance(reached, ipaddress.IPv6Address) and reached.is_site_local)
        for reached in unwrap(address)
    )


async def resolve(target: CallbackTarget, *, timeout: float = RESOLVE_TIMEOUT) -> list[IPAddress]:
    """The host's addresses (the literal itself for an IP), without duplicates, in order."""
    literal = target.literal_address()
    if literal is not None:
        return [literal]
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout):
            infos = await loop.getaddrinfo(
                target.host, target.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
            )
    except (OSError, TimeoutError, UnicodeError) as exc:
        # The resolver's text stays out of the message: it is shown to the caller.
        raise CallbackHostUnresolved() from exc
    found: dict[IPAddress, None] = {}
    for _family, _type, _proto, _name, sockaddr in infos:
        # A scoped IPv6 address comes back as "fe80::1%eth0": the scope is not an address.
        found[ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])] = None
    if not found:
        raise CallbackHostUnresolved()
    return list(found)


async def check_callback_url(
    url: str, allowed_hosts: Iterable[str], *, timeout: float = RESOLVE_TIMEOUT
) -> tuple[CallbackTarget, list[IPAddress]]:
    """Parse and resolve a callback URL; refuse it if any address it resolves to is not
    public, unless its host is allowed. Returns the addresses to connect to: connecting
    to one of these (not resolving again) is what makes the check hold, DNS rebinding
    included.

    The refusal does not say which address was found: the message reaches the caller,
    and an internal address is exactly what a caller probing the network wants to learn.
    """
    target = parse_callback_url(url)
    addresses = await resolve(target, timeout=timeout)
    if not is_allowed_host(target, allowed_hosts) and not all(map(is_public, addresses)):
        raise NonPublicCallbackAddress()
    return target, addresses


# --- retries -----------------------------------------------------------------------------


class Outcome(StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"
    FAILED = "failed"


def classify_status(status_code: int) -> Outcome:
    """2xx delivered; 408, 429 and 5xx worth another attempt; anything else is final
    (a 3xx too: redirects are not followed)."""
    if 200 <= status_code < 300:
        return Outcome.DELIVERED
    if status_code in (408, 429) or status_code >= 500:
        return Outcome.RETRY
    return Outcome.FAILED


def retry_after_seconds(value: str | None, *, now: datetime | None = None) -> float | None:
    """A ``Retry-After`` header as seconds from now: delta-seconds or an HTTP date."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def retry_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    retry_after: float | None = None,
    rng: Callable[[], float] = random.random,
) -> float:
    """Seconds before the attempt after ``attempt``: the receiver's ``Retry-After`` if it
    sent one (capped), else exponential backoff drawn from the top 40% of its ceiling —
    jittered, so receivers that failed together are not retried together, yet below the
    cap each wait is at least 1.2 times the one before."""
    if retry_after is not None:
        return min(cap, max(0.0, retry_after))
    low = 1.0 - JITTER_SHARE
    return backoff_delay(attempt, base=base, cap=cap, rng=lambda: low + JITTER_SHARE * rng())
