"""The HTTP server core of the processes that face the internet (``captcha-tasks
pingback-server``, ``captcha-tasks gateway``): an asyncio server speaking HTTP/1.1
through h11 (a sans-I/O protocol state machine; we do the I/O), serving one
:class:`Site`.

Such a server is built to hold against clients that connect and never finish, or flood it
with connections:

* a connection is a small protocol object on one event loop: a slow or idle client costs
  a few KiB, never a thread;
* a connection is let in or closed the moment it is accepted, before a byte is read
  (:func:`.limits.admit`: the allowlist, a cap per address, a cap overall; when full, the
  connection that has waited longest for its request makes room).  The server accepts
  connections itself, so a refused one costs an ``accept()`` and a ``close()``, not an
  asyncio transport: a flood of them cannot crowd out the rest of the loop's work;
* a TLS handshake, a request's headers and its body each have a deadline, however slowly
  they drip;
* a body larger than the site's :attr:`Site.max_body` is never read: its request is
  answered (:meth:`Site.respond`, with ``body_size`` above the limit and no body) and the
  connection closed;
* ``/health`` is answered on the loop at once;
* the site's answers (:meth:`Site.respond`: Redis calls, Celery publishes) are made on a
  bounded pool of threads; requests beyond its queue are answered 503 at once
  (:meth:`Site.busy`).  Nothing on that pool waits for a solve: it reads and writes Redis.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import socket
import ssl
import struct
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from http import HTTPStatus
from typing import Any, Protocol, TypeVar
from urllib.parse import unquote, urlsplit

import h11

from . import addresses
from .limits import Admit, Limits, admit

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Open files kept beyond the connections: Redis and broker connections, logs, the listener.
FD_RESERVE = 128
#: Seconds between the warnings that sum up refused and timed-out connections.
TALLY_EVERY = 60.0
#: Seconds a stopping server waits for the requests being answered.
DRAIN_S = 5.0
#: Connections accepted per turn of the event loop (the rest wait for the next turn, so a
#: flood shares the loop with requests in progress).
ACCEPT_BATCH = 64
#: Seconds the server stops accepting when the process is out of open files.
ACCEPT_PAUSE_S = 0.5
#: ``SO_LINGER`` on, zero seconds: ``close()`` resets the connection at once, so a refused
#: flood leaves no sockets closing in the kernel.
_RESET = struct.pack("ii", 1, 0)
#: Tally counts that mean someone misbehaved (worth a warning); the rest are routine.
HOSTILE = (
    "refused_not_allowed",
    "refused_per_address",
    "refused_full",
    "evicted",
    "header_timeout",
    "body_timeout",
    "bad_request",
    "busy",
    "unread_responses",
    "accept_errors",
    "handshake_failed",
)


@dataclass(frozen=True)
class Request:
    """One request, as a site answers it.  ``body`` is empty when ``body_size`` (what the
    client declared or sent) is over the site's :attr:`Site.max_body`: it was not read."""

    method: str
    #: The path, percent-decoded.
    path: str
    #: The query string, as sent.
    query: str
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes
    body_size: int
    #: The client's address (behind a trusted proxy: the one its headers name).
    address: str

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        wanted = name.lower().encode("latin-1")
        for key, value in self.headers:
            if key == wanted:
                return value.decode("latin-1")
        return None


@dataclass(frozen=True)
class Response:
    """What a site answers."""

    status: int
    body: bytes
    content_type: str = "text/plain"
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def text(cls, status: int, text: str) -> Response:
        return cls(status, text.encode())


class Site(Protocol):
    """What a server serves: who may call, and the answers.  Its methods other than
    :meth:`respond` run on the event loop and must not block."""

    #: Names the server in logs and thread names (``pingback``, ``gateway``).
    name: str
    #: Bytes of a request body the site reads; a larger one is answered unread.
    max_body: int
    #: Bytes of an answer a client may leave unread before its connection is dropped.
    max_unread: int

    def allows(self, address: str) -> bool:
        """Whether the allowlist lets ``address`` in."""

    def is_proxy(self, address: str) -> bool:
        """Whether ``address`` is a trusted reverse proxy."""

    def client_address(self, peer: str, forwarded_for: Sequence[str]) -> str:
        """The client behind the trusted proxy ``peer`` (its ``X-Forwarded-For`` values)."""

    def respond(self, request: Request) -> Response:
        """The answer to ``request`` (on a thread of the server's pool)."""

    def refusal(self, status: int, reason: str) -> Response:
        """The answer when the server refuses a request itself: ``busy`` (503),
        ``unavailable`` (503, :meth:`respond` failed), ``not_allowed`` (403)."""


