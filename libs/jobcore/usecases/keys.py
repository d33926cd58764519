"""API key use cases: create (the key is shown once), list, revoke (refused from the next
request on) and rotate (a new key, the old one usable for an overlap). The key format and
the lookup every request makes are :mod:`jobcore.apikeys`."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from jobcore.apikeys import (
    DISPLAY_PREFIX_LENGTH,
    MAX_LABEL_LENGTH,
    ApiKey,
    ApiKeyNotFound,
    CreatedKey,
    check_tenant_name,
    generate_key,
    hash_key,
)
from jobcore.audit import AuditAction, Target, audited
from jobcore.db import Database, UnitOfWork
from jobcore.errors import JobcoreError
from jobcore.scopes import DEFAULT_SCOPES, Scope
from jobcore.store import api_key_store

# How long the old key keeps working after a rotation unless told otherwise: a day for
# every client to pick up the new key.
DEFAULT_ROTATION_OVERLAP = timedelta(hours=24)
MAX_ROTATION_OVERLAP = timedelta(days=90)
# At most this many usable keys per lineage: the current one and the one it replaces.
MAX_USABLE_PER_LINEAGE = 2


class InvalidKeyRequest(JobcoreError):
    """The key cannot be created or rotated as asked."""


class RotationRefused(JobcoreError):
    """A key is rotated while it is usable and its lineage has no other usable key."""


def _check_label(label: str | None) -> None:
    if label is not None and (len(label) > MAX_LABEL_LENGTH or "\x00" in label):
        raise InvalidKeyRequest(f"a label is at most {MAX_LABEL_LENGTH} characters, without NUL")


def _check_scopes(scopes: Iterable[Scope | str]) -> list[str]:
    try:
        chosen = sorted({Scope(s) for s in scopes}, key=list(Scope).index)
    except ValueError as exc:
        names = ", ".join(Scope)
        raise InvalidKeyRequest(f"{exc}; a scope is one of {names}") from None
    if not chosen:
        raise InvalidKeyRequest("a key needs at least one scope")
    return [scope.value for scope in chosen]


def _check_expiry(expires_at: datetime | None, expires_in: timedelta | None) -> None:
    if expires_at is not None and expires_in is not None:
        raise InvalidKeyRequest("give an expiry time or a lifetime, not both")
    if expires_in is not None and expires_in <= timedelta(0):
        raise InvalidKeyRequest("a key's lifetime must be positive")
    if expires_at is not None:
        if expires_at.tzinfo is None:
            raise InvalidKeyRequest("an expiry time needs a time zone (e.g. 2027-01-31T00:00Z)")
        if expires_at <= datetime.now(UTC):
            raise InvalidKeyRequest("the expiry time is in the past")


async def _insert(
    uow: UnitOfWork,
    *,
    tenant: str,
    label: str | None,
    scopes: list[str],
    expires_at: datetime | None,
    expires_in: timedelta | None,
    key_id: uuid.UUID,
    rotated_from: ApiKey | None = None,
) -> CreatedKey:
    key = generate_key()
    row = await api_key_store.insert(
        uow,
        {
            "id": key_id,
            "tenant": tenant,
            "key_hash": hash_key(key),
            "prefix": key[:DISPLAY_PREFIX_LENGTH],
            "label": label,
            "scopes": scopes,
            "expires_at": expires_at,
            "expires_in": expires_in,
            "lineage": key_id if rotated_from is None else rotated_from.lineage,
            "rotated_from": None if rotated_from is None else rotated_from.id,
        },
    )
    assert row is not None  # INSERT ... RETURNING always returns the row
    return CreatedKey(ApiKey.from_row(row), key)


async def create_key(
    db: Database,
    tenant: str,
    label: str | None = None,
    *,
    scopes: Iterable[Scope | str] = DEFAULT_SCOPES,
    expires_at: datetime | None = None,
    expires_in: timedelta | None = None,
    actor: str,
) -> CreatedKey:
    """A new key of ``tenant`` with ``scopes`` (admin only when named), expiring at
    ``expires_at`` or after ``expires_in`` (never, without either)."""
    check_tenant_name(tenant)
    _check_label(label)
    chosen = _check_scopes(scopes)
    _check_expiry(expires_at, expires_in)
    key_id = uuid.uuid4()
    target = Target("api_key", str(key_id))
    async with audited(db, actor=actor, action=AuditAction.KEY_CREATE, target=target) as work:
        # Not the key, its hash or its prefix: the id names it (`jobcore keys list`).
        work.entry.tenant = tenant
        work.entry.details = {"label": label, "scopes": chosen}
        created = await _insert(
            work.uow,
            tenant=tenant,
            label=label,
            scopes=chosen,
            expires_at=expires_at,
            expires_in=expires_in,
            key_id=key_id,
        )
        await work.commit()
    return created


async def list_keys(db: Database, tenant: str | None = None) -> list[ApiKey]:
    async with db.unit_of_work() as uow:
        rows = await api_key_store.list_keys(uow, {"tenant": tenant})
    return [ApiKey.from_row(row) for row in rows]


async def revoke_key(db: Database, key_id: uuid.UUID, *, actor: str) -> ApiKey:
    """Revoke a key (idempotent); :class:`ApiKeyNotFound` if there is no such key."""
    target = Target("api_key", str(key_id))
    async with audited(db, actor=actor, action=AuditAction.KEY_REVOKE, target=target) as work:
        row = await api_key_store.revoke(work.uow, {"id": key_id})
        if row is None:
            raise ApiKeyNotFound(f"no API key with id {key_id}")
        work.entry.tenant = row["tenant"]
        work.entry.details = {"revoked_at": row["revoked_at"]}
        await work.commit()
    return ApiKey.from_row(row)


async def rotate_key(
    db: Database,
    key_id: uuid.UUID,
    *,
    overlap: timedelta = DEFAULT_ROTATION_OVERLAP,
    expires_in: timedelta | None = None,
    actor: str,
) -> tuple[CreatedKey, ApiKey]:
    """A new key with the old one's tenant, scopes and label, and the old key made to
    expire after ``overlap``: both work meanwhile, so clients switch without downtime.

    The new key lasts ``expires_in``, or as long as the old key was made to last (for
    ever if it had no expiry). Refused (:class:`RotationRefused`) for a key that is not
    usable, and for a lineage that already has two usable keys (a rotation still in its
    overlap): a third would let keys pile up. Returns the new key and the old one.
    """
    if not timedelta(0) <= overlap <= MAX_ROTATION_OVERLAP:
        raise InvalidKeyRequest(f"the overlap is from 0 to {MAX_ROTATION_OVERLAP.days} days")
    _check_expiry(None, expires_in)
    target = Target("api_key", str(key_id))
    async with audited(db, actor=actor, action=AuditAction.KEY_ROTATE, target=target) as work:
        uow = work.uow
        if await api_key_store.lock_lineage(uow, {"id": key_id}) is None:
            raise ApiKeyNotFound(f"no API key with id {key_id}")
        row = await api_key_store.get_for_rotation(uow, {"id": key_id})
        assert row is not None  # locked above, and keys are never deleted
        old = ApiKey.from_row(row)
        work.entry.tenant = old.tenant
        if old.state != "active":
            raise RotationRefused(f"key {key_id} is {old.state}; create a new key instead")
        if row["usable_in_lineage"] >= MAX_USABLE_PER_LINEAGE:
            raise RotationRefused(
                f"key {key_id} was rotated already and its successor is usable too; revoke "
                "one of them (or wait for the old one to expire) before rotating again"
            )
        created = await _insert(
            uow,
            tenant=old.tenant,
            label=old.label,
            scopes=[scope.value for scope in old.scopes],
            expires_at=None,
            expires_in=expires_in if expires_in is not None else row["lifetime"],
            key_id=uuid.uuid4(),
            rotated_from=old,
        )
        expiring = await api_key_store.expire(uow, {"id": key_id, "within": overlap})
        assert expiring is not None
        work.entry.details = {
            "new_key_id": str(created.record.id),
            "old_key_expires_at": expiring["expires_at"],
        }
        await work.commit()
    return created, ApiKey.from_row(expiring)
