"""`jobcore webhooks`: secrets, default endpoints, and refusing bad input in one line."""

from __future__ import annotations

import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from jobcore.kernel.settings import Settings
from jobcore.testing.processes import jobcore_command, settings_env
from tests.integration.webhooks.support import process_env


def jobcore(
    settings: Settings, *args: str, allowed: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = settings_env(settings, **(process_env(settings) if allowed else {}), **(env or {}))
    return subprocess.run(
        jobcore_command(*args), env=env, capture_output=True, text=True, timeout=60
    )


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout)


def test_a_secret_is_created_once_and_rotated_on_request(hsettings: Settings) -> None:
    first = as_json(jobcore(hsettings, "webhooks", "secret", "--tenant", "acme", "--json"))
    again = as_json(jobcore(hsettings, "webhooks", "secret", "--tenant", "acme", "--json"))
    assert first["secret"].startswith("whsec_")
    assert again["secret"] == first["secret"]
    assert again["rotated_at"] is None
    rotated = as_json(
        jobcore(hsettings, "webhooks", "secret", "--tenant", "acme", "--rotate", "--json")
    )
    assert rotated["secret"] != first["secret"]
    assert rotated["rotated_at"] is not None
    bad = jobcore(hsettings, "webhooks", "secret", "--tenant", "no spaces please")
    assert bad.returncode == 1
    assert bad.stderr.count("\n") == 1


def test_a_rotation_shows_its_overlap_and_when_the_old_secret_stops_signing(
    hsettings: Settings,
) -> None:
    first = as_json(jobcore(hsettings, "webhooks", "secret", "--tenant", "acme", "--json"))
    assert first["secret_format"] == "standard"
    assert first["rotation_overlap_seconds"] == 24 * 3600  # the default
    assert first["previous_expires_at"] is None
    before = datetime.now(UTC)
    overlap = {"JOBCORE_WEBHOOK_SECRET_OVERLAP": "PT2H"}
    rotated = as_json(
        jobcore(
            hsettings, "webhooks", "secret", "--tenant", "acme", "--rotate", "--json", env=overlap
        )
    )
    after = datetime.now(UTC)
    assert rotated["rotation_overlap_seconds"] == 2 * 3600
    expires = datetime.fromisoformat(rotated["previous_expires_at"])
    assert before + timedelta(hours=2) - timedelta(seconds=5) <= expires
    assert expires <= after + timedelta(hours=2) + timedelta(seconds=5)
    # People see the window too.
    shown = jobcore(hsettings, "webhooks", "secret", "--tenant", "acme", env=overlap)
    assert shown.returncode == 0, shown.stderr
    assert "rotation_overlap_seconds  7200" in shown.stdout
    assert "previous_expires_at" in shown.stdout
    # The setting is checked like every other: one line naming it.
    bad = jobcore(
        hsettings,
        "webhooks",
        "secret",
        "--tenant",
        "acme",
        env={"JOBCORE_WEBHOOK_SECRET_OVERLAP": "P31D"},
    )
    assert bad.returncode == 1
    assert bad.stderr.count("\n") == 1
    assert "JOBCORE_WEBHOOK_SECRET_OVERLAP" in bad.stderr
    assert rotated["secret"] not in bad.stderr


def test_default_endpoints_are_set_listed_and_removed(hsettings: Settings) -> None:
    url = "http://127.0.0.1:8123/hooks"
    set_ = as_json(
        jobcore(
            hsettings, "webhooks", "endpoint", "set", "--tenant", "acme", "--url", url, "--json"
        )
    )
    assert (set_["tenant"], set_["job_type"], set_["url"]) == ("acme", "*", url)
    listed = as_json(jobcore(hsettings, "webhooks", "endpoint", "list", "--json"))
    assert [(e["tenant"], e["job_type"], e["url"]) for e in listed] == [("acme", "*", url)]
    removed = jobcore(hsettings, "webhooks", "endpoint", "remove", "--tenant", "acme")
    assert removed.returncode == 0, removed.stderr
    assert as_json(jobcore(hsettings, "webhooks", "endpoint", "list", "--json")) == []
    again = jobcore(hsettings, "webhooks", "endpoint", "remove", "--tenant", "acme")
    assert again.returncode == 1
    assert "no default endpoint" in again.stderr


def test_endpoints_are_checked_like_callback_urls(hsettings: Settings) -> None:
    private = jobcore(
        hsettings,
        "webhooks",
        "endpoint",
        "set",
        "--tenant",
        "acme",
        "--url",
        "http://10.0.0.1/x",
    )
    assert private.returncode == 1
    assert private.stderr.startswith("jobcore: ")
    assert "not public" in private.stderr
    assert "10.0.0.1" not in private.stderr
    assert private.stderr.count("\n") == 1
    unknown_type = jobcore(
        hsettings,
        "webhooks",
        "endpoint",
        "set",
        "--tenant",
        "acme",
        "--type",
        "nope",
        "--url",
        "http://127.0.0.1:1/x",
    )
    assert unknown_type.returncode == 1
    assert "nope" in unknown_type.stderr
    loopback = jobcore(
        hsettings,
        "webhooks",
        "endpoint",
        "set",
        "--tenant",
        "acme",
        "--url",
        "http://127.0.0.1:1/x",
        allowed=False,
    )
    assert loopback.returncode == 1
    assert "not public" in loopback.stderr


def test_redeliver_and_list_refuse_bad_input_in_one_line(hsettings: Settings) -> None:
    missing = jobcore(hsettings, "webhooks", "redeliver", str(uuid.uuid4()))
    assert missing.returncode == 1
    assert "no webhook delivery" in missing.stderr
    not_an_id = jobcore(hsettings, "webhooks", "redeliver", "nope")
    assert not_an_id.returncode == 2
    bad_status = jobcore(hsettings, "webhooks", "list", "--status", "lost")
    assert bad_status.returncode == 2
    assert bad_status.stderr.count("\n") == 1
    assert as_json(jobcore(hsettings, "webhooks", "list", "--json")) == []
