"""The tenants' quotas and usage (``tenant_quotas``, ``tenant_usage``,
``tenant_usage_deltas``): :class:`TenantStore`, a method per statement of
:mod:`jobcore.sql.tenant_quotas`. The enqueue statements check the quotas themselves,
through :class:`jobcore.store.JobStore`."""

from __future__ import annotations

from psycopg.rows import DictRow

from jobcore.db import Reader, fetch_all, fetch_one
from jobcore.sql import Statement
from jobcore.sql.tenant_quotas import (
    TENANT_MAX_LONG_POLLS,
    TENANT_QUOTA_GET,
    TENANT_QUOTA_LIST,
    TENANT_QUOTA_SET,
    TENANT_USAGE_FOLD,
    TENANT_USAGE_LOCK,
    QuotaDefaultParams,
    TenantMaxLongPollsParams,
    TenantQuotaGetParams,
    TenantQuotaSetParams,
    TenantUsageFoldParams,
    TenantUsageLockParams,
)

__all__ = [
    "QuotaDefaultParams",
    "TenantMaxLongPollsParams",
    "TenantQuotaGetParams",
    "TenantQuotaSetParams",
    "TenantStore",
    "TenantUsageFoldParams",
    "TenantUsageLockParams",
    "tenant_store",
]


class TenantStore:
    __slots__ = ()

    def lock_usage_statement(self, params: TenantUsageLockParams) -> Statement:
        """The lock of the tenant's usage row, bound, for the batch insert to send in its
        own round trip (:meth:`jobcore.store.JobStore.insert_many`'s ``behind``)."""
        return TENANT_USAGE_LOCK(params)

    async def get_quotas(self, on: Reader, params: TenantQuotaGetParams) -> DictRow | None:
        """The tenant's effective quotas, which are overrides, and its usage: one row for
        any tenant name."""
        return await fetch_one(on, TENANT_QUOTA_GET(params))

    async def max_long_polls(self, on: Reader, params: TenantMaxLongPollsParams) -> DictRow | None:
        """How many long-polls the tenant may park (its override, else the default)."""
        return await fetch_one(on, TENANT_MAX_LONG_POLLS(params))

    async def set_quotas(self, on: Reader, params: TenantQuotaSetParams) -> DictRow | None:
        """Override the quotas flagged ``set_*`` (None: back to the default)."""
        return await fetch_one(on, TENANT_QUOTA_SET(params))

    async def list_quotas(self, on: Reader, params: QuotaDefaultParams) -> list[DictRow]:
        """Every tenant with an override or a job: its overrides and unfinished jobs."""
        return await fetch_all(on, TENANT_QUOTA_LIST(params))

    async def fold_usage(self, on: Reader, params: TenantUsageFoldParams) -> DictRow | None:
        """Fold a batch of usage deltas into their tenants' rows: how many, and where the
        batch ended."""
        return await fetch_one(on, TENANT_USAGE_FOLD(params))


tenant_store = TenantStore()
