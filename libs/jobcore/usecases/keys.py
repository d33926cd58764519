"""API key use cases: create (the key is shown once), list, revoke (refused from the next
request on). The key format and the lookup every request makes are :mod:`jobcore.apikeys`."""

from __future__ import annotations

import uuid

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
from jobcore.db import Database, fetch_all, fetch_one
from jobcore.errors import JobcoreError
from jobcore.sql.api_keys import API_KEY_INSERT, API_KEY_LIST, API_KEY_REVOKE


async def create_key(
    db: Database, tenant: str, label: str | None = None, *, actor: str
) -> CreatedKey:
    check_tenant_name(tenant)
    if label is not None and (len(label) > MAX_LABEL_LENGTH or "\x00" in label):
        raise JobcoreError(f"a label is at most {MAX_LABEL_LENGTH} characters, without NUL")
    key = generate_key()
    key_id = uuid.uuid4()
    target = Target("api_key", str(key_id))
    async with audited(db, actor=actor, action=AuditAction.KEY_CREATE, target=target) as work:
        # Not the key, its hash or its prefix: the id names it (`jobcore keys list`).
        work.entry.tenant = tenant
        work.entry.details = {"label": label}
        row = await fetch_one(
            work.uow,
            API_KEY_INSERT(
                {
                    "id": key_id,
                    "tenant": tenant,
                    "key_hash": hash_key(key),
                    "prefix": key[:DISPLAY_PREFIX_LENGTH],
                    "label": label,
                }
            ),
        )
        await work.commit()
    assert row is not None  # INSERT ... RETURNING always returns the row
    return CreatedKey(ApiKey.from_row(row), key)


async def list_keys(db: Database, tenant: str | None = None) -> list[ApiKey]:
    async with db.unit_of_work() as uow:
        rows = await fetch_all(uow, API_KEY_LIST({"tenant": tenant}))
    return [ApiKey.from_row(row) for row in rows]


async def revoke_key(db: Database, key_id: uuid.UUID, *, actor: str) -> ApiKey:
    """Revoke a key (idempotent); :class:`ApiKeyNotFound` if there is no such key."""
    target = Target("api_key", str(key_id))
    async with audited(db, actor=actor, action=AuditAction.KEY_REVOKE, target=target) as work:
        row = await fetch_one(work.uow, API_KEY_REVOKE({"id": key_id}))
        if row is None:
            raise ApiKeyNotFound(f"no API key with id {key_id}")
        work.entry.tenant = row["tenant"]
        work.entry.details = {"revoked_at": row["revoked_at"]}
        await work.commit()
    return ApiKey.from_row(row)
