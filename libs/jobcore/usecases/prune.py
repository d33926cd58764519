"""Retention by hand (`jobcore prune`): the same pass as the workers' pruner
(:mod:`jobcore.maintenance.retention`), under the same ``pruner`` maintenance lease, so it
never runs beside one: while a worker's pruner holds the lease it is refused
(:class:`~jobcore.maintenance.retention.PrunerBusy`). A dry run takes no lease and changes
nothing: it counts what a pass would delete now.

A pass that deletes is audited once it is done (it is many short transactions, each
deleting what the retention settings say, not what the operator chose), with what it
deleted; a refused one is audited as refused. A dry run is not an action: no entry."""

from __future__ import annotations

from jobcore.access.audit import (
    AuditAction,
    Entry,
    Target,
    check_actor,
    record_done,
    record_refused,
)
from jobcore.database.gateway import Database
from jobcore.kernel.settings import Settings
from jobcore.maintenance.retention import PrunerBusy, PruneReport, Retention, prune_exclusively

# The lease a hand-run prune takes lasts at least this long (it is renewed by every batch
# and given back at the end; a killed command holds up the workers' pruner this long).
MIN_LEASE_SECONDS = 60.0


async def prune(
    db: Database, settings: Settings, *, owner: str, dry_run: bool, actor: str
) -> PruneReport:
    """Delete finished jobs, inbox rows, result files and audit entries past their
    retention, now (``owner`` names the lease holder: which process is pruning)."""
    check_actor(actor)
    entry = Entry(actor, AuditAction.PRUNE, Target("retention"))
    try:
        report = await prune_exclusively(
            Retention(settings, db),
            owner=owner,
            ttl=max(MIN_LEASE_SECONDS, 3 * settings.pruner_interval),
            dry_run=dry_run,
        )
    except PrunerBusy as exc:
        await record_refused(db, entry, exc)
        raise
    if not dry_run:
        entry.details = {
            "complete": report.complete,
            "batches": report.batches,
            "tables": dict(report.tables),
        }
        await record_done(db, entry)
    return report
