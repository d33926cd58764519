"""API keys: random, shown once, stored only as a SHA-256 hash, revocable at once.

A key is ``jc_`` followed by 43 URL-safe characters (256 random bits). That entropy is
why a plain SHA-256 is enough: nobody can guess a key from its hash, so a slow password
hash would only cost every request time. The first characters (``prefix``) are stored in
clear so people can tell their keys apart in ``jobcore keys list``.

A key carries scopes (:mod:`jobcore.scopes`) and may expire. An unknown, revoked and
expired key get the same answer (:class:`InvalidApiKey`): the caller is never told which.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobcore.db import Session
from jobcore.errors import JobcoreError
from jobcore.scopes import Scope
from jobcore.store import api_key_store

KEY_PREFIX = "jc_"
# What people see of a key after creation: enough to recognise it, too little to use.
DISPLAY_PREFIX_LENGTH = len(KEY_PREFIX) + 8
_KEY_RE = re.compile(r"^jc_[A-Za-z0-9_-]{20,128}$")
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MAX_LABEL_LENGTH = 200


class InvalidApiKey(JobcoreError):
    """The API key is unknown, revoked or expired."""


class MissingScope(JobcoreError):
    """The API key does not have the scope this route needs."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        super().__init__(f"this API key lacks the {scope.value!r} scope")


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
    scopes: tuple[Scope, ...]
    # active, expired or revoked (as the database's clock sees it)
    state: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    # Up to a minute stale (written at most once a minute per key).
    last_used_at: datetime | None
    # The first key of its rotation chain, and the key it replaced (None for a first key).
    lineage: uuid.UUID
    rotated_from: uuid.UUID | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ApiKey:
        return cls(
            id=row["id"],
            tenant=row["tenant"],
            prefix=row["prefix"],
            label=row["label"],
            scopes=tuple(Scope(s) for s in row["scopes"]),
            state=row["state"],
            created_at=row["created_at"],
            expires_at=row["expires_at"],
            revoked_at=row["revoked_at"],
            last_used_at=row["last_used_at"],
            lineage=row["lineage"],
            rotated_from=row["rotated_from"],
        )


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request comes from: the key's id (never the key), its tenant and scopes."""

    key_id: uuid.UUID
    tenant: str
    scopes: frozenset[Scope]

    def require(self, scope: Scope) -> None:
        if scope not in self.scopes:
            raise MissingScope(scope)


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


async def authenticate(session: Session, key: str) -> Principal:
    """Who ``key`` belongs to; :class:`InvalidApiKey` if it is unknown, revoked or expired.

    Looked up on every request (one statement: an index probe, and at most once a minute
    a write of the key's last use), so a revocation or an expiry takes effect at once
    (unless the API is told to remember verified keys: JOBCORE_API_KEY_CACHE_SECONDS; the
    enqueue route remembers them for a few seconds and its statement checks the key).
    A string that cannot be a key is refused without a lookup.
    """
    if not looks_like_key(key):
        raise InvalidApiKey()
    return await authenticate_hash(session, hash_key(key))


async def authenticate_hash(session: Session, key_hash: str) -> Principal:
    """:func:`authenticate` for a key known by its hash only: the console keeps the hash
    of the key a browser signed in with (never the key), and checks it on every request,
    so a revoked or expired key ends its sessions at once."""
    principal, _ = await authenticate_hash_until(session, key_hash)
    return principal


async def authenticate_hash_until(
    session: Session, key_hash: str
) -> tuple[Principal, datetime | None]:
    """:func:`authenticate_hash`, and when the key expires (None: never), for a caller
    that remembers the answer for a while (``services.api.auth.KeyCache``)."""
    row = await api_key_store.authenticate(session, {"key_hash": key_hash})
    if row is None:
        raise InvalidApiKey()
    principal = Principal(row["id"], row["tenant"], frozenset(Scope(s) for s in row["scopes"]))
    return principal, row["expires_at"]
