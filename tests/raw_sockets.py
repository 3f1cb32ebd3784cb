"""Raw client sockets for the servers' hostile-client tests (the receiver's and the
gateway's, which share one server core): every 127.0.0.x is the loopback on Linux, so a
source address stands for a distinct client."""

from __future__ import annotations

import socket
import time

import pytest


def connect(port: int, source: str = "127.0.0.1", timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout, source_address=(source, 0))


def closed_after(sock: socket.socket, deadline_s: float) -> float:
    """Seconds until the server closes ``sock`` (reading whatever it sends meanwhile)."""
    started = time.monotonic()
    sock.settimeout(deadline_s)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail(f"the server kept a connection open for more than {deadline_s} s")
    return time.monotonic() - started


def refused(port: int, source: str, send: bytes = b"") -> float:
    """Seconds until a new connection from ``source`` is closed with no answer, having sent
    ``send`` (the server's reset may even beat the end of a loaded client's ``connect()``)."""
    started = time.monotonic()
    try:
        sock = connect(port, source)
    except ConnectionResetError:
        return time.monotonic() - started
    with sock:
        try:
            sock.sendall(send)
            sock.settimeout(5)
            answer = sock.recv(4096)
        except (ConnectionResetError, BrokenPipeError):
            answer = b""
        except TimeoutError:
            pytest.fail("a connection to be refused was held open")
    assert answer == b"", answer  # not even an error status
    return time.monotonic() - started
