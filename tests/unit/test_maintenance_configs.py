"""Each maintenance service's config: built from the settings, frozen, and checked when
built (one line naming the variable); the leader lease's life follows the services."""

from __future__ import annotations

import dataclasses

import pytest

from jobcore.execution.registry import Registry
from jobcore.kernel.errors import ConfigurationError
from jobcore.kernel.settings import Settings
from jobcore.maintenance import (
    CompactorConfig,
    GateReleaser,
    GateReleaserConfig,
    MaintainerConfig,
    PrunerConfig,
    ReaperConfig,
    RescuerConfig,
    SchedulerConfig,
    SweeperConfig,
    UsageFolder,
    UsageFolderConfig,
    services_from_settings,
)
from services.worker.metrics import WorkerMetrics


def one_line(error: pytest.ExceptionInfo[ConfigurationError]) -> str:
    text = str(error.value)
    assert "\n" not in text
    return text


def test_configs_come_from_the_settings_and_are_frozen() -> None:
    settings = Settings(worker_reaper_interval=2.0, pruner_batch_size=50, sweeper_stale_after=90)
    reaper = ReaperConfig.from_settings(settings)
    assert (reaper.interval, reaper.batch_size, reaper.row_ttl) == (2.0, 500, 6.0)
    pruner = PrunerConfig.from_settings(settings)
    assert (pruner.interval, pruner.batch_size, pruner.lock_timeout) == (60.0, 50, 0.2)
    assert SweeperConfig.from_settings(settings).stale_after == 90
    assert RescuerConfig.from_settings(settings).interval == 30.0
    assert SchedulerConfig.from_settings(settings).interval == 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        reaper.interval = 1.0  # type: ignore[misc]


def test_a_bad_value_is_refused_in_one_line_naming_its_variable() -> None:
    with pytest.raises(ConfigurationError) as error:
        ReaperConfig(interval=0)
    assert one_line(error) == "JOBCORE_WORKER_REAPER_INTERVAL: must be above zero, not 0"
    with pytest.raises(ConfigurationError) as error:
        PrunerConfig(interval=60, batch_size=0)
    assert one_line(error) == "JOBCORE_PRUNER_BATCH_SIZE: must be above zero, not 0"
    with pytest.raises(ConfigurationError) as error:
        PrunerConfig(interval=60, lock_timeout=0)
    assert one_line(error) == "PrunerConfig.lock_timeout: must be above zero, not 0"
    with pytest.raises(ConfigurationError) as error:
        ReaperConfig.from_settings(Settings()).replace(interval=-1.0)
    assert one_line(error).startswith("JOBCORE_WORKER_REAPER_INTERVAL: must be above zero")


def test_the_sweeper_staleness_must_be_longer_than_its_interval() -> None:
    defaults = Settings()
    assert (defaults.sweeper_interval, defaults.sweeper_stale_after) == (60.0, 3600.0)
    settings = Settings(sweeper_interval=120, sweeper_stale_after=60)  # only the worker minds
    with pytest.raises(ConfigurationError) as error:
        services_from_settings(settings, registry=Registry(), metrics=WorkerMetrics())
    assert one_line(error) == (
        "JOBCORE_SWEEPER_STALE_AFTER: 60s must be longer than JOBCORE_SWEEPER_INTERVAL (120s): "
        "the sweeper looks once per interval, so a shorter staleness would not mean what it says"
    )


def test_the_usage_folder_folds_every_its_own_interval() -> None:
    assert UsageFolderConfig.from_settings(Settings()).interval == 2.0
    folder = UsageFolder.from_settings(Settings(usage_fold_interval=7.5))
    assert (folder.interval, folder.config.batch_size, folder.row_ttl) == (7.5, 5000, 22.5)
    with pytest.raises(ConfigurationError) as error:
        UsageFolderConfig(interval=0)
    assert one_line(error) == "JOBCORE_USAGE_FOLD_INTERVAL: must be above zero, not 0"
    with pytest.raises(ValueError, match="usage_fold_interval"):
        Settings(usage_fold_interval=0)


def test_the_gate_releasers_own_row_outlives_its_short_rounds() -> None:
    assert GateReleaserConfig(interval=0.2).row_ttl == 5.0
    assert GateReleaserConfig(interval=10).row_ttl == 30.0


def test_the_leader_lease_lasts_three_of_the_shortest_interval_and_at_least_five_seconds() -> None:
    services = services_from_settings(Settings(), registry=Registry(), metrics=WorkerMetrics())
    assert [s.name for s in services] == [
        "reaper",
        "rescuer",
        "pruner",
        "sweeper",
        "gate_releaser",
        "analyzer",
        "usage_folder",
        "compactor",
    ]
    assert MaintainerConfig.for_services(services).lease_ttl == 5.0  # the releaser's 0.2 s
    slow = [GateReleaser(GateReleaserConfig(interval=4.0), topology=None, metrics=None)]  # type: ignore[arg-type]
    assert MaintainerConfig.for_services(slow).lease_ttl == 12.0
    assert MaintainerConfig.for_services(slow).renew_every == 4.0
    with pytest.raises(ConfigurationError):
        MaintainerConfig(lease_ttl=0)


def test_the_compactor_is_configured_by_its_settings_and_turned_off_by_zero() -> None:
    config = CompactorConfig.from_settings(
        Settings(compact_every=600, compact_lock_timeout=0.05, compact_max_seconds=1.5)
    )
    assert (config.every, config.lock_timeout, config.max_seconds) == (600, 0.05, 1.5)
    off = services_from_settings(
        Settings(compact_every=0), registry=Registry(), metrics=WorkerMetrics()
    )
    assert "compactor" not in [s.name for s in off]
    with pytest.raises(ConfigurationError) as error:
        CompactorConfig(lock_timeout=0)
    assert one_line(error) == "JOBCORE_COMPACT_LOCK_TIMEOUT: must be above zero, not 0"
    with pytest.raises(ConfigurationError) as error:
        CompactorConfig(ratio=1.0)
    assert one_line(error) == "CompactorConfig.ratio: must be above 1, not 1.0"
    with pytest.raises(ValueError, match="compact_every"):
        Settings(compact_every=-1)
