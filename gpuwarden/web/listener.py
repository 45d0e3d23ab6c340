"""The HTTP listener: the one module that knows uvicorn's internals.

gpuwarden serves its ASGI app with uvicorn and changes three things uvicorn has no setting for, by overriding
methods of uvicorn's classes (pyproject pins uvicorn to the range tested; tests/test_web_listener_contract.py fails
in one line when an overridden method or its signature changes):

- ``Server.main_loop``: sleep until a stop signal instead of ticking every 0.1 s (an idle daemon's CPU);
- ``Server.startup``: gpuwarden's accept loop (gpuwarden.web.accept.Listener) instead of asyncio's server: every
  connection counted until closed, within the descriptor budget; with TLS, handshakes only for clients that have sent
  their ClientHello, bounded in number (``max_handshakes``), time (the request head deadline; asyncio's default is
  60 s) and read buffer (asyncio's ``SSLProtocol.max_size``, set to TLS_READ_BUFFER_BYTES);
- ``Server.capture_signals``: SIGINT/SIGTERM stop gracefully and return, SIGHUP reloads the configuration;
- ``HttpToolsProtocol`` (``connection_made``, ``data_received``, ``on_headers_complete``, ``on_response_complete``,
  ``pause_writing``, ``resume_writing``, ``connection_lost``): the head-time, head-size, pipelining and unsent-bytes
  bounds of gpuwarden.web.limits.HttpLimits.
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
from gpuwarden.web.accept import Listener, Slot
from gpuwarden.web.app import DateHeaderMiddleware
from gpuwarden.web.limits import SEND_HIGH_WATER_BYTES, SEND_LOW_WATER_BYTES, HttpLimits

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
    "HttpToolsProtocol.pause_writing": ("self",),
    "HttpToolsProtocol.resume_writing": ("self",),
    "HttpToolsProtocol.connection_lost": ("self", "exc"),
    "HttpToolsProtocol._unset_keepalive_if_required": ("self",),  # called, not overridden
}
#: Calls uvicorn's own code makes that the overrides depend on (``Server._serve`` awaits these), and the instance
#: attributes the protocol subclass reads (set in ``HttpToolsProtocol.__init__``).
CONTRACT_CALLS: dict[str, tuple[str, ...]] = {
    "Server._serve": ("self.startup(sockets=sockets)", "self.main_loop()"),
    "Server.serve": ("self.capture_signals()",),
    "HttpToolsProtocol.__init__": ("self.connections", "self.loop", "self.pipeline"),
    "HttpToolsProtocol.connection_made": ("self.flow = FlowControl(transport)",),
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
        """uvicorn's start-up, with gpuwarden's accept loop (gpuwarden.web.accept.Listener) in place of the server
        asyncio would make: connections within the descriptor budget, and with TLS each handshake only after its
        ClientHello, bounded in number and time, with a TLS_READ_BUFFER_BYTES read buffer."""
        loop = asyncio.get_running_loop()
        limits = self.limits
        if self.config.ssl is not None:
            asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER_BYTES  # read size, and each connection's buffer

        async def listen(factory: Callable[[], asyncio.Protocol], **kwargs: Any) -> Listener:
            listener = Listener(loop, kwargs["sock"], factory, limits, kwargs.get("ssl"))
            listener.start()
            return listener

        loop.create_server = listen  # type: ignore[method-assign,assignment]
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
#: for every TLS connection): what one read from the socket takes. A request is a few hundred bytes; a TLS record
#: longer than this (at most 16 KiB and its overhead) takes more than one read, the TLS layer joining them.
TLS_READ_BUFFER_BYTES = 4 * 1024


_431_BODY = b"request line and headers too large\n"
_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: " + str(len(_431_BODY)).encode() + b"\r\nconnection: close\r\n\r\n" + _431_BODY
)


def bounded_protocol(limits: HttpLimits) -> type[HttpToolsProtocol]:
    """Return a subclass of uvicorn's HttpToolsProtocol enforcing ``limits`` (for ``uvicorn.Config(http=...)``)."""

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol with head-time, head-size, pipelining and unsent-bytes bounds
        (gpuwarden.web.limits); its place under the connection cap (``slot``) is given back when it closes."""

        _head_bytes = 0
        _head_timer: asyncio.TimerHandle | None = None
        _send_timer: asyncio.TimerHandle | None = None
        _deferred = False  # a response written but not yet taken by the client: what follows it waits
        slot: Slot | None = None
        raw_transport: asyncio.Transport | None = None  # the TCP transport under a TLS one (counted as unsent too)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            # asyncio pauses a writer past 64 KiB on a socket and 512 KiB on TLS, after a write of any size
            transport.set_write_buffer_limits(SEND_HIGH_WATER_BYTES, SEND_LOW_WATER_BYTES)
            self._await_head(limits.head_timeout)
            if self.slot is not None:
                self.slot.listener.waiting()  # evictable now: a listener paused at the cap may accept again

        def _await_head(self, seconds: float) -> None:
            self._head_bytes = 0
            limits.pending[self] = time.monotonic()
            self._cancel_head_timer()
            self._head_timer = self.loop.call_later(seconds, self._head_timed_out)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def close_pending(self) -> bool | None:
            """Close this connection, waiting for a request head, to make room: False (its descriptor is free once
            the transport has closed), None when it was closing already."""
            limits.pending.pop(self, None)
            self._cancel_head_timer()
            if self.transport.is_closing():
                return None
            self.transport.abort()
            return False

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self in limits.pending:
                limits.counts["head_timeout"] += 1
                self.close_pending()

        def data_received(self, data: bytes) -> None:
            pending = self in limits.pending
            if pending and self._head_bytes == 0 and limits.keep_alive != limits.head_timeout:
                self._await_head(limits.head_timeout)  # a request began: its head has the head deadline
            # every byte from the start of a request's head until its answer is complete counts: while a request is
            # in flight (its answer waits for the client, or its password for its turn), what arrives is the next
            # pipelined request's head, which uvicorn parses at once, each header into a list (every route is a GET:
            # no body to tell apart)
            self._head_bytes += len(data)
            if self._head_bytes > limits.max_head_bytes:
                limits.counts["head_too_large"] += 1
                limits.pending.pop(self, None)
                self._cancel_head_timer()
                if pending:
                    self.transport.write(_431)
                    self.transport.close()
                else:  # an answer is being written: nothing can follow it on this connection
                    self.pipeline.clear()
                    self.transport.abort()
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
            if self.flow.write_paused and not self.transport.is_closing():
                # the answer waits for the client: the next pipelined request, and reading more, wait with it
                self._deferred = True
                return
            super().on_response_complete()
            if not self.transport.is_closing():
                self._await_head(limits.keep_alive)  # idle until the next request (keep-alive)

        def unsent(self) -> int:
            """Bytes written for this client and not yet taken by its socket (the TLS layer's and the TCP
            transport's buffers)."""
            raw = self.raw_transport
            return self.transport.get_write_buffer_size() + (0 if raw is None else raw.get_write_buffer_size())

        def pause_writing(self) -> None:
            super().pause_writing()
            if self not in limits.stalled:
                limits.stalled[self] = time.monotonic()
                self._send_timer = self.loop.call_later(limits.send_timeout, self._send_timed_out)
            limits.keep_unsent_within_budget()

        def resume_writing(self) -> None:
            super().resume_writing()
            self._unstall()
            if self._deferred:
                self._deferred = False
                self.on_response_complete()

        def _unstall(self) -> None:
            limits.stalled.pop(self, None)
            if self._send_timer is not None:
                self._send_timer.cancel()
                self._send_timer = None

        def _send_timed_out(self) -> None:
            self._send_timer = None
            if limits.stalled.pop(self, None) is not None:
                limits.counts["send_timeout"] += 1
                self.transport.abort()

        def close_stalled(self) -> None:
            """Close this connection, whose client does not take its answer (the unsent-bytes budget is spent)."""
            self._unstall()
            self.transport.abort()

        def connection_lost(self, exc: Exception | None) -> None:
            limits.pending.pop(self, None)
            self._cancel_head_timer()
            self._unstall()
            super().connection_lost(exc)
            # uvicorn cancels its keep-alive timer only on a clean close: after a reset the timer held the protocol,
            # its TLS state and its buffers for the keep-alive timeout (66 KB a TLS connection for 120 s)
            self._unset_keepalive_if_required()
            if self.slot is not None:
                self.slot.release()

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
