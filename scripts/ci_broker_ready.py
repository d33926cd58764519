"""CI: make sure RabbitMQ answers the AMQP handshake, and clear earlier test runs' topology.

A node that accepts TCP but never completes the handshake (seen after many stop/start
cycles) is killed and started again. Queues and exchanges left by earlier runs (test
prefixes ``jct.``, benchmark prefix ``bench.``) are deleted: hundreds of idle quorum
queues make every later ``stop_app`` / ``start_app`` in the fault tests slow.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import aio_pika

URL = "amqp://guest:guest@127.0.0.1:5672/"
PREFIXES = ("jct.", "bench.")


async def handshake_ok(wait: float = 90) -> bool:
    deadline = time.monotonic() + wait
    while True:
        try:
            connection = await aio_pika.connect(URL, timeout=10)
        except Exception:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(1)  # poll interval, bounded by the deadline
            continue
        await connection.close()
        return True


def restart_node() -> None:
    print("ci: RabbitMQ does not answer the AMQP handshake; restarting the node", flush=True)
    subprocess.run(["pkill", "-9", "-f", "beam.smp.*rabbit"], check=False)
    time.sleep(2)  # let the port close before the new node binds it
    subprocess.run(["rabbitmq-server", "-detached"], check=True)
    # The node registers with epmd a few seconds after -detached returns; until then
    # await_startup fails at once instead of waiting.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ping = subprocess.run(["rabbitmqctl", "-q", "ping"], capture_output=True, check=False)
        if ping.returncode == 0:
            break
        time.sleep(1)  # poll interval, bounded by the deadline
    subprocess.run(["timeout", "120", "rabbitmqctl", "-q", "await_startup"], check=False)


def names(kind: str) -> list[str]:
    out = subprocess.run(
        ["timeout", "120", "rabbitmqctl", "-q", f"list_{kind}", "name"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return [n for n in out.split() if n.startswith(PREFIXES)]


async def clear_leftovers() -> int:
    queues, exchanges = names("queues"), names("exchanges")
    # A node that just restarted recovers every quorum queue first and answers slowly.
    connection = await aio_pika.connect(URL, timeout=60)
    try:
        channel = await connection.channel()
        for queue in queues:
            await channel.queue_delete(queue)
        for exchange in exchanges:
            await channel.exchange_delete(exchange)
    finally:
        await connection.close()
    return len(queues) + len(exchanges)


def main() -> int:
    for attempt in range(3):
        if asyncio.run(handshake_ok()):
            break
        if attempt == 2:
            print("ci: RabbitMQ still does not answer after restarts", file=sys.stderr)
            return 1
        restart_node()
    for attempt in range(3):
        try:
            removed = asyncio.run(clear_leftovers())
            break
        except Exception as exc:  # the cleanup only saves time; it must not fail CI by itself
            print(
                f"ci: leftover cleanup failed ({type(exc).__name__}: {exc}); attempt {attempt + 1}"
            )
    else:
        return 0
    print(f"ci: RabbitMQ answers; removed {removed} leftover test queues and exchanges")
    return 0


if __name__ == "__main__":
    sys.exit(main())
