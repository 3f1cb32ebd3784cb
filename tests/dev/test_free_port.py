"""``free_port`` picks below the kernel's ephemeral range: a port a module names at import
and binds minutes later cannot be taken meanwhile by an outgoing connection (a run saw a
callback server's port taken so)."""

from __future__ import annotations

import socket

import pytest

from captcha_tasks.testing.processes import PORT_SPAN, _ephemeral_low, free_port

pytestmark = pytest.mark.redis  # binds sockets


def test_ports_are_picked_below_the_ephemeral_range_and_are_free() -> None:
    low = _ephemeral_low()
    ports = [free_port() for _ in range(20)]
    assert all(low - PORT_SPAN <= port < low for port in ports), (low, ports)
    for port in ports[:3]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # nothing listens there


def test_an_outgoing_connection_never_takes_a_picked_port() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            assert client.getsockname()[1] >= _ephemeral_low()
