"""The audit log's pure parts: actors, what details may hold, and `--since`."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from jobcore.access.audit import (
    InvalidActor,
    _details_json,
    check_actor,
    cli_actor,
    key_actor,
    url_fingerprint,
)
from jobcore.kernel.errors import ConfigurationError
from jobcore.kernel.settings import load_settings
from services.cli.audit import parse_since

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_actors_are_named_by_where_they_come_from() -> None:
    key_id = uuid.UUID(int=7)
    assert key_actor(key_id) == f"key:{key_id}"
    assert cli_actor().startswith("cli:")
    assert "@" in cli_actor()
    assert check_actor("ops:alice") == "ops:alice"
    for bad in ("", "a\nb", "a\x1bb", "x" * 201):
        with pytest.raises(InvalidActor):
            check_actor(bad)


def test_details_refuse_what_must_never_be_logged() -> None:
    for name in ("secret", "key", "key_hash", "payload", "url", "token"):
        with pytest.raises(ValueError, match="must not carry"):
            _details_json({name: "x", "fine": 1})
    assert _details_json({"job_id": uuid.UUID(int=1)}).obj == {"job_id": uuid.UUID(int=1)}


def test_a_url_is_kept_as_its_origin_and_a_hash_only() -> None:
    shown = url_fingerprint("https://user:pw@hooks.example.com:8443/T0/B0/secret?token=abc")
    assert shown["url_origin"] == "https://hooks.example.com:8443"
    for hidden in ("secret", "abc", "pw", "user"):
        assert hidden not in str(shown)
    assert url_fingerprint("https://a.example/x") != url_fingerprint("https://a.example/y")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("90", NOW - timedelta(seconds=90)),
        ("30m", NOW - timedelta(minutes=30)),
        ("12h", NOW - timedelta(hours=12)),
        ("7d", NOW - timedelta(days=7)),
        ("2w", NOW - timedelta(weeks=2)),
        ("PT1H30M", NOW - timedelta(hours=1, minutes=30)),
        ("P7D", NOW - timedelta(days=7)),
        ("2026-11-30T08:00:00Z", datetime(2026, 11, 30, 8, tzinfo=UTC)),
        ("2026-11-30T08:00:00", datetime(2026, 11, 30, 8, tzinfo=UTC)),  # no offset: UTC
        ("2026-11-30T08:00:00+02:00", datetime(2026, 11, 30, 6, tzinfo=UTC)),
        ("2026-11-30", datetime(2026, 11, 30, tzinfo=UTC)),
    ],
)
def test_since_is_a_duration_back_from_now_or_a_time(given: str, expected: datetime) -> None:
    assert parse_since(given, NOW) == expected


@pytest.mark.parametrize("given", ["yesterday", "P", "PT", "5y", "-3h", ""])
def test_since_refuses_anything_else(given: str) -> None:
    with pytest.raises(ValueError, match="--since"):
        parse_since(given, NOW)


def test_jobcore_actor_is_a_checked_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBCORE_ACTOR", "ops:alice")
    assert load_settings().actor == "ops:alice"
    for bad in ("two\nlines", "x" * 201):
        monkeypatch.setenv("JOBCORE_ACTOR", bad)
        with pytest.raises(ConfigurationError, match=r"^JOBCORE_ACTOR: "):
            load_settings()
