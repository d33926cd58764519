"""One PNG per phase of the pressure scenario: jobs/s offered and completed, pickup
percentiles of the jobs created each second, and the hot tables' dead tuples and size,
from a little before the phase to the end of its recovery (the phase shaded)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.bench.pressure_load import Completions, Monitor, OpenLoad, Window

LEAD = 20.0  # seconds shown before the phase


def plot_phase(
    path: Path,
    name: str,
    phase: Window,
    recovery: Window,
    load: OpenLoad,
    completions: Completions,
    monitor: Monitor,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    t0, t1 = phase.start - LEAD, recovery.end
    seconds = list(range(int(t0), int(t1)))
    x = [s - phase.start for s in seconds]
    fig, axes = plt.subplots(1, 4, figsize=(22, 4.4))
    rate, pickup, dead, size = axes
    rate.plot(x, [load.sent_per_second.get(s, 0) for s in seconds], label="offered", lw=0.8)
    rate.plot(x, [completions.per_second.get(s, 0) for s in seconds], label="completed", lw=0.8)
    rate.set_ylabel("jobs/s")
    for pct in (50, 95, 99):
        ys = []
        for s in seconds:
            hist = completions.pickup_by_second.get(s)
            value = hist.percentile(pct) if hist is not None else None
            ys.append(float("nan") if value is None else 1000 * value)
        pickup.plot(x, ys, label=f"p{pct}", lw=0.8)
    pickup.set_yscale("log")
    pickup.set_ylabel("pickup ms (jobs created that second)")
    samples = [(t, sample) for t, sample in monitor.sizes if t0 <= t <= t1]
    tables = sorted({table for _, sample in samples for table in sample})
    for table in tables:
        dead.plot(
            [t - phase.start for t, _ in samples],
            [sample.get(table, {}).get("dead", 0) for _, sample in samples],
            label=table,
            lw=0.9,
        )
        size.plot(
            [t - phase.start for t, _ in samples],
            [
                (sample.get(table, {}).get("table", 0) + sample.get(table, {}).get("index", 0))
                / 2**20
                for _, sample in samples
            ],
            label=table,
            lw=0.9,
        )
    dead.set_ylabel("dead tuples (pg_stat_user_tables)")
    size.set_ylabel("table + indexes, MiB")
    for ax, title in zip(axes, ("jobs/s", "pickup", "dead tuples", "size"), strict=True):
        ax.axvspan(0, phase.end - phase.start, color="tab:red", alpha=0.08, label=f"{name}")
        ax.set_xlabel(f"seconds from the start of '{name}'")
        ax.set_title(f"{name}: {title}", fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
