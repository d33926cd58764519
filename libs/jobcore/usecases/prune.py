"""Retention by hand (`jobcore prune`): the same pass as the workers' pruner
(:mod:`jobcore.retention`), under the same ``pruner`` maintenance lease, so it never runs
beside one: while a worker's pruner holds the lease it is refused
(:class:`~jobcore.retention.PrunerBusy`). A dry run takes no lease and changes nothing: it
counts what a pass would delete now."""

from __future__ import annotations

from jobcore.db import Database
from jobcore.retention import PruneReport, Retention, prune_exclusively
from jobcore.settings import Settings

# The lease a hand-run prune takes lasts at least this long (it is renewed by every batch
# and given back at the end; a killed command holds up the workers' pruner this long).
MIN_LEASE_SECONDS = 60.0


async def prune(db: Database, settings: Settings, *, owner: str, dry_run: bool) -> PruneReport:
    """Delete finished jobs, inbox rows and result files past their retention, now
    (``owner`` names the lease holder: who is pruning)."""
    return await prune_exclusively(
        Retention(settings, db),
        owner=owner,
        ttl=max(MIN_LEASE_SECONDS, 3 * settings.pruner_interval),
        dry_run=dry_run,
    )
