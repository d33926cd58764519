"""API keys: random, shown once, stored only as a SHA-256 hash, revocable at once.

A key is ``jc_`` followed by 43 URL-safe characters (256 random bits). That entropy is
why a plain SHA-256 is enough: nobody can guess a key from its hash, so a slow password
hash would only cost every request time. The first characters (``prefix``) are stored in
clear so people can tell their keys apart in ``jobcore keys list``.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobcore.db import Session, fetch_one
from jobcore.errors import JobcoreError
from jobcore.sql.api_keys import API_KEY_GET_TENANT

KEY_PREFIX = "jc_"
# What people see of a key after creation: enough to recognise it, too little to use.
DISPLAY_PREFIX_LENGTH = len(KEY_PREFIX) + 8
_KEY_RE = re.compile(r"^jc_[A-Za-z0-9_-]{20,128}$")
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_LABEL_LENGTH = 200


class InvalidApiKey(JobcoreError):
    """The API key is unknown or revoked."""


class MissingApiKey(JobcoreError):
    """An API key is required (Authorization: Bearer <key>)."""


class ApiKeyNotFound(JobcoreError):
    """No API key has that id."""


class InvalidTenantName(JobcoreError):
    """A tenant name is 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit."""


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A stored key, as anyone may see it: never the key itself, never its hash."""

    id: uuid.UUID
    tenant: str
    prefix: str
    label: str | None
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> ApiKey:
        return cls(
            row["id"],
            row["tenant"],
            row["prefix"],
            row["label"],
            row["created_at"],
            row["revoked_at"],
        )


@dataclass(frozen=True, slots=True)
class CreatedKey:
    record: ApiKey
    # The only time the key exists outside the caller's hands.
    key: str


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def looks_like_key(candidate: str) -> bool:
    """Whether ``candidate`` has the shape of a key (saves a lookup for garbage)."""
    return _KEY_RE.match(candidate) is not None


def check_tenant_name(tenant: str) -> str:
    if not _TENANT_RE.match(tenant):
        raise InvalidTenantName(f"bad tenant name {tenant!r}: {InvalidTenantName.__doc__}")
    return tenant


async def tenant_for_key(uow: Session, key: str) -> str:
    """The tenant a key belongs to; :class:`InvalidApiKey` if it is unknown or revoked.

    Looked up on every request (one index probe), so a revocation takes effect at once.
    """
    if not looks_like_key(key):
        raise InvalidApiKey()
    row = await fetch_one(uow, API_KEY_GET_TENANT({"key_hash": hash_key(key)}))
    if row is None:
        raise InvalidApiKey()
    return str(row["tenant"])
