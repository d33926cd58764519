"""Tenant quota use cases: set overrides, show a tenant's effective quotas and usage, list
the tenants — what the `jobcore tenants` commands do. The quotas themselves are enforced
by the enqueue statement and the API's long-poll caps (jobcore.quotas)."""

from __future__ import annotations

from enum import Enum
from typing import Any, Final

from jobcore.apikeys import check_tenant_name
from jobcore.db import Database
from jobcore.errors import JobcoreError
from jobcore.quotas import MAX_RATE, MIN_RATE, Quotas
from jobcore.store import QuotaDefaultParams, tenant_store


class _Keep(Enum):
    KEEP = "keep"


# A quota that set_quotas leaves as it is (None: back to the deployment's default).
KEEP: Final = _Keep.KEEP

QUOTA_NAMES = ("enqueue_rate", "enqueue_burst", "max_unfinished", "max_long_polls")


class InvalidQuota(JobcoreError):
    """A quota is a number: a rate at least 0 (0: unlimited), a burst at least 1, a cap at
    least 0 (0: unlimited)."""


def _defaults(quotas: Quotas) -> QuotaDefaultParams:
    return {
        "default_rate": quotas.enqueue_rate,
        "default_burst": quotas.enqueue_burst,
        "default_max_unfinished": quotas.max_unfinished,
        "default_max_long_polls": quotas.max_long_polls,
    }


def check_quota(name: str, value: float | None) -> None:
    if value is None:
        return
    if name == "enqueue_burst":
        if not (isinstance(value, int) and 1 <= value <= 1_000_000):
            raise InvalidQuota(
                f"enqueue burst must be a whole number from 1 to 1000000, not {value}"
            )
    elif name == "enqueue_rate":
        if not (value == 0 or MIN_RATE <= value <= MAX_RATE):
            raise InvalidQuota(
                f"enqueue rate must be 0 (unlimited) or from one a day to {MAX_RATE:g} "
                f"per second, not {value:g}/s"
            )
    elif not (isinstance(value, int) and 0 <= value <= 1_000_000_000):
        raise InvalidQuota(f"{name.replace('_', ' ')} must be a whole number from 0, not {value}")


async def set_quotas(
    db: Database,
    tenant: str,
    *,
    enqueue_rate: float | _Keep | None = KEEP,
    enqueue_burst: int | _Keep | None = KEEP,
    max_unfinished: int | _Keep | None = KEEP,
    max_long_polls: int | _Keep | None = KEEP,
) -> None:
    """Override some of the tenant's quotas (None: back to the default); others keep
    theirs. Takes effect on the next request on every API process."""
    check_tenant_name(tenant)
    given = {
        "enqueue_rate": enqueue_rate,
        "enqueue_burst": enqueue_burst,
        "max_unfinished": max_unfinished,
        "max_long_polls": max_long_polls,
    }
    for name, value in given.items():
        if value is not KEEP:
            check_quota(name, value)
    async with db.unit_of_work() as uow:
        await tenant_store.set_quotas(
            uow,
            {
                "tenant": tenant,
                "set_enqueue_rate": enqueue_rate is not KEEP,
                "enqueue_rate": None if enqueue_rate is KEEP else enqueue_rate,
                "set_enqueue_burst": enqueue_burst is not KEEP,
                "enqueue_burst": None if enqueue_burst is KEEP else enqueue_burst,
                "set_max_unfinished": max_unfinished is not KEEP,
                "max_unfinished": None if max_unfinished is KEEP else max_unfinished,
                "set_max_long_polls": max_long_polls is not KEEP,
                "max_long_polls": None if max_long_polls is KEEP else max_long_polls,
            },
        )
        await uow.commit()


async def show_quotas(db: Database, tenant: str, defaults: Quotas) -> dict[str, Any]:
    """The tenant's effective quotas, whether each is an override, and its usage."""
    check_tenant_name(tenant)
    async with db.connection() as conn:
        row = await tenant_store.get_quotas(conn, {"tenant": tenant, **_defaults(defaults)})
    assert row is not None  # one row for any tenant name
    return dict(row)


async def list_quotas(db: Database, defaults: Quotas) -> list[dict[str, Any]]:
    """Every tenant with an override or a job, with its overrides and unfinished jobs."""
    async with db.connection() as conn:
        rows = await tenant_store.list_quotas(conn, _defaults(defaults))
    return [dict(row) for row in rows]
