"""The pool's socket probe works for descriptors from 1024 up (select() refuses them)."""

from __future__ import annotations

import os
import resource
import socket

import pytest

from jobcore.database.gateway import has_input

HIGH_FD = 1500


def test_has_input_sees_data_and_hang_ups_on_a_descriptor_above_1024() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft <= HIGH_FD:
        pytest.fail(f"RLIMIT_NOFILE is {soft}; this test needs more than {HIGH_FD}")
    ours, theirs = socket.socketpair()
    high = os.dup2(ours.fileno(), HIGH_FD)
    try:
        assert not has_input(high)
        theirs.sendall(b"N")  # a notification, or the server's FATAL before it hangs up
        assert has_input(high)
        ours.recv(1)
        assert not has_input(high)
        theirs.close()  # the server went away
        assert has_input(high)
    finally:
        os.close(high)
        ours.close()
