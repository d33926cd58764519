"""The usage folder: the tenants' usage deltas are folded into their rows.

Every job added appends a +1 to ``tenant_usage_deltas``, every job that ends a -1
(migration 0023), so that enqueues and outcomes write no shared row: behind a pinned xmin
horizon, a row updated per job gathers a version per job that nothing can prune, and
every reader walks them. The count a cap is checked against is the tenant's row plus its
deltas; the maintenance leader's folder keeps the deltas few, folding them into the rows
every ``JOBCORE_USAGE_FOLD_INTERVAL`` (2 s by default), in batches
(:data:`jobcore.sql.tenant_quotas.TENANT_USAGE_FOLD`): one row version per tenant per batch,
whatever the job rate.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from jobcore.db import UnitOfWork, fetch_one
from jobcore.maintenance.base import BatchService, ServiceConfig
from jobcore.settings import Settings
from jobcore.sql.tenant_quotas import TENANT_USAGE_FOLD

log = logging.getLogger(__name__)

# Deltas per batch (one transaction); a full batch is followed by another at once.
FOLD_BATCH = 5000


@dataclass(frozen=True)
class UsageFolderConfig(ServiceConfig):
    # The deltas a cap's check reads grow with the jobs added and ended per tenant in an
    # interval: the default is short (a round with nothing to fold is one index probe).
    interval: float = 2.0
    batch_size: int = FOLD_BATCH

    variables: ClassVar = {"interval": "JOBCORE_USAGE_FOLD_INTERVAL"}

    @classmethod
    def from_settings(cls, settings: Settings) -> UsageFolderConfig:
        return cls(interval=settings.usage_fold_interval)


class UsageFolder(BatchService[UsageFolderConfig]):
    name: ClassVar[str] = "usage_folder"

    @classmethod
    def from_settings(cls, settings: Settings) -> UsageFolder:
        return cls(UsageFolderConfig.from_settings(settings))

    async def work(self, uow: UnitOfWork) -> tuple[int, Sequence[Any]]:
        row = await fetch_one(uow, TENANT_USAGE_FOLD({"limit": self.config.batch_size}))
        folded = 0 if row is None else int(row["deltas"])
        return folded, [row] if folded else []

    def report(self, rows: Sequence[Any]) -> None:
        for row in rows:
            log.debug(
                "usage deltas folded",
                extra={"deltas": int(row["deltas"]), "tenants": int(row["tenants"])},
            )
