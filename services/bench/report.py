"""The report of one `jobcore bench` invocation: report.json, report.md and PNG plots.

A :class:`Figure` is one quantity measured over several runs, next to the runs of its
baseline from the same invocation; the table shows medians, min–max and the ratio of the
medians. A :class:`Section` is one scenario: its figures, what the processes' CPU was, the
profiles if any, and the series its plot draws.
"""

from __future__ import annotations

import statistics
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson


@dataclass
class Figure:
    case: str
    metric: str
    runs: list[float]
    baseline: str | None = None
    baseline_runs: list[float] = field(default_factory=list)
    # "higher" for rates, "lower" for latencies and times: says which way the ratio is good.
    better: str = "higher"

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def ratio(self) -> float | None:
        if not self.baseline_runs or not self.runs:
            return None
        base = statistics.median(self.baseline_runs)
        return round(self.median / base, 3) if base else None

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            median=round(self.median, 3),
            min=min(self.runs),
            max=max(self.runs),
            ratio=self.ratio,
        )
        if self.baseline_runs:
            data.update(
                baseline_median=round(statistics.median(self.baseline_runs), 3),
                baseline_min=min(self.baseline_runs),
                baseline_max=max(self.baseline_runs),
            )
        return data


@dataclass
class Series:
    """A line on the scenario's plot: x and y values with their axis labels."""

    label: str
    x: list[float]
    y: list[float]
    x_label: str
    y_label: str
    # A sweep over orders of magnitude (10 → 1,000,000) is drawn on a log x axis.
    x_log: bool = False


@dataclass
class Section:
    scenario: str
    title: str
    method: str
    figures: list[Figure] = field(default_factory=list)
    cpu_pct: dict[str, dict[str, float]] = field(default_factory=dict)
    # CPU-ms per job of each process group, by case (median over runs): where a job's
    # cost goes, comparable between systems where a rate on shared cores is not.
    cpu_ms_per_job: dict[str, dict[str, float]] = field(default_factory=dict)
    profiles: dict[str, dict[str, object]] = field(default_factory=dict)
    series: list[Series] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        return figure

    def as_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "title": self.title,
            "method": self.method,
            "seconds": round(self.seconds, 1),
            "figures": [f.as_dict() for f in self.figures],
            "cpu_pct": self.cpu_pct,
            "cpu_ms_per_job": self.cpu_ms_per_job,
            "profiles": self.profiles,
            "series": [asdict(s) for s in self.series],
            "details": self.details,
        }


def _number(value: float) -> str:
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _spread(runs: list[float]) -> str:
    if len(runs) == 1:
        return "1 run"
    return f"{_number(min(runs))}–{_number(max(runs))}"


def table_rows(sections: list[Section]) -> list[str]:
    rows = [
        "| scenario | case | metric | jobcore (median) | min–max | baseline | baseline"
        " (median, min–max) | ratio |",
        "|---|---|---|---:|---|---|---|---:|",
    ]
    for section in sections:
        for f in section.figures:
            base = _number(statistics.median(f.baseline_runs)) if f.baseline_runs else ""
            if len(f.baseline_runs) > 1:
                base += f" ({_spread(f.baseline_runs)})"
            ratio = f"{f.ratio:.2f}×" if f.ratio is not None else ""
            rows.append(
                f"| {section.scenario} | {f.case} | {f.metric} | {_number(f.median)} |"
                f" {_spread(f.runs)} | {f.baseline or ''} | {base} | {ratio} |"
            )
    return rows


def _by_case(heading: str, cases: dict[str, dict[str, float]], spec: str) -> list[str]:
    """A list of each case's figures per process group under ``heading`` (none: nothing)."""
    if not cases:
        return []
    rows = [
        f"- {case}: {', '.join(f'{k} {v:{spec}}' for k, v in groups.items())}"
        for case, groups in cases.items()
    ]
    return [heading, "", *rows, ""]


def _targets(targets: list[dict[str, Any]]) -> list[str]:
    """A scenario's targets (ratios of figures from the same run), each PASS or FAIL."""
    if not targets:
        return []
    rows = [
        f"- **{t['verdict']}** {t['target']}: {t['ratio']:.2f}× (limit {t['limit']}; "
        f"{t['measured']})"
        for t in targets
    ]
    return ["Targets (ratios measured in this run):", "", *rows, ""]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value).replace("|", "\\|")


def _tables(tables: list[dict[str, Any]]) -> list[str]:
    """A scenario's extra tables (``details["tables"]``: the --pg-stats ones): a title, a
    note, optional per-job totals, columns and rows."""
    lines: list[str] = []
    for table in tables:
        lines += [f"**{table['title']}**", ""]
        if table.get("note"):
            lines += [table["note"], ""]
        if table.get("totals"):
            shown = ", ".join(f"{k} {_cell(v)}" for k, v in table["totals"].items())
            lines += [f"Per job, all top-level statements: {shown}.", ""]
        lines.append("| " + " | ".join(table["columns"]) + " |")
        lines.append("|" + "|".join("---" for _ in table["columns"]) + "|")
        lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in table["rows"]]
        lines.append("")
    return lines


