"""Settings that could deadlock stop `jobcore worker`, `jobcore relay` and `jobcore api` at
start-up: exit code 1 and one line naming the variables, before anything connects."""

from __future__ import annotations

import subprocess

import pytest

from jobcore.kernel.settings import Settings
from jobcore.testing.processes import ROOT, jobcore_command, settings_env
from tests.conftest import TEST_JOB_MODULES

# Nothing may be reached: a refusal happens before the first connection (and a command
# that did start would listen on a free port, not a shared default one).
UNREACHABLE = {
    "JOBCORE_DATABASE_URL": "postgresql://postgres@127.0.0.1:9/never",
    "JOBCORE_AMQP_URL": "amqp://guest:guest@127.0.0.1:9/",
    "JOBCORE_API_PORT": "0",
    "JOBCORE_WORKER_HEALTH_PORT": "0",
    "JOBCORE_RELAY_HEALTH_PORT": "0",
}


@pytest.mark.parametrize(
    ("args", "env", "line"),
    [
        pytest.param(
            ("worker",),
            {"JOBCORE_DB_POOL_MAX": "5"},
            "JOBCORE_DB_POOL_MAX: 5 connections are too few for this worker, which needs 6 "
            "at once (2 for claims and outcomes, 1 for the cancel listener, 1 for the "
            "maintainer, 1 for the dead-letter notes, 1 for the webhook deliverer)",
            id="worker-pool",
        ),
        pytest.param(
            ("worker",),
            {"JOBCORE_SWEEPER_INTERVAL": "120", "JOBCORE_SWEEPER_STALE_AFTER": "60"},
            "JOBCORE_SWEEPER_STALE_AFTER: 60s must be longer than JOBCORE_SWEEPER_INTERVAL (120s)",
            id="worker-maintenance-config",
        ),
        pytest.param(
            ("worker", "--concurrency", "1"),
            {},
            "JOBCORE_WORKER_PREFETCH: a prefetch of 1 cannot be shared by the 2 queues "
            "consumed (default, testq)",
            id="worker-prefetch-below-queues",
        ),
        pytest.param(
            ("worker",),
            {"JOBCORE_AMQP_CONSUMER_TIMEOUT": "600"},
            "JOBCORE_AMQP_CONSUMER_TIMEOUT: job type 'export_csv' (jobcore.examples.jobtypes) may "
            "hold a handler slot for 660s",
            id="worker-job-timeout",
        ),
        pytest.param(
            ("worker",),
            {
                "JOBCORE_JOB_MODULES": (
                    "jobcore.examples.jobtypes,tests.integration.reserved_queue_jobtypes"
                )
            },
            "JOBCORE_JOB_MODULES: job type 'misrouted' "
            "(tests.integration.reserved_queue_jobtypes) is on the queue 'webhooks', which is "
            "reserved",
            id="worker-reserved-queue",
        ),
        pytest.param(
            ("relay",),
            {"JOBCORE_DB_OPERATION_TIMEOUT": "5", "JOBCORE_RELAY_PUBLISH_TIMEOUT": "10"},
            "JOBCORE_RELAY_PUBLISH_TIMEOUT: with JOBCORE_RELAY_CONNECT_TIMEOUT it keeps a "
            "claim transaction idle up to 15s, too close to the 10s after which the server "
            "ends it (twice JOBCORE_DB_OPERATION_TIMEOUT)",
            id="relay-publish-timeout",
        ),
        pytest.param(
            ("api",),
            {"JOBCORE_AMQP_CONSUMER_TIMEOUT": "600"},
            "JOBCORE_AMQP_CONSUMER_TIMEOUT: job type 'export_csv'",
            id="api-job-timeout",
        ),
    ],
)
def test_a_setting_that_could_deadlock_stops_the_command_with_one_line(
    args: tuple[str, ...], env: dict[str, str], line: str
) -> None:
    settings = Settings(environment="test", job_modules=TEST_JOB_MODULES)
    done = subprocess.run(
        jobcore_command(*args),
        env=settings_env(settings, **{**UNREACHABLE, **env}),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"jobcore: {line}")
    assert done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize(
    ("args", "name", "value"),
    [
        (("relay",), "JOBCORE_RELAY_BATCH_SIZE", "0"),
        (("relay",), "JOBCORE_RELAY_POLL_INTERVAL", "0"),
        (("relay",), "JOBCORE_RELAY_MAX_PUBLISH_ATTEMPTS", "many"),
        (("relay",), "JOBCORE_RELAY_HEALTH_PORT", "70000"),
        (("dev",), "JOBCORE_RELAY_HEALTH_PORT", "-1"),
    ],
)
def test_a_bad_relay_option_stops_the_command_with_one_line_naming_it(
    args: tuple[str, ...], name: str, value: str
) -> None:
    # The relay's options live on RelayOptions (JOBCORE_RELAY_*), validated at start-up
    # before anything connects, like the flat settings.
    settings = Settings(environment="test", job_modules=TEST_JOB_MODULES)
    done = subprocess.run(
        jobcore_command(*args),
        env=settings_env(settings, **{**UNREACHABLE, name: value}),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"jobcore: {name}: "), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_the_bench_routes_are_refused_in_production() -> None:
    settings = Settings(environment="test", job_modules=TEST_JOB_MODULES)
    env = {
        **UNREACHABLE,
        "JOBCORE_ENVIRONMENT": "production",
        "JOBCORE_AMQP_URL": "amqp://jobcore:secret@127.0.0.1:9/",
        "JOBCORE_BENCH_ROUTES": "true",
    }
    done = subprocess.run(
        jobcore_command("api"),
        env=settings_env(settings, **env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("jobcore: JOBCORE_BENCH_ROUTES: "), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
