"""The testing kit tells which process holds a listening port, so a stack does not take
another process's server on the port it picked for its API as its own API."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from jobcore.testing.pipeline import listens_on


def test_the_process_holding_the_listener_is_told_from_another() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert listens_on(os.getpid(), port)
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert not listens_on(other.pid, port)
        finally:
            other.kill()
            other.wait()
    assert not listens_on(os.getpid(), port)
