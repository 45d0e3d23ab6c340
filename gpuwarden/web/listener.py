"""The HTTP listener: the one module that knows uvicorn's internals.

gpuwarden serves its ASGI app with uvicorn and changes three things uvicorn has no setting for, by overriding
methods of uvicorn's classes (pyproject pins uvicorn to the range tested; tests/test_web_listener_contract.py fails
in one line when an overridden method or its signature changes):

- ``Server.main_loop``: sleep until a stop signal instead of ticking every 0.1 s (an idle daemon's CPU);
- ``Server.startup``: with TLS, a plain TCP listener whose connections handshake through ``TlsAcceptor``: bounded
  in number (``max_handshakes``), time (the request head deadline; asyncio's default is 60 s) and read buffer
  (asyncio's ``SSLProtocol.max_size``, set to TLS_READ_BUFFER_BYTES);
- ``Server.capture_signals``: SIGINT/SIGTERM stop gracefully and return, SIGHUP reloads the configuration;
- ``HttpToolsProtocol`` (``connection_made``, ``data_received``, ``on_headers_complete``, ``on_response_complete``,
  ``connection_lost``): the connection, head-time, head-size and pipelining bounds of
  gpuwarden.web.limits.HttpLimits.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gpuwarden.logs import RateLimitFilter
from gpuwarden.web.app import DateHeaderMiddleware
from gpuwarden.web.limits import FLOOD_CONNECTIONS, HttpLimits, give_back_memory

#: What of uvicorn this module relies on: each overridden method (or one it calls) and its parameter names, and the
#: attributes it reads. tests/test_web_listener_contract.py checks the installed uvicorn against it.
CONTRACT: dict[str, tuple[str, ...]] = {
    "Server.main_loop": ("self",),
    "Server.startup": ("self", "sockets"),
    "Server.capture_signals": ("self",),
    "Server.on_tick": ("self", "counter"),
    "Server.run": ("self", "sockets"),
    "HttpToolsProtocol.connection_made": ("self", "transport"),
    "HttpToolsProtocol.data_received": ("self", "data"),
    "HttpToolsProtocol.on_headers_complete": ("self",),
    "HttpToolsProtocol.on_response_complete": ("self",),
    "HttpToolsProtocol.connection_lost": ("self", "exc"),
}
#: Calls uvicorn's own code makes that the overrides depend on (``Server._serve`` awaits these), and the instance
#: attributes the protocol subclass reads (set in ``HttpToolsProtocol.__init__``).
CONTRACT_CALLS: dict[str, tuple[str, ...]] = {
    "Server._serve": ("self.startup(sockets=sockets)", "self.main_loop()"),
    "Server.serve": ("self.capture_signals()",),
    "HttpToolsProtocol.__init__": ("self.connections", "self.loop", "self.pipeline"),
}


class StartupError(Exception):
    """The daemon cannot start (cannot bind its address); the message is one line for the operator."""


def bind(listen_address: str, host: str, port: int) -> socket.socket:
    """Return a listening socket on ``host``:``port`` (``listen_address`` as the operator wrote it, for errors).
    Raises StartupError with one line when it cannot bind."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(f"cannot listen on {listen_address}: {exc.strerror}") from exc
    except UnicodeError as exc:  # a host name label over 63 characters, or not encodable (IDNA)
        raise StartupError(f"cannot listen on {listen_address}: not a valid host name") from exc
    family, stype, proto, _, addr = infos[0]
    sock = socket.socket(family, stype, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {listen_address}: {exc.strerror or exc}") from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


#: The housekeeping loop looks at ``should_exit`` at least this often even when no signal woke it.
EXIT_CHECK_SECONDS = 30.0


class Server(uvicorn.Server):
    """uvicorn's server with gpuwarden's signal handling.

    SIGINT/SIGTERM stop the server gracefully and let ``serve`` return (so the poller stops and NVML is shut
    down) instead of uvicorn's default of re-raising the signal, which would kill the process before cleanup.
    SIGHUP calls ``on_hup`` (configuration reload).
    """

    def __init__(
        self,
        config: uvicorn.Config,
        on_hup: Callable[[], object] | None,
        on_ready: Callable[[], object] | None = None,
        hup_pending: threading.Event | None = None,
    ) -> None:
        super().__init__(config)
        self.limits = HttpLimits()
        self._on_hup = on_hup
        self._on_ready = on_ready
        self._hup_pending = hup_pending
        self._loop: asyncio.AbstractEventLoop | None = None
        self._exit: asyncio.Event | None = None

    async def main_loop(self) -> None:
        """uvicorn's housekeeping loop, asleep until a stop signal wakes it.

        uvicorn ticks every 0.1 s to refresh its date header and to see a stop; each wake-up of the event loop
        costs CPU (a tenth of an idle daemon's at one tick a second: docs/performance.md). The daemon runs uvicorn
        with its date header off (server.DateHeaderMiddleware writes it) and the signal handlers wake this loop, so
        it waits for the stop instead of polling for it (looking anyway every EXIT_CHECK_SECONDS, should anything
        else set ``should_exit``).
        """
        self._loop = asyncio.get_running_loop()
        self._exit = asyncio.Event()
        if await self.on_tick(0):  # sets uvicorn's default headers
            return
        # listening, and SIGHUP handled by capture_signals: now ready; a SIGHUP that came before is applied now
        if self._on_ready is not None:
            self._on_ready()
        if self._hup_pending is not None and self._hup_pending.is_set() and self._on_hup is not None:
            self._hup_pending.clear()
            threading.Thread(target=self._on_hup, name="gpuwarden-reload", daemon=True).start()
        while not self.should_exit:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit.wait(), EXIT_CHECK_SECONDS)
        await self.on_tick(0)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start-up; with TLS, the listener accepts plain TCP and each connection does its handshake
        through TlsAcceptor (bounded in number, time and memory) instead of asyncio's own TLS accept, which gives
        every accepted socket a TLS state and a 256 KiB buffer before anything bounds it."""
        loop = asyncio.get_running_loop()
        if self.config.ssl is None:
            await super().startup(sockets)
            return
        create = loop.create_server
        limits = self.limits
        asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER_BYTES  # read size, and each connection's buffer

        def plain_server(factory: Callable[[], asyncio.Protocol], *args: Any, **kwargs: Any) -> Any:
            context = kwargs.pop("ssl")
            return create(lambda: TlsAcceptor(factory, context, limits), *args, **kwargs)

        loop.create_server = plain_server  # type: ignore[method-assign,assignment]
        try:
            await super().startup(sockets)
        finally:
            del loop.create_server  # the instance attribute: back to the loop's own method

    def _wake(self) -> None:
        if self._loop is not None and self._exit is not None:
            self._loop.call_soon_threadsafe(self._exit.set)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """In the main thread: SIGINT/SIGTERM stop the server (a second SIGINT forces), SIGHUP runs ``on_hup`` in a
        thread; the previous handlers are restored on exit."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def stop(sig: int, frame: Any) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True
            self._wake()

        def hup(sig: int, frame: Any) -> None:
            if self._on_hup is not None:
                threading.Thread(target=self._on_hup, name="gpuwarden-reload", daemon=True).start()

        originals = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        originals[signal.SIGHUP] = signal.signal(signal.SIGHUP, hup)
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)


