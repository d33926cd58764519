"""Periodic maintenance: every service that keeps the database healthy, each with its
library half, run under one leader per database.

- :mod:`.maintainer`: the :class:`Maintainer` every worker runs (one leader lease per
  database, every service under it, one pool connection taken in turn), on
  :mod:`.connection`;
- :mod:`.lease`: the leader lease and its term, whose fence opens every working
  transaction;
- :mod:`.base`: what the services share (a frozen config checked when built, the batch
  loop);
- the services: :mod:`.analyzer`, :mod:`.reaper`, :mod:`.rescuer`, :mod:`.sweeper` (with
  :mod:`.stranded`), :mod:`.pruner` (with :mod:`.retention`, which ``jobcore prune`` runs
  too), :mod:`.gate_releaser` (with :mod:`.held_jobs`, the round it runs), :mod:`.scheduler`
  (with :mod:`.schedule_ticks`, which ``jobcore schedules`` uses too, and :mod:`.periodic`,
  what a schedule is and where it is declared), :mod:`.usage_folder`, :mod:`.compactor`
  (gives the hot tables' space back after a pinned xmin horizon);
- :mod:`.table_vacuum`: the VACUUM of a table its process empties: the outbox's, which the
  relays run (not under the leader), and the usage deltas', which the usage folder runs;
- :mod:`.metrics`: what each service counts, as protocols the worker's metrics fulfil.

The worker composes them (services/worker/app.py); docs/design.md, "Maintenance", says
why one leader and what its fence guarantees.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from jobcore.execution.registry import Registry
from jobcore.kernel.settings import Settings
from jobcore.maintenance.analyzer import Analyzer, AnalyzerConfig
from jobcore.maintenance.base import BATCH_SIZE, MaintenanceService, ServiceConfig
from jobcore.maintenance.compactor import Compactor, CompactorConfig
from jobcore.maintenance.connection import SharedConnection
from jobcore.maintenance.gate_releaser import GateReleaser, GateReleaserConfig
from jobcore.maintenance.lease import LEADER_LEASE
from jobcore.maintenance.maintainer import Maintainer, MaintainerConfig
from jobcore.maintenance.metrics import MaintenanceMetrics, SchedulerMetrics
from jobcore.maintenance.periodic import Schedule
from jobcore.maintenance.pruner import Pruner, PrunerConfig
from jobcore.maintenance.reaper import Reaper, ReaperConfig
from jobcore.maintenance.rescuer import Rescuer, RescuerConfig
from jobcore.maintenance.schedule_ticks import EnqueueTick
from jobcore.maintenance.scheduler import Scheduler, SchedulerConfig
from jobcore.maintenance.sweeper import Sweeper, SweeperConfig
from jobcore.maintenance.usage_folder import UsageFolder, UsageFolderConfig

__all__ = [
    "BATCH_SIZE",
    "LEADER_LEASE",
    "Analyzer",
    "AnalyzerConfig",
    "Compactor",
    "CompactorConfig",
    "GateReleaser",
    "GateReleaserConfig",
    "Maintainer",
    "MaintainerConfig",
    "MaintenanceService",
    "Pruner",
    "PrunerConfig",
    "Reaper",
    "ReaperConfig",
    "Rescuer",
    "RescuerConfig",
    "Scheduler",
    "SchedulerConfig",
    "ServiceConfig",
    "SharedConnection",
    "Sweeper",
    "SweeperConfig",
    "UsageFolder",
    "UsageFolderConfig",
    "services_from_settings",
]


def services_from_settings(
    settings: Settings,
    *,
    registry: Registry,
    metrics: MaintenanceMetrics,
    schedules: Sequence[Schedule] = (),
    schedule_metrics: SchedulerMetrics | None = None,
    enqueue_tick: EnqueueTick | None = None,
) -> list[MaintenanceService[Any]]:
    """Every service a worker runs, each config built from ``settings`` and checked (a bad
    value: :class:`~jobcore.kernel.errors.ConfigurationError`, one line naming the variable). The
    scheduler only with schedules declared, enqueueing their ticks through ``enqueue_tick``."""
    services: list[MaintenanceService[Any]] = [
        Reaper.from_settings(settings, registry=registry, metrics=metrics),
        Rescuer.from_settings(settings, metrics=metrics),
        Pruner.from_settings(settings, metrics=metrics, registry=registry),
        Sweeper.from_settings(settings, metrics=metrics),
        GateReleaser.from_settings(settings, metrics=metrics),
        Analyzer.from_settings(settings),
        UsageFolder.from_settings(settings),
    ]
    if settings.compact_every > 0:
        services.append(Compactor.from_settings(settings, metrics=metrics))
    if schedules:
        if schedule_metrics is None or enqueue_tick is None:
            raise ValueError("schedules need schedule_metrics and enqueue_tick")
        services.append(
            Scheduler.from_settings(
                settings, schedules=schedules, metrics=schedule_metrics, enqueue=enqueue_tick
            )
        )
    return services
