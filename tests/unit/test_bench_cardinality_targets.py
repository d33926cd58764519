"""The cardinality bench's verdicts: each target is a ratio of figures from the same run,
PASS on its side of the limit and FAIL past it; sizes are held to the wave before the
last (flat: they stopped growing)."""

from __future__ import annotations

from typing import Any

from services.bench.scenarios.cardinality import targets


def _sizes(job_gates: float, jobs: float) -> dict[str, dict[str, float]]:
    return {
        "job_gates": {"mib": job_gates, "rows": 0},
        "jobs": {"mib": jobs, "rows": 0},
        "outbox": {"mib": 0.05, "rows": 0},
        "inbox": {"mib": 0.7, "rows": 0},
    }


def _run(
    relay: tuple[float, float],
    pipeline: tuple[float, float],
    cpu: tuple[float, float],
    job_gates: tuple[float, float, float],
) -> dict[str, str]:
    tenants = [{"tenants": 10, "rates": [relay[0]]}, {"tenants": 10_000, "rates": [relay[1]]}]
    keys = [{"keys": 10, "rates": [pipeline[0]]}, {"keys": 1_000_000, "rates": [pipeline[1]]}]
    held = [
        {"held": 1000, "cpu_ms_per_round": cpu[0]},
        {"held": 100_000, "cpu_ms_per_round": cpu[1]},
    ]
    # The first wave's jobs table is smaller than the later ones: growth before the files
    # settle is not what counts.
    waves: list[dict[str, Any]] = [
        {"gate_keys_seen": 250_000 * (i + 1), "after": _sizes(g, 0.8 if i == 0 else 1.6)}
        for i, g in enumerate(job_gates)
    ]
    return {t["target"].split(" ")[0]: t["verdict"] for t in targets(tenants, keys, held, waves)}


def test_every_target_passes_on_its_side_of_the_limit() -> None:
    verdicts = _run((1000, 800), (500, 400), (2.0, 4.0), (1.2, 1.6, 1.68))
    assert verdicts == {"relay": "PASS", "pipeline": "PASS", "gate": "PASS", "table": "PASS"}


def test_every_target_fails_past_its_limit() -> None:
    verdicts = _run((1000, 799), (500, 399), (2.0, 4.01), (1.6, 1.6, 1.69))
    assert verdicts == {"relay": "FAIL", "pipeline": "FAIL", "gate": "FAIL", "table": "FAIL"}
