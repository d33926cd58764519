"""Retention settings: durations in every documented form, per-type overrides, refusals."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobcore.kernel.errors import ConfigurationError
from jobcore.kernel.settings import load_settings


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("604800", timedelta(days=7)),
        ("90.5", timedelta(seconds=90.5)),
        ("P7D", timedelta(days=7)),
        ("PT36H", timedelta(hours=36)),
        ("P1W", timedelta(days=7)),
        ("7d", timedelta(days=7)),
        ("7 days", timedelta(days=7)),
        (" 1d,12:00:00 ", timedelta(days=1, hours=12)),
        ("12:30:00", timedelta(hours=12, minutes=30)),
    ],
)
def test_a_retention_is_seconds_or_a_duration(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: timedelta
) -> None:
    monkeypatch.setenv("JOBCORE_RETENTION_SUCCEEDED", value)
    assert load_settings().retention_succeeded == expected


def test_defaults_and_per_type_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = load_settings()
    assert (settings.retention("succeeded", "x"), settings.retention("failed", "x")) == (
        timedelta(days=7),
        timedelta(days=30),
    )
    assert settings.retention("cancelled", "x") == timedelta(days=30)
    assert settings.inbox_retention == timedelta(days=3)

    monkeypatch.setenv(
        "JOBCORE_RETENTION_TYPES",
        '{"export_csv": {"succeeded": "P1D", "failed": 3600}, "noop": {"cancelled": "2d"}}',
    )
    settings = load_settings()
    assert settings.retention("succeeded", "export_csv") == timedelta(days=1)
    assert settings.retention("failed", "export_csv") == timedelta(hours=1)
    assert settings.retention("cancelled", "export_csv") == timedelta(days=30)
    assert settings.retention("cancelled", "noop") == timedelta(days=2)
    assert settings.retention("succeeded", "noop") == timedelta(days=7)


@pytest.mark.parametrize(
    ("env", "value", "message"),
    [
        ("JOBCORE_RETENTION_FAILED", "0", "JOBCORE_RETENTION_FAILED: must be a positive"),
        ("JOBCORE_RETENTION_FAILED", "-P1D", "JOBCORE_RETENTION_FAILED: must be a positive"),
        ("JOBCORE_RETENTION_CANCELLED", "soon", "JOBCORE_RETENTION_CANCELLED: "),
        (
            "JOBCORE_RETENTION_TYPES",
            '{"export_csv": {"succeded": "P1D"}}',
            "JOBCORE_RETENTION_TYPES: unknown status 'succeded' for job type 'export_csv'",
        ),
        (
            "JOBCORE_RETENTION_TYPES",
            '{"export_csv": {"pending": "P1D"}}',
            "JOBCORE_RETENTION_TYPES: unknown status 'pending'",
        ),
        ("JOBCORE_RETENTION_TYPES", "P1D", "JOBCORE_RETENTION_TYPES: must be a JSON object"),
        ("JOBCORE_RETENTION_TYPES", '{"noop": "P1D"}', "JOBCORE_RETENTION_TYPES: must map"),
        ("JOBCORE_PRUNER_BATCH_SIZE", "0", "JOBCORE_PRUNER_BATCH_SIZE: "),
        ("JOBCORE_PRUNER_INTERVAL", "0", "JOBCORE_PRUNER_INTERVAL: "),
    ],
)
def test_bad_retention_settings_give_one_line(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, message: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_an_inbox_window_shorter_than_the_longest_redelivery_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 20 deliveries × 1800 s = 10 hours.
    monkeypatch.setenv("JOBCORE_INBOX_RETENTION", "PT9H")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    text = str(info.value)
    assert text.startswith("JOBCORE_INBOX_RETENTION: 9:00:00 is shorter than")
    assert "JOBCORE_AMQP_DELIVERY_LIMIT × JOBCORE_AMQP_CONSUMER_TIMEOUT" in text
    assert "\n" not in text

    monkeypatch.setenv("JOBCORE_INBOX_RETENTION", "PT10H")
    assert load_settings().inbox_retention == timedelta(hours=10)

    # Raising the broker's consumer_timeout past the default window needs a longer window.
    monkeypatch.delenv("JOBCORE_INBOX_RETENTION")
    monkeypatch.setenv("JOBCORE_AMQP_CONSUMER_TIMEOUT", str(4 * 3600))
    with pytest.raises(ConfigurationError, match=r"^JOBCORE_INBOX_RETENTION: 3 days"):
        load_settings()
    monkeypatch.setenv("JOBCORE_AMQP_DELIVERY_LIMIT", "18")
    assert load_settings().longest_redelivery == 18 * 4 * 3600
