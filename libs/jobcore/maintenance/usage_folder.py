"""The usage folder: the tenants' usage deltas are folded into their rows.

Every statement that adds or ends jobs appends to ``tenant_usage_deltas`` one row per
tenant, the jobs it added less those it ended (migrations 0023, 0027), so that enqueues and
outcomes write no shared row: behind a pinned xmin
horizon, a row updated per job gathers a version per job that nothing can prune, and
every reader walks them. The count a cap is checked against is the tenant's row plus its
deltas; the maintenance leader's folder keeps the deltas few, folding them into the rows
every ``JOBCORE_USAGE_FOLD_INTERVAL`` (2 s by default), in batches
(:meth:`jobcore.database.store.TenantStore.fold_usage`): one row version per tenant per batch,
whatever the job rate.

Every service shares the leader's one connection, the gate releaser's rounds and the
lease's renewal among them: the fold never waits for a tenant's row that an application
transaction holds (it folds that tenant in a later round), and waits for any other lock
at most ``lock_timeout`` before it leaves the rest of its round to the next.

The folder deletes every delta it folds, and VACUUMs the table itself after every
``FOLD_VACUUM_EVERY`` deltas (:mod:`jobcore.maintenance.table_vacuum`): until a VACUUM
records their space as free, each new delta takes new space, and autovacuum comes by once a
minute at most.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from jobcore.database.gateway import UnitOfWork, lock_wait_ran_out
from jobcore.database.store import database_store, tenant_store
from jobcore.kernel.errors import DatabaseUnavailable
from jobcore.kernel.settings import Settings
from jobcore.maintenance.base import BatchService, ServiceConfig
from jobcore.maintenance.lease import Term
from jobcore.maintenance.table_vacuum import TableVacuum

log = logging.getLogger(__name__)

# Deltas per batch (one transaction); a full batch is followed by another at once.
FOLD_BATCH = 5000
# Deltas folded (deleted) between two VACUUMs of the table: at a steady 140 jobs/s, one
# every 2.5 s or so, the dead deltas two pages at most (at 1,000 deltas, one every 10 s, the
# table still grew by 90 B/job: new deltas took new pages until the VACUUM).
FOLD_VACUUM_EVERY = 250
# Below every primary key of tenant_usage_deltas (ids start at 1): a round starts here.
FOLD_START_ID = -(2**63)


@dataclass(frozen=True)
class UsageFolderConfig(ServiceConfig):
    # The deltas a cap's check reads grow with the jobs added and ended per tenant in an
    # interval: the default is short (a round with nothing to fold is one index probe).
    interval: float = 2.0
    batch_size: int = FOLD_BATCH
    # How long a batch waits for a lock (a delta the previous release's admission holds, a
    # tenant's row being inserted) before it leaves the round to the next one.
    lock_timeout: float = 0.2

    variables: ClassVar = {"interval": "JOBCORE_USAGE_FOLD_INTERVAL"}

    @classmethod
    def from_settings(cls, settings: Settings) -> UsageFolderConfig:
        return cls(interval=settings.usage_fold_interval)

    def check(self) -> None:
        super().check()
        self.positive("lock_timeout")


class UsageFolder(BatchService[UsageFolderConfig]):
    name: ClassVar[str] = "usage_folder"

    @classmethod
    def from_settings(cls, settings: Settings) -> UsageFolder:
        vacuum = TableVacuum(
            settings, "tenant_usage_deltas", FOLD_VACUUM_EVERY, owner="usage-folder"
        )
        return cls(UsageFolderConfig.from_settings(settings), vacuum)

    def __init__(self, config: UsageFolderConfig, vacuum: TableVacuum | None = None) -> None:
        super().__init__(config)
        self.vacuum = vacuum
        # Where the round is (the primary key the last batch ended at).
        self._after: tuple[str, int] = ("", FOLD_START_ID)

    async def close(self) -> None:
        if self.vacuum is not None:
            await self.vacuum.close()

    async def lead(self, term: Term) -> int:
        self._after = ("", FOLD_START_ID)
        try:
            return await super().lead(term)
        except DatabaseUnavailable as exc:
            if not lock_wait_ran_out(exc):
                raise
            # The batch rolled back: its deltas stay where they are, for the next round.
            log.info(
                "a usage fold batch waited for a lock past its lock_timeout; the round is "
                "left to the next",
                extra={"lock_timeout": self.config.lock_timeout},
            )
            return 0

    async def work(self, uow: UnitOfWork) -> tuple[int, Sequence[Any]]:
        milliseconds = max(1, round(self.config.lock_timeout * 1000))
        await database_store.set_lock_timeout(uow, {"milliseconds": milliseconds})
        after_tenant, after_id = self._after
        row = await tenant_store.fold_usage(
            uow,
            {"limit": self.config.batch_size, "after_tenant": after_tenant, "after_id": after_id},
        )
        if row is None or not row["taken"]:
            self._after = ("", FOLD_START_ID)
            return 0, []
        # The next batch goes on after this one, past the deltas of busy tenants it left.
        self._after = (str(row["last_tenant"]), int(row["last_id"]))
        return int(row["taken"]), [row] if row["deltas"] else []

    def report(self, rows: Sequence[Any]) -> None:
        for row in rows:
            # Counted once the batch committed: a VACUUM started before could not free them.
            if self.vacuum is not None:
                self.vacuum.deleted(int(row["deltas"]))
            log.debug(
                "usage deltas folded",
                extra={"deltas": int(row["deltas"]), "tenants": int(row["tenants"])},
            )
