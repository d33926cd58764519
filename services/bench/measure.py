"""What every scenario measures with: CPU per process from /proc, percentiles, py-spy.

CPU is read as the scheduler's run time of each process's threads (nanoseconds, from
``/proc/PID/task/*/schedstat``; utime + stime in clock ticks where that is not readable)
between two points, as a percentage of one core: a process that worked for less than a
tick in a short run reads its real share, not zero. PostgreSQL's and RabbitMQ's processes
are looked up by name at both ends, so a backend that started in between counts in full
and one that ended in between is missed (an underestimate, small next to the long-lived
pool connections).
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """CPU seconds ``pid`` has run so far (0.0 once it is gone)."""
    try:
        return (
            sum(
                int((task / "schedstat").read_text().split()[0])
                for task in Path(f"/proc/{pid}/task").iterdir()
            )
            / 1e9
        )
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return _ticked_cpu_seconds(pid)


def _ticked_cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def _pids_where(matches: Callable[[Path], bool]) -> list[int]:
    """The processes whose /proc entry ``matches`` (one that vanished meanwhile: not)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if matches(entry):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def pids_named(name: str) -> list[int]:
    return _pids_where(lambda entry: (entry / "comm").read_text().strip() == name)


def with_children(pids: Sequence[int]) -> list[int]:
    """``pids`` and their child processes (`jobcore api --workers N`'s servers)."""

    def parent(entry: Path) -> int:
        return int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])

    parents = set(pids)
    return [*pids, *_pids_where(lambda entry: parent(entry) in parents)]


def pids_in_group(pgid: int) -> list[int]:
    """The processes of a process group: a peer's worker started in a session of its own
    and the children it forked (Celery's prefork pool)."""
    return _pids_where(
        lambda entry: int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid
    )


def ms_per_job(seconds: dict[str, float], jobs: int) -> dict[str, float]:
    """CPU-seconds per process group over a drain of ``jobs`` jobs, as CPU-ms per job, with
    the sum of the system's groups as ``all`` (``bench``, the measuring process, is shown
    but not counted)."""
    per_job = {name: round(1000 * used / jobs, 3) for name, used in seconds.items()}
    per_job["all"] = round(sum(v for name, v in per_job.items() if name != "bench"), 3)
    return per_job


class CpuMeter:
    """Percent of one core used by named groups of processes between start() and stop().

    ``processes`` maps a name (``relay-0``) to a pid; the bench itself, PostgreSQL and
    RabbitMQ are always measured."""

    def __init__(
        self,
        processes: dict[str, int] | None = None,
        groups: dict[str, Callable[[], list[int]]] | None = None,
    ) -> None:
        self.groups: dict[str, Callable[[], list[int]]] = {
            "bench": lambda: [os.getpid()],
            "postgres": lambda: pids_named("postgres"),
            "rabbitmq": lambda: pids_named("beam.smp"),
            **(groups or {}),
        }
        for name, pid in (processes or {}).items():
            self.groups[name] = lambda pid=pid: [pid]  # type: ignore[misc]
        # CPU-seconds per group over the last start()..stop(), and that wall time.
        self.seconds: dict[str, float] = {}
        self.wall = 0.0

    def _sample(self) -> dict[str, dict[int, float]]:
        return {
            name: {pid: cpu_seconds(pid) for pid in pids()} for name, pids in self.groups.items()
        }

    def start(self) -> None:
        self._start = self._sample()
        self._t0 = time.monotonic()

    def stop(self) -> dict[str, float]:
        end, wall = self._sample(), time.monotonic() - self._t0
        used = {
            name: sum(max(0.0, cpu - self._start[name].get(pid, 0.0)) for pid, cpu in pids.items())
            for name, pids in end.items()
        }
        self.seconds, self.wall = used, wall
        return {name: round(100 * seconds / wall, 1) for name, seconds in used.items()}


@contextlib.contextmanager
def cpu_of(processes: dict[str, int] | None, into: dict[str, float]) -> Iterator[None]:
    """CPU per process group over the ``with`` block, written into ``into``."""
    meter = CpuMeter(processes)
    meter.start()
    try:
        yield
    finally:
        into.update(meter.stop())


