"""The analyzer: ANALYZE of jobcore's tables where autovacuum will not do it soon.

Every hot statement is prepared once per connection and runs a generic plan
(``jobcore.database.gateway``, "generic plans"), planned from the statistics of that moment and kept
until an ANALYZE (or DDL) of its tables invalidates it. A plan made while the jobs table
was empty does not know that an index on ``status`` now holds thousands of pending rows:
the worker's claim, planned on a new database, reached its jobs through
the status index (``jobs_status_created_not_running_idx`` today) instead of the primary
key, and ran several times slower with a few thousand jobs pending, for as long as its
connection lived (docs/bench/measurements.md, "Plans"). Autovacuum's ANALYZE fixes that
within a minute or so where it runs; the machine may run without it (``autovacuum =
off``, or off for a table), and a new database waits for its first round.

So the maintenance leader looks every ``JOBCORE_WORKER_ANALYZE_INTERVAL`` (one catalog
read) for the tables that changed by more than autovacuum's own threshold since their
last ANALYZE (:data:`BASE` + :data:`SCALE` × their rows) and that autovacuum will not
analyze soon: a table never analyzed, at once; where autovacuum is off, one whose live
rows doubled or halved since (its plans were made for another size), at once, and any
other one last analyzed more than a naptime ago (:data:`PAUSE`: a small busy table passes
the threshold every round, and each ANALYZE makes every connection plan its statements
again). It analyzes them: on a connection of its own, as it may take longer than a
statement's timeout on a large table, ``SKIP_LOCKED`` so that one running already
(autovacuum's, another leader's) is not waited for. ANALYZE takes no lock that a claim,
an enqueue or a delete waits for. A role that does not own the tables gets a warning from
PostgreSQL and nothing is analyzed (the docs say so); a failure is logged and the next
round tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import ClassVar

import psycopg
from psycopg import sql

from jobcore.database.gateway import connect_for_chore
from jobcore.database.store import database_store
from jobcore.database.table_names import TABLES
from jobcore.kernel.settings import Settings
from jobcore.maintenance.base import MaintenanceService, ServiceConfig
from jobcore.maintenance.lease import Term

log = logging.getLogger(__name__)

# PostgreSQL's defaults for autovacuum_analyze_threshold and
# autovacuum_analyze_scale_factor: a table is due once this many rows changed plus this
# share of its rows.
BASE = 50
SCALE = 0.1
# Where autovacuum is off, a table is analyzed again this long after its last ANALYZE at
# the earliest (autovacuum_naptime's default).
PAUSE = 60.0
# An ANALYZE that takes longer is given up (its connection closed): a cut network must not
# hold the analyzer forever. ANALYZE reads a fixed-size sample, so even a large table's
# takes seconds.
ANALYZE_TIMEOUT = 600.0


@dataclass(frozen=True)
class AnalyzerConfig(ServiceConfig):
    pause: float = PAUSE

    variables: ClassVar = {"interval": "JOBCORE_WORKER_ANALYZE_INTERVAL"}

    def check(self) -> None:
        super().check()
        if not self.pause >= 0:
            raise self.refuse("pause", f"must not be below zero, not {self.pause!r}")

    @classmethod
    def from_settings(cls, settings: Settings) -> AnalyzerConfig:
        return cls(interval=settings.worker_analyze_interval)


class Analyzer(MaintenanceService[AnalyzerConfig]):
    name = "analyzer"

    def __init__(self, config: AnalyzerConfig, *, settings: Settings) -> None:
        super().__init__(config)
        self.settings = settings
        self.tables = sorted(TABLES)

    @classmethod
    def from_settings(cls, settings: Settings) -> Analyzer:
        return cls(AnalyzerConfig.from_settings(settings), settings=settings)

    async def lead(self, term: Term) -> int:
        """Analyze the tables due; how many."""
        async with term.db.session() as session:
            # A read, outside the fence: a round with nothing due writes nothing.
            due = await database_store.tables_with_stale_statistics(
                session,
                {"tables": self.tables, "base": BASE, "scale": SCALE, "pause": self.config.pause},
            )
        if not due:
            return 0
        async with term.db.unit_of_work() as uow:
            if not await term.fence(uow, self):
                return 0
            await uow.commit()
        names = [row["name"] for row in due]
        analyze = asyncio.ensure_future(self._analyze(names))
        # A stopping worker does not wait for a long ANALYZE; PostgreSQL ends it when its
        # connection goes.
        ended = asyncio.ensure_future(term.sleep(ANALYZE_TIMEOUT))
        try:
            await asyncio.wait({analyze, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (analyze, ended):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        if not analyze.done() or analyze.cancelled() or not analyze.result():
            return 0
        log.info(
            "planner statistics refreshed",
            extra={"tables": names, "changed": [row["changed"] for row in due]},
        )
        return len(names)

    async def _analyze(self, names: list[str]) -> bool:
        statement = sql.SQL("ANALYZE (SKIP_LOCKED) {}").format(
            sql.SQL(", ").join(
                sql.Identifier(self.settings.database_schema, name) for name in names
            )
        )
        try:
            async with asyncio.timeout(ANALYZE_TIMEOUT):
                conn = await connect_for_chore(self.settings, "jobcore-worker-analyze")
                async with conn:
                    await conn.execute(statement)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            log.warning(
                "ANALYZE failed; the analyzer tries again next round",
                extra={"tables": names, "error": f"{type(exc).__name__}: {exc}".strip()},
            )
            return False
        return True