#: The TLS read buffer of each connection (asyncio's ``SSLProtocol.max_size``, 256 KiB by default, allocated whole
#: for every TLS connection): a TLS record is at most 16 KiB and 2 KiB of overhead; a longer read takes two.
TLS_READ_BUFFER_BYTES = 32 * 1024


class TlsAcceptor(asyncio.Protocol):
    """The first protocol of a TLS connection: holds the accepted TCP connection (not reading) until a handshake
    slot is free, runs the handshake (``loop.start_tls``, within ``limits.head_timeout``), then hands the TLS
    transport to the HTTP protocol ``factory`` makes (uvicorn's, with gpuwarden's bounds).

    At most ``limits.max_handshakes`` connections hold TLS state before their handshake is done; a new connection
    past that closes the one that has waited longest (an idle or slow client), as the connection cap does for
    request heads. A TLS connection costs its TLS state only once it handshakes; the TLS read buffer is
    TLS_READ_BUFFER_BYTES (asyncio's default, 256 KiB per connection, was what a flood of idle connections
    multiplied).
    """

    def __init__(self, factory: Callable[[], asyncio.Protocol], context: Any, limits: HttpLimits) -> None:
        self.factory, self.context, self.limits = factory, context, limits
        self.transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Hold the connection unread; start its handshake, closing the oldest unfinished one past the bound."""
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.pause_reading()  # the ClientHello stays in the socket for the TLS layer
        handshaking = self.limits.handshaking
        while len(handshaking) >= self.limits.max_handshakes:
            oldest, _ = handshaking.popitem(last=False)
            self.limits.counts["handshake_evicted"] += 1
            oldest.abort()
        handshaking[self] = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._handshake(transport))

    async def _handshake(self, transport: asyncio.Transport) -> None:
        held = _Held()  # asyncio passes on what follows the handshake before start_tls returns: held until then
        try:
            tls = await asyncio.get_running_loop().start_tls(
                transport, held, self.context, server_side=True, ssl_handshake_timeout=self.limits.head_timeout
            )
        except (Exception, asyncio.CancelledError):  # a failed, timed-out or closed handshake: that connection only
            self.limits.counts["handshake_failed"] += 1
            transport.abort()
            return
        finally:
            self.limits.handshaking.pop(self, None)
        if tls is None or tls.is_closing():
            return
        protocol = self.factory()
        protocol.connection_made(tls)
        if tls.is_closing():  # refused by the connection cap
            return
        tls.set_protocol(protocol)
        for chunk in held.data:
            protocol.data_received(chunk)
        if held.eof:
            protocol.eof_received()
        if held.lost:
            protocol.connection_lost(held.error)

    def abort(self) -> None:
        """Close the connection before its handshake is done."""
        self.limits.handshaking.pop(self, None)
        if self._task is not None:
            self._task.cancel()
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        """The client left before the handshake began: forget it."""
        self.limits.handshaking.pop(self, None)
        if self._task is not None:
            self._task.cancel()


class _Held(asyncio.Protocol):
    """What a TLS connection delivers between its handshake and the HTTP protocol taking it over."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.eof = self.lost = False
        self.error: Exception | None = None

    def data_received(self, data: bytes) -> None:
        """Keep ``data`` for the HTTP protocol."""
        self.data.append(data)

    def eof_received(self) -> bool:
        """Note the end of the client's data; keep the connection open for the answer."""
        self.eof = True
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        """Note that the connection ended."""
        self.lost, self.error = True, exc