def percentile(values: Sequence[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def latency_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50, p99 and max of latencies given in seconds, in milliseconds."""
    return {
        "p50": round(1000 * statistics.median(seconds), 2),
        "p99": round(1000 * percentile(seconds, 99), 2),
        "max": round(1000 * max(seconds), 2),
    }


def merge_cpu(samples: Sequence[dict[str, float]]) -> dict[str, float]:
    """The median CPU percentage of each process group over several runs."""
    names = {name for sample in samples for name in sample}
    return {
        name: round(statistics.median(s.get(name, 0.0) for s in samples), 1)
        for name in sorted(names)
    }


# -- py-spy --------------------------------------------------------------------------------


class Profiler:
    """py-spy attached to running processes; on stop, a text summary per process.

    Samples are taken at ``rate`` Hz of threads that are on the CPU (py-spy leaves idle
    threads out), so samples / (rate × seconds) is how busy the process's Python was."""

    def __init__(self, out_dir: Path, label: str, processes: dict[str, int], rate: int = 100):
        self.out_dir = out_dir
        self.label = label
        self.processes = processes
        self.rate = rate
        self._spies: dict[str, subprocess.Popen[bytes]] = {}

    def _raw_path(self, name: str) -> Path:
        return self.out_dir / f"{self.label}-{name}.folded"

    def start(self) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        spy = Path(sys.executable).with_name("py-spy")
        for name, pid in self.processes.items():
            self._spies[name] = subprocess.Popen(
                [
                    *(str(spy), "record", "--pid", str(pid), "--rate", str(self.rate)),
                    *("--format", "raw", "--nonblocking", "--output", str(self._raw_path(name))),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        self._t0 = time.monotonic()

    def stop(self) -> dict[str, dict[str, object]]:
        """Stop every py-spy (SIGINT makes it write its file); summarise each profile."""
        seconds = time.monotonic() - self._t0
        for spy in self._spies.values():
            with contextlib.suppress(ProcessLookupError):
                spy.send_signal(signal.SIGINT)
        for spy in self._spies.values():
            try:
                spy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()
        summaries = {}
        for name in self._spies:
            path = self._raw_path(name)
            if path.exists():
                summaries[name] = summarise_folded(path.read_text(), self.rate * seconds)
                summary_path = path.with_suffix(".txt")
                summary_path.write_text(format_summary(name, summaries[name]))
        return summaries


def _frame_name(frame: str) -> str:
    """``fn (path/to/module.py:123)`` → ``fn (module.py)``: lines differ, the function not."""
    name, _, where = frame.partition(" (")
    file = where.rsplit(":", 1)[0].rsplit("/", 1)[-1]
    return f"{name} ({file})" if file else name


def summarise_folded(text: str, possible_samples: float, top: int = 12) -> dict[str, object]:
    """Busy share, the functions most often on top of the stack (self time), and the
    jobcore functions most often anywhere on it (inclusive time)."""
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        raw = stack.split(";")  # outermost frame first (no thread names: no --threads)
        total += count
        self_time[_frame_name(raw[-1])] += count
        ours = {_frame_name(f) for f in raw if "services/" in f or "jobcore/" in f}
        for frame in ours:
            inclusive[frame] += count
    share = (lambda n: round(100 * n / total, 1)) if total else (lambda n: 0.0)
    return {
        "samples": total,
        "busy_pct": round(100 * total / possible_samples, 1) if possible_samples else 0.0,
        "self": [(name, share(n)) for name, n in self_time.most_common(top)],
        "inclusive": [(name, share(n)) for name, n in inclusive.most_common(top)],
    }


def format_summary(name: str, summary: dict[str, object]) -> str:
    lines = [f"{name}: {summary['samples']} samples, Python busy {summary['busy_pct']}%", ""]
    for title, key in (("self time", "self"), ("inclusive (jobcore frames)", "inclusive")):
        lines.append(f"{title}:")
        entries = summary[key]
        assert isinstance(entries, list)
        lines.extend(f"  {pct:5.1f}%  {frame}" for frame, pct in entries)
        lines.append("")
    return "\n".join(lines)
