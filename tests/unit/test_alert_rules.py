"""deploy/prometheus: the alerts name metrics the code serves and scrape jobs the example
config defines, each has a runbook section in docs/how-to/alerts.md, and the promtool unit
tests (alerts.test.yaml, run by `make lint`) fire and spare every alert."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = ROOT / "deploy" / "prometheus"
RUNBOOKS = ROOT / "docs" / "how-to" / "alerts.md"
COMPOSE = ROOT / "deploy" / "compose.yaml"
SUFFIXES = ("_total", "_bucket", "_count", "_sum")
PORTS = {
    "jobcore-api": "JOBCORE_API_PORT",
    "jobcore-relay": "JOBCORE_RELAY_HEALTH_PORT",
    "jobcore-worker": "JOBCORE_WORKER_HEALTH_PORT",
}


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def alerts() -> list[dict[str, Any]]:
    return [rule for group in load(PROMETHEUS / "alerts.yaml")["groups"] for rule in group["rules"]]


def defined_metrics() -> set[str]:
    """Every jobcore_* name a string literal in the shipped code gives a metric."""
    names: set[str] = set()
    for top in ("libs", "services"):
        for path in (ROOT / top).rglob("*.py"):
            names.update(re.findall(r"[\"'](jobcore_[a-z0-9_]+)[\"']", path.read_text()))
    return names


def github_anchor(heading: str) -> str:
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def test_every_metric_an_alert_reads_is_served() -> None:
    served = defined_metrics()
    for rule in alerts():
        for name in re.findall(r"\bjobcore_[a-z0-9_]+", rule["expr"]):
            base = next((name.removesuffix(s) for s in SUFFIXES if name.endswith(s)), name)
            assert base in served, f"{rule['alert']} reads {name}, which no process serves"


def test_alerts_carry_a_severity_and_a_runbook_section() -> None:
    anchors = {
        github_anchor(line.lstrip("#"))
        for line in RUNBOOKS.read_text().splitlines()
        if line.startswith("#")
    }
    for rule in alerts():
        assert rule["labels"]["severity"] in {"page", "ticket"}, rule["alert"]
        assert {"summary", "description", "runbook_url"} <= rule["annotations"].keys()
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "docs/how-to/alerts.md", rule["alert"]
        assert anchor == rule["alert"].lower(), rule["alert"]
        assert anchor in anchors, f"docs/how-to/alerts.md has no section #{anchor}"


def test_the_scrape_config_defines_the_jobs_the_alerts_name() -> None:
    config = load(PROMETHEUS / "prometheus.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == set(PORTS)
    named: set[str] = set()
    for rule in alerts():
        for matcher in re.findall(r'job=~?"([^"]+)"', rule["expr"]):
            named |= {j for j in jobs if re.fullmatch(matcher, j)}
            assert any(re.fullmatch(matcher, j) for j in jobs), (rule["alert"], matcher)
    assert named == set(PORTS)
    # As compose runs it: each job's DNS name is a compose service, on the port it serves.
    services = load(COMPOSE)["services"]
    environment = load(COMPOSE)["x-jobcore-environment"]
    for name, job in jobs.items():
        [sd] = job["dns_sd_configs"]
        [host] = sd["names"]
        assert host in services, name
        assert str(sd["port"]) == environment[PORTS[name]], name
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"]}
    for rule_file in config["rule_files"]:
        assert (COMPOSE.parent / mounts[rule_file]).resolve() == PROMETHEUS / "alerts.yaml"


def test_the_promtool_tests_fire_and_spare_every_alert() -> None:
    tests = load(PROMETHEUS / "alerts.test.yaml")
    assert tests["rule_files"] == ["alerts.yaml"]
    fired: set[str] = set()
    spared: set[str] = set()
    for test in tests["tests"]:
        for check in test["alert_rule_test"]:
            (fired if check["exp_alerts"] else spared).add(check["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert fired == names
    assert spared == names