class _Hub:
    """What the connections share; touched on the event loop only."""

    def __init__(self, site: Site, limits: Limits, loop: asyncio.AbstractEventLoop):
        self.site, self.limits, self.loop = site, limits, loop
        self.executor = ThreadPoolExecutor(limits.judge_threads, f"{site.name}-answer")
        self.tls: ssl.SSLContext | None = None
        #: Connections set up (``held``, ``by_address``: those accepted, set up or not).
        self.connections: set[_Connection] = set()
        self.held = 0
        self.closing = False
        self.by_address: Counter[str] = Counter()
        #: Connections waiting for (the rest of) a request, longest waiting first.
        self.waiting: OrderedDict[_Connection, None] = OrderedDict()
        self.pending = 0
        self.drained = asyncio.Event()
        self.drained.set()
        self.tally: Counter[str] = Counter()
        self._logged: Counter[str] = Counter()
        self._tally_timer: asyncio.TimerHandle | None = None
        self._setting_up: set[asyncio.Task[None]] = set()

    def accept(self, listener: socket.socket) -> None:
        """Accept what is waiting on ``listener`` (a batch per turn of the loop)."""
        for _ in range(ACCEPT_BATCH):
            try:
                sock, peername = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._accept_failed(listener, exc)
                return
            peer = addresses.normalized(str(peername[0]) if isinstance(peername, tuple) else "")
            if self.enter(peer):
                sock.setblocking(False)
                task = self.loop.create_task(self._set_up(sock, peer))
                self._setting_up.add(task)  # the loop keeps only a weak reference
                task.add_done_callback(self._setting_up.discard)
            else:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
                sock.close()  # nothing read

    def _accept_failed(self, listener: socket.socket, exc: OSError) -> None:
        if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            return  # the client gave up before we accepted (ECONNABORTED and kin)
        self.tally["accept_errors"] += 1
        log.warning(
            "%s server cannot accept: %s; pausing %.1f s", self.site.name, exc, ACCEPT_PAUSE_S
        )
        self.loop.remove_reader(listener)
        self.loop.call_later(ACCEPT_PAUSE_S, self._resume, listener)

    def _resume(self, listener: socket.socket) -> None:
        if not self.closing:
            self.loop.add_reader(listener, self.accept, listener)

    async def _set_up(self, sock: socket.socket, peer: str) -> None:
        try:
            await self.loop.connect_accepted_socket(
                lambda: _Connection(self, peer),
                sock,
                ssl=self.tls,
                # a handshake that never finishes is a slow client like any other
                ssl_handshake_timeout=self.limits.header_timeout if self.tls else None,
            )
        except (OSError, TimeoutError):  # ssl.SSLError is an OSError
            if self.tls is not None:
                self.tally["handshake_failed"] += 1
            self.release(peer)
            sock.close()

    def enter(self, peer: str) -> bool:
        """Count a connection from ``peer`` in, or refuse it (see :func:`.limits.admit`)."""
        decision = admit(
            self.limits,
            allowed=self.site.allows(peer),
            proxy=self.site.is_proxy(peer),
            from_address=self.by_address[peer],
            total=self.held,
            evictable=len(self.waiting),
        )
        if not isinstance(decision, Admit):
            self.tally[f"refused_{decision}"] += 1
            log.debug("connection from %s refused: %s", peer, decision)
            return False
        if decision.evict:
            oldest = next(iter(self.waiting))
            self.tally["evicted"] += 1
            log.debug("connection from %s closed to make room", oldest.peer)
            oldest.drop()
        self.held += 1
        self.by_address[peer] += 1
        return True

    def release(self, peer: str) -> None:
        self.held -= 1
        self.by_address[peer] -= 1
        if self.by_address[peer] <= 0:
            del self.by_address[peer]

    def leave(self, conn: _Connection) -> None:
        if conn not in self.connections:
            return
        self.connections.discard(conn)
        self.waiting.pop(conn, None)
        self.release(conn.peer)

    def answering(self, started: bool) -> None:
        self.pending += 1 if started else -1
        if self.pending:
            self.drained.clear()
        else:
            self.drained.set()

    def stats(self) -> dict[str, Any]:
        return {
            "open": self.held,
            "by_address": dict(self.by_address),
            "waiting": len(self.waiting),
            "pending": self.pending,
            "tally": dict(self.tally),
        }

    def log_tally(self) -> None:
        """A warning every TALLY_EVERY seconds in which clients misbehaved."""
        fresh = {k: self.tally[k] - self._logged[k] for k in HOSTILE}
        fresh = {k: n for k, n in fresh.items() if n > 0}
        self._logged = Counter(self.tally)
        if fresh:
            top = ", ".join(f"{a} ({n})" for a, n in self.by_address.most_common(3))
            log.warning(
                "%s server, last %.0f s: %s; open now %d (most from %s)",
                self.site.name,
                TALLY_EVERY,
                ", ".join(f"{k} {v}" for k, v in fresh.items()),
                self.held,
                top or "nobody",
            )
        self._tally_timer = self.loop.call_later(TALLY_EVERY, self.log_tally)

    def start(self) -> None:
        self._tally_timer = self.loop.call_later(TALLY_EVERY, self.log_tally)

    async def close(self) -> None:
        """Drop idle connections, give those being answered DRAIN_S to be answered."""
        self.closing = True
        if self._tally_timer is not None:
            self._tally_timer.cancel()
        for conn in list(self.waiting):
            conn.drop()
        try:
            async with asyncio.timeout(DRAIN_S):
                await self.drained.wait()
        except TimeoutError:
            log.warning("stopping with %d requests still being answered", self.pending)
        for conn in list(self.connections):
            conn.drop()
        self.executor.shutdown(wait=not self.pending, cancel_futures=True)


