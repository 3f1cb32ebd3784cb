"""``free_port`` picks below the kernel's ephemeral range: a port a module names at import
and binds minutes later cannot be taken meanwhile by an outgoing connection (a run saw a
callback server's port taken so).  Another process's pick skips it, and a Redis server
started on a port another server already holds says so instead of passing for it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from subprocess import PIPE

import pytest

from captcha_tasks.testing import processes
from captcha_tasks.testing.processes import PORT_SPAN, RedisServer, _ephemeral_low, free_port

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


def test_a_redis_server_refuses_a_port_another_one_holds(tmp_path: Path) -> None:
    first = RedisServer(log_dir=tmp_path / "first").start()
    second = RedisServer(port=first.port, log_dir=tmp_path / "second")
    try:
        with pytest.raises(RuntimeError, match=f"port {first.port}"):
            second.start()
    finally:
        second.stop()
        first.stop()


def test_a_port_another_live_process_picked_is_not_picked_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    taken, other = free_port(), free_port()
    monkeypatch.setenv(processes.PICKS_ENV, str(tmp_path))
    picks = iter([taken, other, taken])
    monkeypatch.setattr(processes._PICK, "randrange", lambda low, high: next(picks))
    # another process of the run, alive: it waits for its stdin to close
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=PIPE)
    try:
        (tmp_path / str(taken)).write_text(str(live.pid))
        assert free_port() == other
    finally:
        assert live.stdin is not None
        live.stdin.close()
        live.wait(10)
    assert free_port() == taken  # its picker is gone: the pick is given up
    assert (tmp_path / str(taken)).read_text() == str(os.getpid())
