"""connect() turns every way a handshake can fail into BrokerUnavailable.

When the broker side closes during the handshake, aiormq's frame reader can end with
StopAsyncIteration, and it escapes ``aio_pika.connect`` as it is. Not being a broker
error, it ended the relay's loop for good (seen in `jobcore demo` under uvloop, with the
broker cut through a proxy), where a failed connection is retried.
"""

from __future__ import annotations

from typing import Any

import pytest

from jobcore.amqp import connection
from jobcore.kernel.errors import BrokerUnavailable
from jobcore.kernel.settings import Settings

# Never connected to: aio_pika's connect functions are replaced in every test.
SETTINGS = Settings(amqp_url="amqp://guest:secret@127.0.0.1:1/")


async def _reader_ran_dry(*_: Any, **__: Any) -> Any:
    raise StopAsyncIteration


async def _refused(*_: Any, **__: Any) -> Any:
    raise ConnectionRefusedError(111, "Connection refused")


@pytest.mark.parametrize("failure", [_reader_ran_dry, _refused])
@pytest.mark.parametrize("opener", [connection.connect, connection.connect_robust])
async def test_a_failed_handshake_is_broker_unavailable_with_the_password_redacted(
    monkeypatch: pytest.MonkeyPatch, opener: Any, failure: Any
) -> None:
    monkeypatch.setattr(connection.aio_pika, "connect", failure)
    monkeypatch.setattr(connection.FailoverConnection, "connect", failure)
    with pytest.raises(BrokerUnavailable, match="JOBCORE_AMQP_URL: cannot connect") as caught:
        await opener(SETTINGS)
    assert "secret" not in str(caught.value)
    assert not str(caught.value).rstrip().endswith(":")  # a reason, never an empty one


async def test_with_several_brokers_the_error_names_each_without_its_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connection.aio_pika, "connect", _refused)
    monkeypatch.setattr(connection.FailoverConnection, "connect", _refused)
    brokers = Settings(amqp_url="amqp://u:secret@127.0.0.1:1/,amqp://u:secret@127.0.0.2:2/")
    for opener in (connection.connect, connection.connect_robust):
        with pytest.raises(BrokerUnavailable, match="cannot connect to any broker") as caught:
            await opener(brokers)
        text = str(caught.value)
        assert "secret" not in text
        assert "127.0.0.1:1" in text
        assert "127.0.0.2:2" in text
