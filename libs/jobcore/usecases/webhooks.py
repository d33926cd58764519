"""Webhook use cases: tenants' signing secrets (show, rotate), deliveries (list, redeliver,
a tenant's job's) and default endpoints — what the `jobcore webhooks` commands and
``GET /jobs/{id}/deliveries`` do, and the secret the worker signs with."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from psycopg.rows import DictRow

from jobcore.amqp.topology import Topology
from jobcore.apikeys import check_tenant_name
from jobcore.audit import AuditAction, Target, audited, url_fingerprint
from jobcore.db import Database, Session, UnitOfWork
from jobcore.errors import JobcoreError, JobNotFound
from jobcore.registry import Registry
from jobcore.settings import Settings
from jobcore.store import webhook_delivery_store, webhook_endpoint_store, webhook_secret_store
from jobcore.webhooks import (
    check_callback_url,
    completion_params,
    is_standard_secret,
    new_secret,
    standard_form,
)

ANY_JOB_TYPE = "*"
DELIVERY_STATUSES = ("pending", "delivered", "failed")


class DeliveryNotFound(JobcoreError):
    """No webhook delivery has that id."""


class EndpointNotFound(JobcoreError):
    """That tenant has no default endpoint for that job type."""


async def tenant_secret(uow: UnitOfWork, tenant: str) -> DictRow:
    """The tenant's signing secret row (``secret``, ``previous_secret`` while a rotation's
    overlap lasts, else None, ``created_at``, ``rotated_at``, ``previous_expires_at``,
    ``created``), created on first need."""
    for _ in range(2):
        row = await webhook_secret_store.ensure(uow, {"tenant": tenant, "secret": new_secret()})
        if row is not None:
            return row
    # pragma: no cover - only a concurrent creation that then vanished gets here
    raise JobcoreError(f"could not read or create the signing secret of tenant {tenant!r}")


def signing_secrets(row: Mapping[str, Any]) -> list[str]:
    """The secrets a webhook is signed with, the current one first: ``row`` has
    ``secret`` and ``previous_secret`` (None once the overlap is over)."""
    current = [str(row["secret"])]
    previous = row["previous_secret"]
    return current if previous is None else [*current, str(previous)]


async def show_or_rotate_secret(
    db: Database, settings: Settings, tenant: str, *, rotate: bool, actor: str
) -> dict[str, Any]:
    """The tenant's signing secret (created if it has none), or a new one with ``rotate``,
    the replaced one still signing for ``JOBCORE_WEBHOOK_SECRET_OVERLAP``. Both are
    audited: showing a secret hands out what forges the tenant's webhooks.

    ``secret`` is what a receiver gives a Standard Webhooks library; for a secret issued
    before those, that spelling of its unchanged key (``secret_format`` says ``legacy``).
    """
    check_tenant_name(tenant)
    action = AuditAction.WEBHOOK_SECRET_ROTATE if rotate else AuditAction.WEBHOOK_SECRET_REVEAL
    target = Target("webhook_secret", tenant)
    overlap = settings.webhook_secret_overlap
    async with audited(db, actor=actor, action=action, target=target) as work:
        work.entry.tenant = tenant
        if rotate:
            row = await webhook_secret_store.rotate(
                work.uow,
                {"tenant": tenant, "secret": new_secret(), "overlap": overlap.total_seconds()},
            )
            assert row is not None  # an upsert with RETURNING always returns the row
        else:
            row = await tenant_secret(work.uow, tenant)
        secret_format = "standard" if is_standard_secret(row["secret"]) else "legacy"
        # When and how, never what: the secrets stay out of the log.
        work.entry.details = {
            "created": row["created"],
            "rotated_at": row["rotated_at"],
            "secret_format": secret_format,
        }
        if rotate:
            work.entry.details["previous_expires_at"] = row["previous_expires_at"]
            work.entry.details["overlap_seconds"] = overlap.total_seconds()
        await work.commit()
    return {
        "tenant": tenant,
        "secret": standard_form(row["secret"]),
        "secret_format": secret_format,
        "created_at": row["created_at"],
        "rotated_at": row["rotated_at"],
        # Until when the replaced secret still signs (past: it no longer does).
        "previous_expires_at": row["previous_expires_at"],
        "rotation_overlap_seconds": overlap.total_seconds(),
    }


async def list_deliveries(
    db: Database, *, job_id: uuid.UUID | None, status: str | None, limit: int
) -> list[DictRow]:
    if status is not None and status not in DELIVERY_STATUSES:
        raise JobcoreError(f"status is one of {', '.join(DELIVERY_STATUSES)}")
    async with db.unit_of_work() as uow:
        return await webhook_delivery_store.list_deliveries(
            uow, {"job_id": job_id, "status": status, "limit": limit}
        )


async def job_deliveries(uow: Session, tenant: str, job_id: uuid.UUID) -> list[DictRow]:
    """The webhook deliveries of the tenant's job, oldest first;
    :class:`~jobcore.errors.JobNotFound` for a job the tenant does not have."""
    rows = await webhook_delivery_store.list_for_job(uow, {"job_id": job_id, "tenant": tenant})
    if not rows:
        raise JobNotFound("no job with that id")
    # The job without deliveries is one row of NULL delivery columns.
    return [row for row in rows if row["id"] is not None]


async def redeliver(
    db: Database, settings: Settings, delivery_id: uuid.UUID, *, actor: str
) -> DictRow:
    """A new attempt of a delivery, now, through the outbox (a failed one too)."""
    topology = Topology.from_settings(settings)
    target = Target("webhook_delivery", str(delivery_id))
    async with audited(
        db, actor=actor, action=AuditAction.WEBHOOK_REDELIVER, target=target
    ) as work:
        row = await webhook_delivery_store.redeliver(
            work.uow, {**completion_params(topology, settings), "id": delivery_id}
        )
        if row is None:
            raise DeliveryNotFound(f"no webhook delivery with id {delivery_id}")
        work.entry.tenant = row["tenant"]
        work.entry.details = {"job_id": row["job_id"], "attempt": row["attempt"]}
        await work.commit()
    return row


async def set_endpoint(
    db: Database,
    settings: Settings,
    registry: Registry,
    tenant: str,
    job_type: str,
    url: str,
    *,
    actor: str,
) -> DictRow:
    """Make ``url`` the tenant's default endpoint for a job type (``*``: every type)."""
    check_tenant_name(tenant)
    if job_type != ANY_JOB_TYPE:
        registry.get(job_type)  # UnknownJobType for a typo
    await check_callback_url(url, settings.webhook_allowed_hosts)
    target = Target("webhook_endpoint", f"{tenant}/{job_type}")
    async with audited(
        db, actor=actor, action=AuditAction.WEBHOOK_ENDPOINT_SET, target=target
    ) as work:
        work.entry.tenant = tenant
        work.entry.details = {"job_type": job_type, **url_fingerprint(url)}
        row = await webhook_endpoint_store.set(
            work.uow, {"tenant": tenant, "type": job_type, "url": url}
        )
        await work.commit()
    assert row is not None  # an upsert with RETURNING always returns the row
    return row


async def list_endpoints(db: Database, tenant: str | None) -> list[DictRow]:
    async with db.unit_of_work() as uow:
        return await webhook_endpoint_store.list_endpoints(uow, {"tenant": tenant})


async def remove_endpoint(
    db: Database, tenant: str, job_type: str, *, actor: str
) -> dict[str, Any]:
    target = Target("webhook_endpoint", f"{tenant}/{job_type}")
    async with audited(
        db, actor=actor, action=AuditAction.WEBHOOK_ENDPOINT_REMOVE, target=target
    ) as work:
        row = await webhook_endpoint_store.delete(work.uow, {"tenant": tenant, "type": job_type})
        if row is None:
            raise EndpointNotFound(f"tenant {tenant!r} has no default endpoint for {job_type!r}")
        work.entry.tenant = tenant
        work.entry.details = {"job_type": job_type, **url_fingerprint(row["url"])}
        await work.commit()
    return dict(row)
