"""Standard Webhooks, as receivers check it: a real relay and worker deliver to receivers
that verify each request with the `standardwebhooks` package and answer 401 when it
refuses (a final answer: the delivery fails). Through a secret rotation, its overlap and
its end, and for a secret issued before Standard Webhooks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import pytest
import standardwebhooks
from standardwebhooks.webhooks import WebhookVerificationError

from jobcore.client import WebhookVerificationFailed, verify_webhook
from jobcore.database.gateway import Database
from jobcore.execution.completion_webhooks import new_secret
from jobcore.kernel.settings import Settings
from jobcore.testing.waiting import eventually
from tests.integration.webhooks.conftest import TENANT
from tests.integration.webhooks.support import (
    Received,
    Receiver,
    delivery_in,
    receiving,
    service_process,
)
from tests.integration.webhooks.test_cli import as_json, jobcore
from tests.integration.webhooks.test_delivery import enqueue_with_callback

TIMEOUT = 60.0  # process start-up on a loaded 2-core machine included
UNAUTHORIZED = 401


def holding(secret: str | bytes) -> Callable[[Received], int]:
    """A receiver's check: 200 when the library verifies the request with ``secret``."""
    webhook = standardwebhooks.Webhook(secret)

    def judge(request: Received) -> int:
        try:
            webhook.verify(request.body, request.headers)
        except WebhookVerificationError:
            return UNAUTHORIZED
        return 200

    return judge


def secret_command(settings: Settings, *args: str, overlap: str = "PT1H") -> dict[str, object]:
    env = {"JOBCORE_WEBHOOK_SECRET_OVERLAP": overlap}
    done = jobcore(settings, "webhooks", "secret", "--tenant", TENANT, *args, "--json", env=env)
    shown: dict[str, object] = as_json(done)
    return shown


async def deliver(
    db: Database,
    client: httpx.AsyncClient,
    auth: dict[str, str],
    receiver: Receiver,
) -> tuple[dict[str, object], Received]:
    """One job with the receiver as its callback, run to its delivery's final status."""
    seen = len(receiver.requests)
    job_id = await enqueue_with_callback(client, auth, receiver.url())
    delivery = await eventually(
        delivery_in(db, job_id, "delivered", "failed"), timeout=TIMEOUT, what="the delivery"
    )
    assert len(receiver.requests) == seen + 1
    return delivery, receiver.requests[-1]


async def end_overlap(db: Database, tenant: str) -> None:
    """What the clock does at the end of the window, without waiting for it."""
    async with db.connection() as conn:
        await conn.execute(
            "UPDATE tenant_webhook_secrets SET previous_expires_at = now() - interval '1 second'"
            " WHERE tenant = %s",
            (tenant,),
        )


async def test_receivers_verify_with_the_library_through_a_rotation_and_its_overlap(
    hsettings: Settings,
    db: Database,
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    broker_cleanup: None,
    tmp_path: Path,
) -> None:
    old = secret_command(hsettings)
    assert old["secret_format"] == "standard"
    assert str(old["secret"]).startswith("whsec_")
    with (
        service_process(hsettings, "relay", tmp_path),
        service_process(hsettings, "worker", tmp_path),
    ):
        async with receiving(judge=holding(str(old["secret"]))) as before:
            delivery, request = await deliver(db, api_client, auth, before)
        assert delivery["status"] == "delivered", delivery["last_error"]
        assert request.headers["webhook-id"] == str(delivery["id"])
        assert len(request.headers["webhook-signature"].split(" ")) == 1
        # The client's verifier takes a real delivery, and refuses it under another secret.
        event = verify_webhook(str(old["secret"]), request.headers, request.body)
        assert event == orjson.loads(request.body)
        with pytest.raises(WebhookVerificationFailed):
            verify_webhook(new_secret(), request.headers, request.body)

        new = secret_command(hsettings, "--rotate", overlap="PT1H")
        assert new["secret"] != old["secret"]
        assert new["rotation_overlap_seconds"] == 3600
        assert new["previous_expires_at"] is not None
        async with (
            receiving(judge=holding(str(old["secret"]))) as keeps_old,
            receiving(judge=holding(str(new["secret"]))) as took_new,
        ):
            for receiver in (keeps_old, took_new):
                delivery, request = await deliver(db, api_client, auth, receiver)
                assert delivery["status"] == "delivered", delivery["last_error"]
                # Both signatures, the new secret's first.
                first, second = request.headers["webhook-signature"].split(" ")
                assert first.startswith("v1,")
                assert second.startswith("v1,")
                with_new_only = {**request.headers, "webhook-signature": first}
                standardwebhooks.Webhook(str(new["secret"])).verify(request.body, with_new_only)

            await end_overlap(db, TENANT)
            refused, request = await deliver(db, api_client, auth, keeps_old)
            assert refused["status"] == "failed"
            assert refused["last_status_code"] == UNAUTHORIZED
            assert len(request.headers["webhook-signature"].split(" ")) == 1
            delivered, _ = await deliver(db, api_client, auth, took_new)
            assert delivered["status"] == "delivered", delivered["last_error"]


async def test_a_secret_issued_before_standard_webhooks_keeps_its_key(
    hsettings: Settings,
    db: Database,
    api_client: httpx.AsyncClient,
    auth: dict[str, str],
    broker_cleanup: None,
    tmp_path: Path,
) -> None:
    # The form jobcore issued before migration 0012 (secrets.token_urlsafe(32)).
    legacy = "whsec_" + "Zm9vYmFy-_" * 4 + "abc"
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO tenant_webhook_secrets (tenant, secret) VALUES (%s, %s)",
            (TENANT, legacy),
        )
    shown = secret_command(hsettings)
    assert shown["secret_format"] == "legacy"
    assert shown["secret"] != legacy  # the same key in the spelling the library decodes
    with (
        service_process(hsettings, "relay", tmp_path),
        service_process(hsettings, "worker", tmp_path),
    ):
        async with (
            receiving(judge=holding(str(shown["secret"]))) as standard_spelling,
            receiving(judge=holding(legacy.encode())) as raw_key,
        ):
            for receiver in (standard_spelling, raw_key):
                delivery, request = await deliver(db, api_client, auth, receiver)
                assert delivery["status"] == "delivered", delivery["last_error"]
                assert orjson.loads(request.body)["id"] == str(delivery["id"])

    # Rotating moves the tenant to a Standard Webhooks secret; the legacy one overlaps.
    rotated = secret_command(hsettings, "--rotate")
    assert rotated["secret_format"] == "standard"
    async with db.connection() as conn:
        row = await (
            await conn.execute(
                "SELECT previous_secret FROM tenant_webhook_secrets WHERE tenant = %s", (TENANT,)
            )
        ).fetchone()
    assert row is not None
    assert row["previous_secret"] == legacy
