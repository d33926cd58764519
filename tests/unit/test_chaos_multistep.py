"""The pure parts of `jobcore chaos`'s multi-step load: the bound on a debounced key's
runs, and the job types the run loads."""

from __future__ import annotations

import subprocess
import sys

from jobcore.testing.multistep import MULTISTEP_JOB_MODULE, TYPES, Enqueue, debounce_bound
from jobcore.testing.processes import ROOT
from services.cli.chaos import CHAOS_JOB_MODULES


def _enqueue(sent: float, answered: float | None) -> Enqueue:
    return Enqueue("k", 0, sent, answered)


def test_enqueues_within_a_period_of_each_other_are_one_burst_of_one_run() -> None:
    burst = [_enqueue(t, t + 0.05) for t in (0.0, 0.1, 0.2, 0.3)]
    assert debounce_bound(burst, period=1.0, max_wait=5.0) == (1, 1)


def test_a_quiet_period_between_enqueues_starts_a_burst() -> None:
    enqueues = [_enqueue(0.0, 0.1), _enqueue(0.2, 0.3), _enqueue(3.0, 3.1)]
    assert debounce_bound(enqueues, period=1.0, max_wait=5.0) == (2, 2)


def test_a_slow_answer_counts_against_the_burst() -> None:
    # The second enqueue's join may have committed as late as its answer, 1.5 s after
    # the first was sent: more than a period, so the two may be two runs.
    enqueues = [_enqueue(0.0, 0.1), _enqueue(0.2, 1.5)]
    assert debounce_bound(enqueues, period=1.0, max_wait=5.0) == (2, 2)


def test_a_burst_longer_than_max_wait_may_run_once_per_max_wait() -> None:
    enqueues = [_enqueue(t * 0.5, t * 0.5 + 0.1) for t in range(25)]  # 12.1 s
    assert debounce_bound(enqueues, period=1.0, max_wait=5.0) == (1, 1 + 2)


def test_enqueues_never_answered_are_not_counted() -> None:
    assert debounce_bound([_enqueue(0.0, None)], period=1.0, max_wait=5.0) == (0, 0)


def test_the_chaos_run_loads_the_multistep_job_types() -> None:
    # In a process of its own: loading registers the types in the default registry.
    assert MULTISTEP_JOB_MODULE in CHAOS_JOB_MODULES
    script = (
        "from jobcore.execution.registry import load_job_modules\n"
        f"registry = load_job_modules({CHAOS_JOB_MODULES!r})\n"
        f"print(sorted(t for t in {TYPES!r} if registry.get(t) is not None))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(sorted(TYPES))
