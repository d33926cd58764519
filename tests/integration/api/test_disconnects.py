"""A client that goes away while sending its body is not a crash: a real API process (uvicorn)
logs one line for it, without a traceback, and counts it."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import orjson

from jobcore.kernel.settings import Settings
from jobcore.testing.processes import jobcore_process
from jobcore.testing.waiting import eventually

DISCONNECT_LOG = "client disconnected before its request body arrived"
DISCONNECTS = "jobcore_api_client_disconnects_total"
INTERNAL_ERRORS = "jobcore_api_internal_errors_total"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def send_half_a_body(port: int, api_key: str) -> None:
    """Headers announcing 64 bytes, then 32 of them, then the connection closes."""
    body = b'{"text": "' + b"x" * 52 + b'"}'
    assert len(body) == 64
    head = (
        "POST /jobs/echo HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {api_key}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode() + body[:32])


def counted(metrics: str) -> dict[str, float]:
    """The two counters of the exposition that are there."""
    found = {}
    for line in metrics.splitlines():
        name, _, value = line.partition(" ")
        if name in (DISCONNECTS, INTERNAL_ERRORS):
            found[name] = float(value)
    return found


async def test_a_client_gone_mid_body_is_one_log_line_and_counted(
    settings: Settings, api_key: str, tmp_path: Path
) -> None:
    port = free_port()
    log_path = tmp_path / "api.log"
    with jobcore_process(settings, "api", "--port", str(port), log_path=log_path) as proc:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:

            async def ready() -> bool:
                assert proc.poll() is None, log_path.read_text()
                try:
                    return (await client.get("/readyz")).status_code == 200
                except httpx.TransportError:
                    return False

            await eventually(ready, timeout=60, interval=0.1, what="jobcore api")
            before = counted((await client.get("/metrics")).text)

            send_half_a_body(port, api_key)

            async def request_ended() -> str | None:
                # Logged either way: as the disconnect it is, or as a crash.
                text = log_path.read_text()
                return text if DISCONNECT_LOG in text or "Exception in ASGI" in text else None

            await eventually(request_ended, timeout=30, what="the request's end logged")
            after = counted((await client.get("/metrics")).text)

    text = log_path.read_text()
    assert "Traceback" not in text, text
    assert "Exception in ASGI application" not in text, text
    [line] = [line for line in text.splitlines() if DISCONNECT_LOG in line]
    logged = orjson.loads(line)
    assert (logged["level"], logged["method"], logged["route"]) == ("info", "POST", "enqueue_echo")
    assert "ClientDisconnect" not in text, text
    # The process went on serving, and counted the disconnect once, not as an error.
    assert before == {DISCONNECTS: 0, INTERNAL_ERRORS: 0}
    assert after == {DISCONNECTS: 1, INTERNAL_ERRORS: 0}
