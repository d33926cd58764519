"""`jobcore keys create|list|revoke` and `jobcore api`'s argument checks, as processes."""

from __future__ import annotations

import subprocess

import httpx
import orjson

from jobcore.kernel.settings import Settings
from jobcore.testing.processes import ROOT, jobcore_command, settings_env


def jobcore(settings: Settings, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        jobcore_command(*args),
        env=settings_env(settings, **env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_keys_create_list_revoke(settings: Settings, api_client: httpx.AsyncClient) -> None:
    created = jobcore(settings, "keys", "create", "--tenant", "acme", "--label", "ci", "--json")
    assert created.returncode == 0, created.stderr
    key = orjson.loads(created.stdout)
    assert key["key"].startswith("jc_")
    assert key["tenant"] == "acme"
    assert key["label"] == "ci"
    auth = {"Authorization": f"Bearer {key['key']}"}
    assert (await api_client.get("/jobs", headers=auth)).status_code == 200

    listed = jobcore(settings, "keys", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    [row] = orjson.loads(listed.stdout)
    assert row["id"] == key["id"]
    assert row["prefix"] == key["key"][:11]
    assert key["key"] not in listed.stdout
    assert row["revoked_at"] is None
    table = jobcore(settings, "keys", "list", "--tenant", "acme")
    assert table.returncode == 0, table.stderr
    assert key["id"] in table.stdout
    assert key["key"] not in table.stdout
    other = jobcore(settings, "keys", "list", "--tenant", "other", "--json")
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() == "[]"

    revoked = jobcore(settings, "keys", "revoke", key["id"])
    assert revoked.returncode == 0, revoked.stderr
    assert key["id"] in revoked.stdout
    assert (await api_client.get("/jobs", headers=auth)).status_code == 401
    after = jobcore(settings, "keys", "list", "--json")
    # A CLI that failed (it says why on stderr) shows as its own message, not as bad JSON.
    assert after.returncode == 0, after.stderr
    assert orjson.loads(after.stdout)[0]["revoked_at"]


def test_bad_arguments_fail_with_one_line(settings: Settings) -> None:
    cases = [
        ("keys", "create", "--tenant", "not a tenant"),
        ("keys", "create"),
        ("keys", "revoke", "not-a-uuid"),
        ("keys", "revoke", "00000000-0000-0000-0000-000000000000"),
        ("api", "--port", "70000"),
        ("api", "--workers", "0"),
    ]
    for args in cases:
        result = jobcore(settings, *args)
        assert result.returncode != 0, args
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (args, result.stderr)
        assert lines[0].startswith("jobcore: "), (args, result.stderr)


def test_database_errors_are_one_line(settings: Settings) -> None:
    result = jobcore(
        settings,
        "keys",
        "list",
        JOBCORE_DATABASE_URL="postgresql://postgres@127.0.0.1:1/jobcore",
        JOBCORE_DB_CONNECT_TIMEOUT="1",
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("jobcore: JOBCORE_DATABASE_URL")
