"""Checking a webhook jobcore sent, per Standard Webhooks (https://www.standardwebhooks.com):
``Webhook-Signature: v1,<base64 HMAC-SHA256>`` over ``{Webhook-Id}.{Webhook-Timestamp}.{body}``
with the tenant's ``whsec_<base64>`` secret, and a timestamp within five minutes.

The ``standardwebhooks`` package does the checking; this turns its several failures (and a
malformed signature header, which it lets through as a ValueError) into one error.
"""

from __future__ import annotations

import binascii
from collections.abc import Mapping
from typing import Any

from standardwebhooks.webhooks import EmptyWebhookSecretError, Webhook, WebhookVerificationError

from jobcore.client.errors import WebhookVerificationFailed


def verify_webhook(secret: str | bytes, headers: Mapping[str, str], body: bytes | str) -> Any:
    """The webhook's JSON body, once its signature and timestamp verify; raises
    :class:`WebhookVerificationFailed` otherwise. Pass the body exactly as received, before
    any parsing, and the request's headers (any capitalisation).

    ``secret`` is the ``whsec_...`` string (or the raw key bytes); a secret that is not
    base64 raises ``ValueError``, since no webhook could ever verify with it.
    """
    try:
        webhook = Webhook(secret)
    except (EmptyWebhookSecretError, binascii.Error) as exc:
        raise ValueError("the webhook secret is not a whsec_ secret (base64)") from exc
    try:
        return webhook.verify(body, dict(headers.items()))
    except (WebhookVerificationError, ValueError) as exc:
        # ValueError: a signature that is not "version,base64", a body not UTF-8 or JSON.
        raise WebhookVerificationFailed(str(exc) or None) from None
