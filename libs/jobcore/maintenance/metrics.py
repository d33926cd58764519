"""What the services count, as the worker's metrics take it: each service names the few
methods it calls, and the worker passes its own metrics in (services/worker/metrics.py),
so the library imports no service."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from jobcore.maintenance.periodic import Schedule
    from jobcore.maintenance.retention import Kind
    from jobcore.maintenance.schedule_ticks import ScheduleRound, ScheduleState


class ReaperMetrics(Protocol):
    def reaped(self, outcome: str, count: int = 1) -> None: ...


class RescuerMetrics(Protocol):
    def rescued(self, reason: str, count: int = 1) -> None: ...


class SweeperMetrics(Protocol):
    def republished(self, reason: str, count: int = 1) -> None: ...

    def overdue(self, seconds_by_queue: Mapping[str, float]) -> None: ...


class GateReleaserMetrics(Protocol):
    def released(self, count: int) -> None: ...


class PrunerMetrics(Protocol):
    def pruned(self, counts: Mapping[str, int]) -> None: ...

    def surveyed(self, kinds: Sequence[Kind]) -> None: ...


class CompactorMetrics(Protocol):
    def compacted(
        self, table: str, outcome: str, *, freed: int, lock_wait: float, lock_held: float
    ) -> None: ...


class SchedulerMetrics(Protocol):
    def round(self, done: ScheduleRound) -> None: ...

    def states(
        self, schedules: Sequence[Schedule], states: dict[str, ScheduleState], now: datetime
    ) -> None: ...


class MaintenanceMetrics(
    ReaperMetrics,
    RescuerMetrics,
    SweeperMetrics,
    GateReleaserMetrics,
    PrunerMetrics,
    CompactorMetrics,
    Protocol,
):
    """Everything but the scheduler's (which has instruments of its own, made only when
    schedules are declared)."""
