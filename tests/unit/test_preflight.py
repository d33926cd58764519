"""Start-up checks of settings that together could deadlock: each refusal is one line
naming the variables."""

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from jobcore.amqp.deliveries import split_prefetch
from jobcore.execution.attempts import error_text
from jobcore.execution.preflight import (
    MIN_HELD_CONNECTIONS,
    check_job_types,
    check_relay_timeouts,
    held_connections,
)
from jobcore.execution.registry import JobContext, Registry
from jobcore.kernel.errors import ConfigurationError
from jobcore.kernel.settings import Settings

WORKER_POOL_USERS = {"cancel listener": 1, "reaper": 1, "rescuer": 1, "webhook deliverer": 1}


class Payload(BaseModel):
    pass


async def handler(ctx: JobContext[Payload]) -> None:
    return None


def one_line(call: Callable[[], Any]) -> str:
    with pytest.raises(ConfigurationError) as info:
        call()
    text = str(info.value)
    assert "\n" not in text
    return text


def test_the_hot_path_keeps_what_the_other_pool_users_leave() -> None:
    assert held_connections(Settings(db_pool_max=8), WORKER_POOL_USERS) == 8 - 4
    smallest = 4 + MIN_HELD_CONNECTIONS
    assert held_connections(Settings(db_pool_max=smallest), WORKER_POOL_USERS) == 2
    # A maintenance service added to the worker is one more user.
    with_pruner = {**WORKER_POOL_USERS, "pruner": 1}
    text = one_line(lambda: held_connections(Settings(db_pool_max=smallest), with_pruner))
    assert text == (
        "JOBCORE_DB_POOL_MAX: 6 connections are too few for this worker, which needs 7 at "
        "once (2 for claims and outcomes, 1 for the cancel listener, 1 for the reaper, "
        "1 for the rescuer, 1 for the webhook deliverer, 1 for the pruner)"
    )


def test_a_relay_must_not_wait_for_confirms_near_the_servers_idle_limit() -> None:
    check_relay_timeouts(Settings(), publish_timeout=10.0, connect_timeout=5.0)  # defaults
    # The server ends a transaction idle for 2 x 30 s; three quarters of that may be used.
    check_relay_timeouts(Settings(), publish_timeout=40.0, connect_timeout=5.0)
    text = one_line(
        lambda: check_relay_timeouts(Settings(), publish_timeout=41.0, connect_timeout=5.0)
    )
    assert text.startswith("JOBCORE_RELAY_PUBLISH_TIMEOUT: with JOBCORE_RELAY_CONNECT_TIMEOUT")
    assert "JOBCORE_DB_OPERATION_TIMEOUT" in text
    # A shorter operation timeout makes the same publish timeout too long.
    short = Settings(db_operation_timeout=5.0)
    one_line(lambda: check_relay_timeouts(short, publish_timeout=10.0, connect_timeout=5.0))


def test_a_job_type_may_not_hold_a_slot_past_the_brokers_consumer_timeout() -> None:
    registry = Registry()
    registry.job("long", payload=Payload, timeout=1700, lease=60)(handler)
    check_job_types(registry, Settings())  # 1760 s < 1800 s
    text = one_line(lambda: check_job_types(registry, Settings(amqp_consumer_timeout=1760)))
    assert text.startswith("JOBCORE_AMQP_CONSUMER_TIMEOUT: job type 'long' (")
    assert "timeout 1700s + lease 60s" in text


def test_the_registry_refuses_a_job_type_on_the_webhooks_queue() -> None:
    registry = Registry()
    text = one_line(lambda: registry.job("hook", payload=Payload, queue="webhooks")(handler))
    assert text.startswith("JOBCORE_JOB_MODULES: job type 'hook' (")
    assert "'webhooks', which is reserved" in text
    assert "hook" not in registry


def test_the_prefetch_is_split_over_the_queues_and_never_below_one_each() -> None:
    assert split_prefetch(16, ["b", "a", "c"]) == {"a": 6, "b": 5, "c": 5}
    assert sum(split_prefetch(7, ["x", "y"]).values()) == 7
    assert split_prefetch(1, ["only"]) == {"only": 1}
    text = one_line(lambda: split_prefetch(1, ["default", "testq"]))
    assert text.startswith("JOBCORE_WORKER_PREFETCH: a prefetch of 1 cannot be shared by the 2")


def test_error_texts_are_made_storable() -> None:
    assert error_text(RuntimeError("a\x00b \udce9")) == "RuntimeError: a\\x00b ?"
    assert error_text(OSError()) == "OSError"
