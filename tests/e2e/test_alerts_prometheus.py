"""The alert rules in a real Prometheus: the relay-lag alert fires while the broker is down
for the relay, and resolves once it is back.

The test starts Debian's ``prometheus`` on a free 127.0.0.1 port with its own data
directory, scraping the API, the relay and the worker of a real stack every second and
evaluating deploy/prometheus/alerts.yaml every second. The rule file is loaded as it is,
except that every ``for:`` duration is rewritten to one second (nothing else: expressions
and thresholds are the real ones). The threshold (a due row older than 60 s) is met at once
by a job whose ``run_at`` is ten minutes ago: its outbox row is due from then, as a job
scheduled for then would be after a ten-minute outage. A healthy relay publishes it within
a poll; the relay here reaches RabbitMQ through a TcpProxy the test owns (the machine's
broker is never touched), set to refuse connections to model the broker going down.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
import pytest
import yaml

from jobcore.kernel.settings import Settings
from jobcore.testing.tcpproxy import Mode, TcpProxy
from services.relay.low_water import FULL_LOOK_EVERY
from tests.e2e.stack import E2EStack, free_port, until
from tests.integration.worker.support import relayed

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
PROMETHEUS = "/usr/bin/prometheus"
ALERT = "JobcoreRelayLag"
STEP = "1s"  # scrape and evaluation interval, and every rule's `for:`


def rules_with_short_for(source: Path) -> dict[str, Any]:
    """The rule file with every `for:` set to STEP, and nothing else changed."""
    doc = yaml.safe_load(source.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = STEP
    return doc


def test_only_for_durations_are_rewritten() -> None:
    original = yaml.safe_load(ALERTS.read_text())
    rewritten = rules_with_short_for(ALERTS)
    for before, after in zip(
        (r for g in original["groups"] for r in g["rules"]),
        (r for g in rewritten["groups"] for r in g["rules"]),
        strict=True,
    ):
        assert {k: v for k, v in after.items() if k != "for"} == {
            k: v for k, v in before.items() if k != "for"
        }
        assert ("for" in after) == ("for" in before)


@pytest.fixture
async def broker_proxy(settings: Settings) -> AsyncIterator[TcpProxy]:
    url = urlsplit(settings.amqp_url)
    proxy = TcpProxy(url.hostname or "127.0.0.1", url.port or 5672)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


@pytest.fixture
async def stack(
    settings: Settings, tmp_path: Path, broker_proxy: TcpProxy
) -> AsyncIterator[E2EStack]:
    url = urlsplit(settings.amqp_url)
    netloc = url.netloc.rsplit("@", 1)
    proxied = f"{netloc[0]}@127.0.0.1:{broker_proxy.port}" if len(netloc) == 2 else ""
    proxied = proxied or f"127.0.0.1:{broker_proxy.port}"
    stack = E2EStack(
        relayed(settings),  # the relay's lag: every job waits for it
        tmp_path,
        env={"OTEL_SDK_DISABLED": "true"},
        role_env={
            "relay": {
                "JOBCORE_AMQP_URL": urlunsplit(url._replace(netloc=proxied)),
                # Back within a second of the broker, not after a 30 s backoff.
                "JOBCORE_RELAY_RECONNECT_MAX_DELAY": "0.5",
                "JOBCORE_RELAY_CONNECT_TIMEOUT": "1",
            }
        },
    )
    try:
        await stack.start()
        yield stack
    finally:
        await stack.stop()


@pytest.fixture
def prometheus(stack: E2EStack, tmp_path: Path) -> Iterator[str]:
    if shutil.which(PROMETHEUS) is None:
        pytest.fail(f"{PROMETHEUS} is missing: run scripts/install_tools.sh (package prometheus)")
    rules = tmp_path / "alerts.yaml"
    rules.write_text(yaml.safe_dump(rules_with_short_for(ALERTS), sort_keys=False))
    config = {
        "global": {"scrape_interval": STEP, "evaluation_interval": STEP, "scrape_timeout": STEP},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": f"jobcore-{role}",
                "static_configs": [{"targets": [f"127.0.0.1:{stack.ports[role]}"]}],
            }
            for role in ("api", "relay", "worker")
        ],
    }
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={tmp_path / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    log.close()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


async def test_relay_lag_alert_fires_while_the_broker_is_down_and_resolves(
    stack: E2EStack, broker_proxy: TcpProxy, prometheus: str, tmp_path: Path
) -> None:
    async with httpx.AsyncClient(base_url=prometheus, timeout=5) as prom:

        async def get(path: str) -> Any:
            try:
                answer = await prom.get(path)
            except httpx.TransportError:
                return None  # still starting
            return answer.json()["data"] if answer.status_code == 200 else None

        async def targets_up() -> bool:
            data = await get("/api/v1/targets")
            health = {
                t["labels"]["job"]: t["health"] for t in (data or {}).get("activeTargets", [])
            }
            return health == {"jobcore-api": "up", "jobcore-relay": "up", "jobcore-worker": "up"}

        async def relay_lag_alert() -> str | None:
            data = await get("/api/v1/alerts")
            states = [
                a["state"]
                for a in (data or {}).get("alerts", [])
                if a["labels"]["alertname"] == ALERT
            ]
            return states[0] if states else None

        async def rules_loaded() -> bool:
            data = await get("/api/v1/rules")
            names = {r["name"] for g in (data or {}).get("groups", []) for r in g["rules"]}
            return ALERT in names

        log = tmp_path / "prometheus.log"
        await until(rules_loaded, timeout=30, what=f"Prometheus to load the rules ({log})")
        await until(targets_up, timeout=30, what="Prometheus to scrape the three processes")

        async with stack.client() as client:
            # Healthy: a job due ten minutes ago is published at once, so no alert.
            past = (datetime.now(UTC) - timedelta(minutes=10)).isoformat()
            answer = await client.post("/jobs/echo", params={"run_at": past}, json={"text": "a"})
            assert answer.status_code == 202, answer.text
            await stack.wait_status(client, answer.json()["job_id"], "succeeded", timeout=30)
            # Two evaluations after its success, the alert is still not even pending.
            evaluated = await relay_rule_evaluations(get)
            await until(
                lambda: _later(get, evaluated, 2),
                timeout=15,
                what="two more rule evaluations",
            )
            assert await relay_lag_alert() is None

            # The broker goes away for the relay: the same job waits, and the alert fires.
            broker_proxy.set_mode(Mode.REFUSE)
            answer = await client.post("/jobs/echo", params={"run_at": past}, json={"text": "b"})
            assert answer.status_code == 202, answer.text  # enqueue does not need the broker
            job_id = answer.json()["job_id"]
            # A row is due from its enqueue on (a run_at in the past counts from then): the
            # row is made to have waited ten minutes already, as one would in an outage.
            async with await psycopg.AsyncConnection.connect(
                stack.settings.database_url, autocommit=True
            ) as conn:
                await conn.execute(
                    "UPDATE jobcore.outbox SET available_at = now() - interval '10 minutes'"
                    " WHERE job_id = %s",
                    (job_id,),
                )

            async def firing() -> bool:
                return await relay_lag_alert() == "firing"

            await until(firing, timeout=30, what=f"{ALERT} to fire while the broker is down")
            assert (await client.get(f"/jobs/{job_id}")).json()["status"] == "pending"

            # The broker is back: the job is published and runs, and the alert resolves. The
            # row was aged below the relay's low-water mark, which only the relay's unbounded
            # look reaches (services.relay.low_water): within its period.
            broker_proxy.set_mode(Mode.FORWARD)
            await stack.wait_status(client, job_id, "succeeded", timeout=FULL_LOOK_EVERY + 30)

            async def resolved() -> bool:
                return await relay_lag_alert() is None

            await until(resolved, timeout=30, what=f"{ALERT} to resolve once the broker is back")


async def relay_rule_evaluations(get: Any) -> str:
    """When Prometheus last evaluated the relay-lag rule (RFC 3339)."""
    data = await get("/api/v1/rules")
    for group in (data or {}).get("groups", []):
        for rule in group["rules"]:
            if rule["name"] == ALERT:
                return str(rule["lastEvaluation"])
    raise AssertionError(f"{ALERT} is not loaded")


async def _later(get: Any, since: str, evaluations: int) -> bool:
    """Whether the group was evaluated at least ``evaluations`` steps after ``since``."""
    now = await relay_rule_evaluations(get)
    gap = _instant(now) - _instant(since)
    return gap >= timedelta(seconds=evaluations)


def _instant(text: str) -> datetime:
    """Prometheus's RFC 3339 times carry nanoseconds; Python parses up to microseconds."""
    match = re.fullmatch(r"([^.]+)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text)
    assert match is not None, text
    head, fraction, zone = match.groups()
    return datetime.fromisoformat(
        f"{head}.{(fraction or '0')[:6]:0<6}{zone.replace('Z', '+00:00')}"
    )
