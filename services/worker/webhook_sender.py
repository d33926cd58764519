"""Sending completion webhooks: the ``webhooks`` queue in, one signed POST per message.

Each message names a delivery and an attempt number. The delivery is read (with the job's
view and the tenant's secret), the request is sent, and the outcome is written in one
statement with the inbox row and, for a retry, the next attempt's outbox message; only
then is the message acknowledged. So:

- a worker killed mid-request leaves the message unacknowledged: RabbitMQ hands it to
  the next worker, which sends the same delivery again (same ``Webhook-Id``) —
  at-least-once, as receivers are told;
- a message redelivered after its outcome was written finds its inbox row and is
  acknowledged without a request;
- no connection is held while the request is in flight (at most ten seconds);
- every message is settled, whatever goes wrong: a request that raises is an attempt that
  failed (recorded, and retried on the delivery's own schedule); any other unexpected
  error requeues the message after a pause (the queue's delivery limit bounds that).

Outbound requests go only to an address that passed the SSRF check at send time: the host
is resolved, every address checked, and the connection made to the checked address (the
URL's host stays in ``Host`` and in TLS SNI and certificate checks), so a DNS answer that
changed since enqueue cannot point a webhook inside the network.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from prometheus_client import Counter
from psycopg.rows import DictRow
from psycopg.types.json import Jsonb

from jobcore.amqp.consuming import DeliveryConsumer
from jobcore.amqp.deliveries import Delivery, JobQueueConsumer
from jobcore.amqp.topology import WEBHOOKS_QUEUE, Topology
from jobcore.database.gateway import Database
from jobcore.database.store import (
    WEBHOOK_MESSAGE_TYPE,
    WEBHOOKS_CONSUMER,
    WebhookDeliveryRecordAttemptParams,
    webhook_delivery_store,
)
from jobcore.execution.completion_webhooks import (
    CallbackHostUnresolved,
    Outcome,
    UnsafeCallbackUrl,
    WebhookMessage,
    check_callback_url,
    classify_status,
    completion_params,
    decode_message,
    retry_after_seconds,
    retry_delay,
    signed_headers,
    webhook_body,
)
from jobcore.kernel.errors import DatabaseUnavailable, PoisonMessage
from jobcore.kernel.settings import Settings
from jobcore.usecases.webhooks import signing_secrets, tenant_secret
from services.worker.metrics import WorkerMetrics
from services.worker.readiness import ConsumerReadiness

log = logging.getLogger(__name__)

T = TypeVar("T")

CONNECT_TIMEOUT = 3.0
TOTAL_TIMEOUT = 10.0
MAX_RESPONSE_BYTES = 64 * 1024
ERROR_MAX_CHARS = 500
USER_AGENT = "jobcore-webhooks/1"


@dataclass(frozen=True, slots=True)
class AttemptResult:
    outcome: Outcome
    status_code: int | None = None
    error: str | None = None
    retry_after: float | None = None


def _snippet(data: bytes) -> str:
    text = data[:200].decode("utf-8", errors="replace")
    return "".join(c if c.isprintable() else " " for c in text).strip()


class WebhookSender:
    """POSTs signed bodies with timeouts, no redirects, a bounded read, to checked addresses."""

    def __init__(self, settings: Settings) -> None:
        self.allowed_hosts = settings.webhook_allowed_hosts
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(TOTAL_TIMEOUT, connect=CONNECT_TIMEOUT),
            follow_redirects=False,
            # A proxy from the environment would connect to the host by name, not to the
            # address that was checked.
            trust_env=False,
            # No reuse: connections are keyed by address, and two hosts on one address
            # must not share a TLS session made for the other's name.
            limits=httpx.Limits(max_keepalive_connections=0),
        )

    async def close(self) -> None:
        await self.client.aclose()

    async def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> AttemptResult:
        try:
            target, addresses = await check_callback_url(url, self.allowed_hosts)
        except CallbackHostUnresolved as exc:
            return AttemptResult(Outcome.RETRY, error=str(exc))
        except UnsafeCallbackUrl as exc:
            return AttemptResult(Outcome.FAILED, error=str(exc))
        extensions: dict[str, Any] = {}
        if target.scheme == "https" and target.literal_address() is None:
            extensions["sni_hostname"] = target.host
        request_headers = {**headers, "Host": target.host_header, "User-Agent": USER_AGENT}
        try:
            async with asyncio.timeout(TOTAL_TIMEOUT):
                for index, address in enumerate(addresses):
                    try:
                        async with self.client.stream(
                            "POST",
                            httpx.URL(url).copy_with(host=str(address)),
                            content=body,
                            headers=request_headers,
                            extensions=extensions,
                        ) as response:
                            head = await _read_at_most(response, MAX_RESPONSE_BYTES)
                        break
                    except httpx.ConnectError:
                        # The host's next address (an IPv6 and an IPv4 one, say), if any.
                        if index == len(addresses) - 1:
                            raise
        except TimeoutError:
            return AttemptResult(Outcome.RETRY, error=f"no answer within {TOTAL_TIMEOUT:g}s")
        except httpx.HTTPError as exc:
            detail = str(exc) or type(exc).__name__
            return AttemptResult(Outcome.RETRY, error=f"{type(exc).__name__}: {detail}")
        outcome = classify_status(response.status_code)
        error = None
        if outcome is not Outcome.DELIVERED:
            error = f"HTTP {response.status_code}"
            if snippet := _snippet(head):
                error = f"{error}: {snippet}"
        retry_after = None
        if outcome is Outcome.RETRY:
            retry_after = retry_after_seconds(response.headers.get("retry-after"))
        return AttemptResult(outcome, response.status_code, error, retry_after)


async def _read_at_most(response: httpx.Response, limit: int) -> bytes:
    """The start of the body, never more than ``limit`` bytes (the rest is not read)."""
    head = bytearray()
    async for chunk in response.aiter_raw():
        head += chunk[: limit - len(head)]
        if len(head) >= limit:
            break
    return bytes(head)


class WebhookDeliverer(DeliveryConsumer):
    """Consumes the webhooks queue; one task per message, up to the prefetch at once."""

    name = "worker-webhooks"
    label = "webhooks"

    def __init__(self, settings: Settings, db: Database, metrics: WorkerMetrics) -> None:
        # Unfinished messages stay unacknowledged: the broker hands them to another worker.
        super().__init__(
            JobQueueConsumer(settings, [WEBHOOKS_QUEUE]),
            prefetch=settings.webhook_concurrency,
            grace=settings.shutdown_grace,
        )
        self.settings = settings
        # Short checkouts from the worker's pool, never held across a request.
        self.db = db
        self.metrics = metrics
        self.topology = Topology.from_settings(settings)
        self.completion = completion_params(self.topology, settings)
        self.sender = WebhookSender(settings)
        self._attempts = Counter(
            "jobcore_worker_webhook_attempts",
            "Webhook requests made, by outcome (delivered, retry, failed).",
            ["outcome"],
            registry=metrics.registry,
        )
        self._skipped = Counter(
            "jobcore_worker_webhook_messages_skipped",
            "Webhook messages acknowledged without a request (already handled, or overtaken).",
            registry=metrics.registry,
        )
        # Every outcome from the start, so rate() reads 0 rather than no data.
        for outcome in Outcome:
            self._attempts.labels(outcome.value)
        metrics.consuming([WEBHOOKS_QUEUE])
        self.readiness = ConsumerReadiness(settings.worker_stall_after)

    async def closed(self) -> None:
        await self.sender.close()

    def received(self, message: Delivery) -> None:
        self.metrics.delivered(WEBHOOKS_QUEUE)

    async def handle(self, message: Delivery) -> None:
        try:
            await self._deliver(message)
        except Exception:
            if message.settled:
                log.exception("unexpected error after a webhook message was settled")
                return
            # Before the outcome was recorded (it is acknowledged right after): sending
            # the request again is what at-least-once promises.
            self.readiness.failed()
            self.metrics.delivery_error("webhook")
            log.exception(
                "unexpected error handling a webhook message; it is requeued",
                extra={"message_id": message.message_id},
            )
            await self.sleep(message.requeue_pause())  # stopping ends it: requeued at once
            await message.requeue()

    async def _deliver(self, message: Delivery) -> None:
        try:
            envelope = decode_message(message.body)
            message_id = uuid.UUID(str(message.message_id))
        except (PoisonMessage, ValueError) as exc:
            self.metrics.dead_lettered("bad_webhook_message")
            log.warning(
                "poison webhook message sent to the dead-letter queue",
                extra={"message_id": message.message_id, "error": str(exc)},
            )
            await message.dead_letter()
            return
        fields = {"delivery_id": str(envelope.delivery_id), "attempt": envelope.attempt}

        row = await self._with_database(lambda: self._read(envelope, message_id), fields)
        if row is None:
            return  # stopping while the database was away: the broker redelivers
        delivery, signing = row
        if delivery is None or not self._is_due(delivery, envelope):
            self._skipped.inc()
            log.debug("webhook message already handled or overtaken; acknowledged", extra=fields)
            await message.ack()
            return

        fields["job_id"] = str(delivery["job_id"])
        body = webhook_body(delivery)
        headers = signed_headers(delivery["id"], signing, body)
        try:
            result = await self.sender.send(delivery["url"], body, headers)
        except Exception as exc:  # an unforeseen client error: a failed attempt, retried
            log.exception("unexpected error sending a webhook", extra=fields)
            result = AttemptResult(Outcome.RETRY, error=f"{type(exc).__name__}: {exc}")
        self._attempts.labels(result.outcome.value).inc()
        self.metrics.counts[f"webhooks.{result.outcome.value}"] += 1

        recorded = await self._with_database(
            lambda: self._record(envelope, message_id, result), fields
        )
        if recorded is None:
            return  # stopping: unacknowledged, so another worker sends it again
        await message.ack()
        self._log_outcome(recorded, result, fields)

    @staticmethod
    def _is_due(delivery: Mapping[str, Any], envelope: WebhookMessage) -> bool:
        return (
            not delivery["seen"]
            and delivery["status"] == "pending"
            and delivery["attempts"] == envelope.attempt - 1
        )

    async def _read(
        self, envelope: WebhookMessage, message_id: uuid.UUID
    ) -> tuple[DictRow | None, list[str]]:
        """The delivery and the secrets to sign it with (the current one first)."""
        async with self.db.unit_of_work() as uow:
            delivery = await webhook_delivery_store.get_for_attempt(
                uow,
                {
                    "id": envelope.delivery_id,
                    "consumer": WEBHOOKS_CONSUMER,
                    "message_id": message_id,
                },
            )
            if delivery is None:
                return None, []
            if delivery["secret"] is not None:
                return delivery, signing_secrets(delivery)
            secrets = signing_secrets(await tenant_secret(uow, delivery["tenant"]))
            await uow.commit()
        return delivery, secrets

    async def _record(
        self, envelope: WebhookMessage, message_id: uuid.UUID, result: AttemptResult
    ) -> dict[str, Any]:
        attempt = envelope.attempt
        delay = retry_delay(
            attempt,
            base=self.settings.webhook_backoff_base,
            cap=self.settings.webhook_backoff_cap,
            retry_after=result.retry_after,
        )
        next_message = WebhookMessage(delivery_id=envelope.delivery_id, attempt=attempt + 1)
        params: WebhookDeliveryRecordAttemptParams = {
            **self.completion,
            "consumer": WEBHOOKS_CONSUMER,
            "message_id": message_id,
            "id": envelope.delivery_id,
            "attempt": attempt,
            "outcome": result.outcome.value,
            "status_code": result.status_code,
            "error": (result.error or None) and result.error[:ERROR_MAX_CHARS],
            "delay": delay,
            "next_message_id": uuid.uuid4(),
            "message_type": WEBHOOK_MESSAGE_TYPE,
            "headers": Jsonb({}),
            "next_body": next_message.encode(),
        }
        async with self.db.unit_of_work() as uow:
            row = await webhook_delivery_store.record_attempt(uow, params)
            await uow.commit()
        # No row: the message was recorded by someone else meanwhile (a duplicate copy).
        return {**row, "delay": round(delay, 3)} if row is not None else {}

    async def _with_database(
        self, operation: Callable[[], Awaitable[T]], fields: dict[str, Any]
    ) -> T | None:
        """Run ``operation``, holding the message while the database is away; None if the
        worker stops first."""
        with self.readiness.waiting():
            answer = await self.retry_while_unavailable(
                operation,
                DatabaseUnavailable,
                "webhooks: database unavailable; holding the message until it is back",
                fields,
            )
        if answer is not None:
            self.readiness.progressed()
        return answer

    def _log_outcome(
        self, recorded: dict[str, Any], result: AttemptResult, fields: dict[str, Any]
    ) -> None:
        status = recorded.get("status")
        extra = {**fields, "status_code": result.status_code, "error": result.error}
        if status == "delivered":
            log.info("webhook delivered", extra=extra)
        elif status == "pending":
            extra.update(next_attempt_at=str(recorded["next_attempt_at"]), delay=recorded["delay"])
            log.info("webhook attempt failed; retry scheduled", extra=extra)
        elif status == "failed":
            log.warning("webhook delivery failed for good", extra=extra)