_431_BODY = b"request line and headers too large\n"
_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: " + str(len(_431_BODY)).encode() + b"\r\nconnection: close\r\n\r\n" + _431_BODY
)


def bounded_protocol(limits: HttpLimits) -> type[HttpToolsProtocol]:
    """Return a subclass of uvicorn's HttpToolsProtocol enforcing ``limits`` (for ``uvicorn.Config(http=...)``)."""

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol with connection, head-time and head-size bounds (gpuwarden.web.limits)."""

        _head_bytes = 0
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= limits.max_connections and not self._evict():
                limits.counts["refused"] += 1
                transport.abort()
                return
            super().connection_made(transport)
            self._await_head(limits.head_timeout)

        def _evict(self) -> bool:
            while limits.pending:
                oldest, _ = limits.pending.popitem(last=False)
                if oldest.transport is not None and not oldest.transport.is_closing():
                    limits.counts["evicted"] += 1
                    oldest._close_pending()
                    return True
            return False

        def _await_head(self, seconds: float) -> None:
            self._head_bytes = 0
            limits.pending[self] = time.monotonic()
            self._cancel_head_timer()
            self._head_timer = self.loop.call_later(seconds, self._head_timed_out)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _close_pending(self) -> None:
            limits.pending.pop(self, None)
            self._cancel_head_timer()
            self.transport.abort()

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self in limits.pending:
                limits.counts["head_timeout"] += 1
                self._close_pending()

        def data_received(self, data: bytes) -> None:
            if self in limits.pending:
                if self._head_bytes == 0 and limits.keep_alive != limits.head_timeout:
                    self._await_head(limits.head_timeout)  # a request began: its head has the head deadline
                self._head_bytes += len(data)
                if self._head_bytes > limits.max_head_bytes:
                    limits.counts["head_too_large"] += 1
                    limits.pending.pop(self, None)
                    self._cancel_head_timer()
                    self.transport.write(_431)
                    self.transport.close()
                    return
            super().data_received(data)
            if len(self.pipeline) > limits.max_pipelined and not self.transport.is_closing():
                # uvicorn queues every pipelined request of a read (a 64 KiB read holds ~1,800 small ones, each a
                # few KiB queued): a client that sends more than max_pipelined ahead of its answers is closed
                limits.counts["pipeline_too_deep"] += 1
                self.pipeline.clear()
                self.transport.abort()

        def on_headers_complete(self) -> None:
            limits.pending.pop(self, None)
            self._cancel_head_timer()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._await_head(limits.keep_alive)  # idle until the next request (keep-alive)

        def connection_lost(self, exc: Exception | None) -> None:
            limits.pending.pop(self, None)
            self._cancel_head_timer()
            if self.transport is not None:
                super().connection_lost(exc)
            limits.peak = max(limits.peak, len(self.connections) + 1)
            if not self.connections and not limits.handshaking and limits.peak >= FLOOD_CONNECTIONS:
                limits.peak = 0  # the flood is over: give its memory back (after the loop has freed its transports)
                self.loop.call_later(1.0, give_back_memory)

    return BoundedHttpToolsProtocol


def serve(
    app: Any,
    sock: socket.socket,
    limits: HttpLimits,
    log_level: str,
    on_hup: Callable[[], object] | None,
    on_ready: Callable[[], object] | None = None,
    hup_pending: threading.Event | None = None,
    uvicorn_kwargs: dict[str, Any] | None = None,
) -> None:
    """Serve the ASGI ``app`` on the listening ``sock`` until SIGINT/SIGTERM, within ``limits``.

    The Date header is written by ``DateHeaderMiddleware`` (so the housekeeping loop can sleep), uvicorn's records
    go through the daemon's log (gpuwarden.logs), access lines only at ``debug``. ``on_hup`` runs in a thread on
    each SIGHUP (and once at start when ``hup_pending`` is set), ``on_ready`` once the server listens with its
    signal handlers in place. ``uvicorn_kwargs`` adds TLS settings and headers (gpuwarden.web.config).
    """
    for name in ("asyncio", "uvicorn.error"):  # the accept loop at the descriptor limit logs on every retry
        logging.getLogger(name).addFilter(RateLimitFilter(level=logging.WARNING))  # start-up, shutdown lines pass
    config = uvicorn.Config(
        DateHeaderMiddleware(app),
        date_header=False,
        log_config=None,
        log_level=log_level,
        access_log=log_level == "debug",
        timeout_keep_alive=max(1, round(limits.keep_alive)),
        backlog=limits.backlog,
        # uvicorn's httptools protocol (faster than h11, docs/performance.md) with the bounds it lacks
        http=bounded_protocol(limits),
        **(uvicorn_kwargs or {}),
    )
    server = Server(config, on_hup, on_ready=on_ready, hup_pending=hup_pending)
    server.limits = limits
    server.run(sockets=[sock])
