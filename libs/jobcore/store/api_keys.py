"""The ``api_keys`` table: :class:`ApiKeyStore`, a method per statement of
:mod:`jobcore.sql.api_keys`: the lookup every request makes, and what the key commands do
(create, list, revoke, rotate)."""

from __future__ import annotations

from psycopg.rows import DictRow

from jobcore.db import Reader, fetch_all, fetch_one
from jobcore.sql.api_keys import (
    API_KEY_AUTHENTICATE,
    API_KEY_EXPIRE,
    API_KEY_GET_FOR_ROTATION,
    API_KEY_INSERT,
    API_KEY_LIST,
    API_KEY_LOCK_LINEAGE,
    API_KEY_REVOKE,
    ApiKeyAuthenticateParams,
    ApiKeyExpireParams,
    ApiKeyIdParams,
    ApiKeyInsertParams,
    ApiKeyListParams,
)

__all__ = [
    "ApiKeyAuthenticateParams",
    "ApiKeyExpireParams",
    "ApiKeyIdParams",
    "ApiKeyInsertParams",
    "ApiKeyListParams",
    "ApiKeyStore",
    "api_key_store",
]


class ApiKeyStore:
    __slots__ = ()

    async def authenticate(self, on: Reader, params: ApiKeyAuthenticateParams) -> DictRow | None:
        """The usable key with this hash (id, tenant, scopes, expiry), its use noted at
        most once a minute; None if no usable key has it."""
        return await fetch_one(on, API_KEY_AUTHENTICATE(params))

    async def insert(self, on: Reader, params: ApiKeyInsertParams) -> DictRow | None:
        return await fetch_one(on, API_KEY_INSERT(params))

    async def list_keys(self, on: Reader, params: ApiKeyListParams) -> list[DictRow]:
        """Every key, or one tenant's (``tenant``), oldest first; never a key or its hash."""
        return await fetch_all(on, API_KEY_LIST(params))

    async def revoke(self, on: Reader, params: ApiKeyIdParams) -> DictRow | None:
        return await fetch_one(on, API_KEY_REVOKE(params))

    async def lock_lineage(self, on: Reader, params: ApiKeyIdParams) -> DictRow | None:
        """Lock the first key of the key's lineage (rotations of one lineage take turns);
        None if there is no such key."""
        return await fetch_one(on, API_KEY_LOCK_LINEAGE(params))

    async def get_for_rotation(self, on: Reader, params: ApiKeyIdParams) -> DictRow | None:
        """The key, how long it was made to last, and how many of its lineage are usable."""
        return await fetch_one(on, API_KEY_GET_FOR_ROTATION(params))

    async def expire(self, on: Reader, params: ApiKeyExpireParams) -> DictRow | None:
        """Make the key expire ``within`` (or keep its earlier expiry)."""
        return await fetch_one(on, API_KEY_EXPIRE(params))


api_key_store = ApiKeyStore()