class _Connection(asyncio.Protocol):
    """One client connection: bytes in, h11 events, one request answered at a time."""

    def __init__(self, hub: _Hub, peer: str) -> None:
        self.hub = hub
        self.site = hub.site
        self.limits = hub.limits
        self.transport: asyncio.Transport | None = None
        self.peer = peer
        self.address = peer  # the client's, once the headers name it behind a proxy
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=hub.limits.max_header_bytes)
        self.timer: asyncio.TimerHandle | None = None
        self.request: h11.Request | None = None
        self.body = bytearray()
        self.body_size = 0
        self.answering = False
        self.closed = False
        self.served = 0
        self.heard = False  # bytes of the current request have arrived

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=self.site.max_unread)
        self.hub.connections.add(self)  # counted in when accepted (Hub.enter)
        if self.hub.closing:
            self.drop()
            return
        self._await_request()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.heard = True
        self.h11.receive_data(data)
        self._advance()

    def eof_received(self) -> bool:
        if not self.closed:
            self.h11.receive_data(b"")
            self._advance()
        return True  # half-closed: a request being answered still gets its answer

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()

    def pause_writing(self) -> None:
        # a client that leaves more than max_unread bytes of answers unread is not
        # reading them
        self.hub.tally["unread_responses"] += 1
        self.drop()

    # -- requests ------------------------------------------------------------------------

    def _advance(self) -> None:
        while not self.closed and not self.answering:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                self._bad_request(exc.error_status_hint)
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                self._on_request(event)
            elif isinstance(event, h11.Data):
                self._on_data(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self._answer()
            elif isinstance(event, h11.ConnectionClosed):
                self.finish()

    def _on_request(self, request: h11.Request) -> None:
        self.request = request
        if _head_size(request) > self.limits.max_header_bytes:
            # h11 bounds a head that is still arriving; this bounds one that came at once
            self._bad_request(431)
            return
        self._arm(self.limits.body_timeout, "body_timeout")
        if self.site.is_proxy(self.peer):
            forwarded = [v.decode("latin-1") for k, v in request.headers if k == b"x-forwarded-for"]
            self.address = self.site.client_address(self.peer, forwarded)
            if not self.site.allows(self.address):
                self.hub.tally["refused_not_allowed"] += 1
                self._respond(self.site.refusal(403, "not_allowed"), close=True)
                return
        declared = _content_length(request)
        if declared > self.site.max_body:
            self.body_size = declared
            self._answer(close=True)  # refused unread
        elif self.h11.client_is_waiting_for_100_continue:
            self._write(self.h11.send(h11.InformationalResponse(status_code=100, headers=[])))

    def _on_data(self, data: bytes) -> None:
        self.body_size += len(data)
        if self.body_size > self.site.max_body:
            self._answer(close=True)  # chunked past the limit: answered, the rest unread
        else:
            self.body += data

    def _answer(self, close: bool = False) -> None:
        assert self.request is not None
        self._disarm()
        self.hub.waiting.pop(self, None)
        target = urlsplit(self.request.target.decode("latin-1"))
        path = unquote(target.path)
        if path == "/health":  # for health checks: answered at once, by no site
            self._respond(Response.text(200, "ok"), close)
            return
        if self.hub.pending >= self.limits.max_pending:
            self.hub.tally["busy"] += 1
            self._respond(self.site.refusal(503, "busy"), close)
            return
        oversized = self.body_size > self.site.max_body
        request = Request(
            method=self.request.method.decode("latin-1"),
            path=path,
            query=target.query,
            headers=tuple((bytes(k), bytes(v)) for k, v in self.request.headers),
            body=b"" if oversized else bytes(self.body),
            body_size=self.body_size,
            address=self.address,
        )
        self.answering = True
        self.hub.answering(started=True)
        assert self.transport is not None
        self.transport.pause_reading()  # one request at a time: pipelined ones wait
        future = self.hub.loop.run_in_executor(self.hub.executor, self.site.respond, request)
        future.add_done_callback(partial(self._answered, close=close))

    def _answered(self, future: asyncio.Future[Response], close: bool) -> None:
        self.hub.answering(started=False)
        self.answering = False
        if self.closed:
            return
        try:
            response = future.result()
        except Exception:
            log.exception("answering a request from %s failed", self.address)
            response = self.site.refusal(503, "unavailable")
        self._respond(response, close)
        if not self.closed:
            assert self.transport is not None
            self.transport.resume_reading()
            self._advance()  # a pipelined request may be waiting in h11's buffer

    def _respond(self, response: Response, close: bool) -> None:
        assert self.request is not None
        body = response.body
        headers = [
            (b"content-type", response.content_type.encode("latin-1")),
            (b"content-length", b"%d" % len(body)),
            *((k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers),
        ]
        if close:
            headers.append((b"connection", b"close"))
        reason = HTTPStatus(response.status).phrase.encode()
        head = h11.Response(status_code=response.status, headers=headers, reason=reason)
        data = self.h11.send(head) or b""
        if self.request.method != b"HEAD":
            data += self.h11.send(h11.Data(data=body)) or b""
        data += self.h11.send(h11.EndOfMessage()) or b""
        self._write(data)
        self.served += 1
        if self.closed:  # dropped while writing (see pause_writing)
            return
        if self.h11.our_state is not h11.DONE or self.h11.their_state is not h11.DONE:
            self.finish()  # closing (ours or theirs), or the body was left unread
            return
        self.h11.start_next_cycle()
        self._await_request()

    def _bad_request(self, status: int) -> None:
        self.hub.tally["bad_request"] += 1
        reason = "too_large" if status == 431 else "bad_request"
        phrase = HTTPStatus(status).phrase
        # h11 is in its error state: the answer is written by hand
        self._write(
            f"HTTP/1.1 {status} {phrase}\r\ncontent-type: text/plain\r\n"
            f"content-length: {len(reason)}\r\nconnection: close\r\n\r\n{reason}".encode()
        )
        self.finish()

    # -- timers and closing ----------------------------------------------------------------

    def _await_request(self) -> None:
        self.request, self.body, self.body_size, self.heard = None, bytearray(), 0, False
        self.hub.waiting.pop(self, None)
        self.hub.waiting[self] = None
        self._arm(self.limits.header_timeout, "header_timeout")

    def _arm(self, seconds: float, reason: str) -> None:
        self._disarm()
        self.timer = self.hub.loop.call_later(seconds, self._timed_out, reason)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self, reason: str) -> None:
        # a kept-alive connection with nothing more to ask is routine, not a slow client
        idle = reason == "header_timeout" and self.served and not self.heard
        self.hub.tally["idle" if idle else reason] += 1
        self.drop()

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def finish(self) -> None:
        """Close after what was written is sent."""
        if self.transport is not None and not self.closed:
            self.transport.close()
        self._forget()

    def drop(self) -> None:
        """Close now, discarding whatever is unsent."""
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self._forget()

    def _forget(self) -> None:
        self.closed = True
        self._disarm()
        self.hub.leave(self)


def _head_size(request: h11.Request) -> int:
    return len(request.target) + sum(len(k) + len(v) + 4 for k, v in request.headers)


def _content_length(request: h11.Request) -> int:
    for name, value in request.headers:
        if name == b"content-length":
            return int(value)  # h11 has checked it is a number
    return 0


def fit_to_open_files(limits: Limits) -> Limits:
    """``limits`` this process can keep: the soft limit of open files is raised for
    ``max_connections`` (within the hard limit), or else ``max_connections`` lowered to fit,
    with a warning; without the ``resource`` module (Windows) as they are."""
    try:
        import resource
    except ImportError:
        return limits
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = limits.max_connections + FD_RESERVE
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return limits
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    except (ValueError, OSError):
        pass
    if soft >= needed:
        return limits
    fitted = max(16, soft - FD_RESERVE)
    log.warning(
        "open files are limited to %d (ulimit -n): the server takes %d connections, not %d",
        soft,
        fitted,
        limits.max_connections,
    )
    return replace(limits, max_connections=fitted)


class HttpServer:
    """``site`` on ``host:port`` (0 picks a free port), over TLS with ``tls``.

    Run it on a loop of yours (``await server.open()`` ... ``await server.close()``), or in
    a background thread of its own (:meth:`start` ... :meth:`stop`: tests, or an app that
    embeds it)."""

    def __init__(
        self,
        site: Site,
        host: str = "127.0.0.1",
        port: int = 0,
        limits: Limits | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.site, self.host, self._port = site, host, port
        self.limits = limits or Limits()
        self.tls = tls
        self._hub: _Hub | None = None
        self._listener: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """The server's base URL (``http://host:port`` or ``https://...``)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    async def open(self) -> None:
        """Start listening (on the running loop)."""
        loop = asyncio.get_running_loop()
        self.limits = fit_to_open_files(self.limits)
        hub = _Hub(self.site, self.limits, loop)
        hub.tls = self.tls
        family, _, _, _, address = (
            await loop.getaddrinfo(self.host, self._port, type=socket.SOCK_STREAM)
        )[0]
        listener = socket.create_server(address, family=family, backlog=self.limits.backlog)
        listener.setblocking(False)
        loop.add_reader(listener, hub.accept, listener)
        self._port = int(listener.getsockname()[1])
        self._hub, self._listener = hub, listener
        hub.start()

    async def close(self) -> None:
        """Stop listening, answer the requests being answered, close every connection."""
        if self._listener is not None:
            asyncio.get_running_loop().remove_reader(self._listener)
            self._listener.close()
            self._listener = None
        if self._hub is not None:
            await self._hub.close()

    def start(self) -> HttpServer:
        """Serve from a thread of its own until :meth:`stop`."""
        loop = asyncio.new_event_loop()
        name = f"{self.site.name}-server"
        thread = threading.Thread(target=loop.run_forever, name=name, daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            self._call(self.open)
        except BaseException:
            self._end_thread()
            raise
        return self

    def stop(self) -> None:
        """End what :meth:`start` started."""
        try:
            self._call(self.close)
        finally:
            self._end_thread()

    def stats(self) -> dict[str, Any]:
        """What the server holds now (``open``, ``by_address``, ``waiting``, ``pending``) and
        what it has refused or closed (``tally``), for tests and benchmarks; from
        :meth:`start`'s thread-run server only."""
        assert self._loop is not None and self._hub is not None
        hub = self._hub

        async def snapshot() -> dict[str, Any]:
            return hub.stats()

        return self._call(snapshot)

    def _call(self, coroutine: Callable[[], Coroutine[Any, Any, T]]) -> T:
        assert self._loop is not None
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine(), self._loop)
        return future.result(timeout=DRAIN_S + 10)

    def _end_thread(self) -> None:
        if self._loop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._loop = self._thread = None


def run(server: HttpServer, banner: str) -> None:
    """Serve in the foreground until Ctrl-C or SIGTERM, printing ``banner`` (with the
    server's URL for ``{url}``) once listening."""
    asyncio.run(_serve(server, banner))


async def _serve(server: HttpServer, banner: str) -> None:
    await server.open()
    print(banner.format(url=server.url), flush=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    try:
        await stopping.wait()
    finally:
        await server.close()