def markdown(machine: dict[str, Any], sections: list[Section], options: dict[str, Any]) -> str:
    lines = ["# jobcore bench report", ""]
    lines.append(
        f"Machine: {machine['cpu_model']}, {machine['cores']} cores, "
        f"{machine['memory_gib']} GiB; PostgreSQL {machine['postgresql']}, "
        f"RabbitMQ {machine['rabbitmq']}, Python {machine['python']}; "
        f"load average at start {machine['load_average_at_start']}."
    )
    packages = ", ".join(f"{k} {v}" for k, v in machine.get("packages", {}).items())
    lines.append(f"Kernel {machine.get('kernel')}; packages: {packages}.")
    lines.append("")
    lines.append(f"Run at {machine['started_at']} with {options}.")
    lines.append("")
    lines.append(
        "Every figure is the median of the runs shown, with min–max; its baseline was "
        "measured in the same invocation, interleaved with it; the ratio is median over "
        "median. The load generator, the jobcore processes, PostgreSQL and RabbitMQ all "
        "share the same cores."
    )
    lines.append("")
    lines.extend(table_rows(sections))
    lines.append("")
    for section in sections:
        lines += [f"## {section.scenario}: {section.title}", "", section.method, ""]
        lines += _by_case("CPU, % of one core (median over runs):", section.cpu_pct, "g")
        lines += _by_case(
            "CPU-ms per job by process group (median over runs):", section.cpu_ms_per_job, ".3f"
        )
        lines += _targets(section.details.get("targets", []))
        lines += _tables(section.details.get("tables", []))
        # A scenario's own plots beyond its section's (one per phase, say), beside report.md.
        for name in section.details.get("plots", []):
            lines += [f"![{name}]({name})", ""]
        for name, profile in section.profiles.items():
            self_time = profile.get("self", [])
            assert isinstance(self_time, list)
            top = "; ".join(f"{frame} {pct}%" for frame, pct in self_time[:5])
            lines.append(f"- profile {name}: Python busy {profile.get('busy_pct')}%; top: {top}")
        if section.profiles:
            lines.append("")
        lines.append(f"![{section.scenario}]({section.scenario}.png)")
        lines.append("")
    return "\n".join(lines)


def plot(section: Section, path: Path) -> None:
    """Rates next to their baselines (median bars, min–max whiskers), and any series."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    rates = [f for f in section.figures if "/s" in f.metric]
    panels_of_series: dict[str, list[Series]] = {}
    for series in section.series:
        panels_of_series.setdefault(series.y_label, []).append(series)
    panels = int(bool(rates)) + len(panels_of_series)
    if not panels:
        return
    widths = [max(6.5, 1.3 * len(rates))] * int(bool(rates)) + [6.5] * len(panels_of_series)
    if panels <= 3:
        fig, axes = plt.subplots(
            1, panels, figsize=(sum(widths), 4.6), squeeze=False, width_ratios=widths
        )
    else:  # a sweep of many quantities: a grid of three a row, readable on a page
        rows = -(-panels // 3)
        fig, axes = plt.subplots(rows, 3, figsize=(3 * max(widths), 4.6 * rows), squeeze=False)
        for spare in axes.flat[panels:]:
            spare.set_visible(False)
    ax_iter = iter(axes.flat)
    if rates:
        ax = next(ax_iter)
        width = 0.38
        xs = range(len(rates))
        for offset, label, values in (
            (-width / 2, "jobcore", [f.runs for f in rates]),
            (width / 2, "baseline", [f.baseline_runs for f in rates]),
        ):
            medians = [statistics.median(v) if v else 0 for v in values]
            low = [m - min(v) if v else 0 for m, v in zip(medians, values, strict=True)]
            high = [max(v) - m if v else 0 for m, v in zip(medians, values, strict=True)]
            ax.bar(
                [x + offset for x in xs], medians, width, yerr=[low, high], capsize=3, label=label
            )
        ax.set_xticks(list(xs))
        ax.set_xticklabels(
            [
                textwrap.fill(f"{f.case}, {f.metric}", 20)
                + (f"\nvs {textwrap.fill(f.baseline, 20)}" if f.baseline else "")
                for f in rates
            ],
            fontsize=7,
        )
        ax.set_ylabel("per second (median, min–max)")
        ax.legend(fontsize=8)
        ax.set_title(f"{section.scenario}: jobcore vs baseline", fontsize=10)
    for y_label, group in panels_of_series.items():
        ax = next(ax_iter)
        for series in group:
            marker = "." if len(series.x) < 50 else None
            ax.plot(series.x, series.y, marker=marker, label=series.label)
        if any(series.x_log for series in group):
            ax.set_xscale("log")
            # A sweep's figures against its first step: from zero, so a ratio reads as one.
            ax.set_ylim(bottom=0)
        ax.set_xlabel(group[0].x_label)
        ax.set_ylabel(y_label)
        ax.legend(fontsize=8)
        ax.set_title(f"{section.scenario}: {y_label}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(
    out: Path, machine: dict[str, Any], sections: list[Section], options: dict[str, Any]
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    document = {
        "machine": machine,
        "options": options,
        "scenarios": [s.as_dict() for s in sections],
    }
    (out / "report.json").write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    (out / "report.md").write_text(markdown(machine, sections, options))
    for section in sections:
        plot(section, out / f"{section.scenario}.png")


def load(out: Path) -> tuple[dict[str, Any], list[Section], dict[str, Any]]:
    """A written report.json back as sections (to render it again without measuring)."""
    document = orjson.loads((out / "report.json").read_bytes())
    sections = []
    for data in document["scenarios"]:
        section = Section(data["scenario"], data["title"], data["method"])
        section.figures = [
            Figure(
                f["case"], f["metric"], f["runs"], f["baseline"], f["baseline_runs"], f["better"]
            )
            for f in data["figures"]
        ]
        section.series = [Series(**s) for s in data["series"]]
        section.cpu_pct = data["cpu_pct"]
        section.cpu_ms_per_job = data.get("cpu_ms_per_job", {})
        section.profiles = data["profiles"]
        section.details = data["details"]
        section.seconds = data["seconds"]
        sections.append(section)
    return document["machine"], sections, document["options"]


if __name__ == "__main__":
    # `python -m bench.report DIR`: render DIR/report.json again (table, plots).
    import sys

    target = Path(sys.argv[1])
    write(target, *load(target))
