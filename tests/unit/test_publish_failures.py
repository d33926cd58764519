"""What becomes of a row whose message was not published (jobcore.amqp.publisher.Failure),
and how the broker's refusal of a body over its max_message_size is read."""

from __future__ import annotations

import aiormq
import pytest

from jobcore.amqp.publisher import Failure, refused_size_limit

TRANSIENT = (Failure.NACKED, Failure.RETURNED, Failure.NO_EXCHANGE)
PERMANENT = (Failure.MALFORMED, Failure.TOO_LARGE)


@pytest.mark.parametrize("failure", TRANSIENT)
def test_a_refusal_for_now_is_never_quarantined_however_often(failure: Failure) -> None:
    assert not any(failure.quarantines(attempts, 10) for attempts in (1, 10, 11, 10_000))


@pytest.mark.parametrize("failure", PERMANENT)
def test_a_message_that_can_never_be_published_is_quarantined_at_once(failure: Failure) -> None:
    assert failure.quarantines(1, 10)


def test_an_unexpected_error_is_retried_up_to_the_max_attempts() -> None:
    assert [Failure.UNEXPECTED.quarantines(n, 3) for n in (1, 2, 3, 4)] == [
        False,
        False,
        True,
        True,
    ]


def test_every_failure_is_classified() -> None:
    assert set(Failure) == {*TRANSIENT, *PERMANENT, Failure.UNEXPECTED}


def test_only_returns_and_missing_exchanges_ask_for_the_topology() -> None:
    assert {f for f in Failure if f.is_missing_route} == {Failure.RETURNED, Failure.NO_EXCHANGE}


def _precondition_failed(text: str) -> aiormq.exceptions.AMQPError:
    # What aiormq raises into a channel's publishes when the broker closes it with 406.
    return aiormq.exceptions.ChannelPreconditionFailed(text)


def test_the_brokers_size_limit_is_read_from_its_refusal() -> None:
    # RabbitMQ 3.10's words, seen when publishing 128 MiB + 1 byte to this machine's broker.
    refusal = _precondition_failed(
        "PRECONDITION_FAILED - message size 134217729 is larger than configured max size 134217728",
    )
    assert refused_size_limit(refusal) == 134217728


def test_other_channel_closes_teach_no_size_limit() -> None:
    assert refused_size_limit(_precondition_failed("PRECONDITION_FAILED - other")) is None
    assert refused_size_limit(ConnectionResetError("reset")) is None
