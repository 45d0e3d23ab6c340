"""The HTTP server: gpuwarden's accept loop (accept) and connections (connection) on one
asyncio loop, serving the ASGI app until SIGINT/SIGTERM, reloading on SIGHUP.

gpuwarden owns its HTTP server outright: every byte a client sends is held to a bound of limits in
whatever state its connection is (accepting, TLS handshake, request head, body, answer in flight, keep-alive), with
h11 parsing HTTP/1.1 and Python's ``ssl`` (over memory buffers) doing TLS, and no reach into the internals of a
server library or of asyncio's TLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpuwarden.logs import RateLimitFilter
from gpuwarden.web.server.accept import Listener, Slot
from gpuwarden.web.server.connection import Connection
from gpuwarden.web.server.limits import HttpLimits

log = logging.getLogger("gpuwarden.web")

#: On SIGINT/SIGTERM, the requests clients have sent (or may have sent: a connection accepted, a TLS handshake begun)
#: get this many seconds to be answered; then every connection is closed.
SHUTDOWN_GRACE_SECONDS = 3.0


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


class Server:
    """Serves the ASGI ``app`` (the server writes each answer's ``Date`` and cuts its body in parts) within ``limits``,
    over TLS from ``tls`` (an SSLContext) when given, adding ``headers`` (name, value bytes) to every answer.

    ``run`` (or ``serve``) returns after SIGINT/SIGTERM (when run in the main thread) or ``stop()``: the listener
    closes (``Listener.close``), connections kept alive between requests close, every other connection gets
    SHUTDOWN_GRACE_SECONDS to answer the request it holds or is about to get (``Connection.shut_down``), a second
    SIGINT closes everything at once. SIGHUP runs
    ``on_hup`` in a thread (and once at start when ``hup_pending`` is set); ``on_ready`` runs once the server accepts
    with its signal handlers in place, and ``started`` is set then.
    """

    def __init__(
        self,
        app: Any,
        limits: HttpLimits,
        tls: ssl.SSLContext | None = None,
        headers: Sequence[tuple[bytes, bytes]] = (),
        on_hup: Callable[[], object] | None = None,
        on_ready: Callable[[], object] | None = None,
        hup_pending: threading.Event | None = None,
    ) -> None:
        self.app, self.limits, self.tls, self.headers = app, limits, tls, list(headers)
        self._on_hup, self._on_ready, self._hup_pending = on_hup, on_ready, hup_pending
        self.started = threading.Event()
        self.listener: Listener | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._force = False

    def run(self, sock: socket.socket) -> None:
        """Serve on the listening ``sock`` in a new event loop until stopped."""
        asyncio.run(self.serve(sock))

    async def serve(self, sock: socket.socket) -> None:
        """Serve on the listening ``sock`` in the running loop until stopped; then close every connection."""
        loop = asyncio.get_running_loop()
        self._loop, self._stop = loop, asyncio.Event()
        listener = self.listener = Listener(loop, sock, self._connection, self.limits, tls=self.tls is not None)
        originals = self._capture_signals(loop)
        try:
            listener.start()
            self.started.set()
            if self._on_ready is not None:
                self._on_ready()
            if self._hup_pending is not None and self._hup_pending.is_set():
                self._hup_pending.clear()
                self._hup()
            await self._stop.wait()
            log.info("shutting down")
            listener.close()
            for conn in list(listener.connections):
                conn.shut_down()
            deadline = time.monotonic() + SHUTDOWN_GRACE_SECONDS
            while listener.serving and not self._force and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            listener.abort()
            await asyncio.sleep(0)  # the transports' connection_lost
        finally:
            for sig, handler in originals.items():
                loop.remove_signal_handler(sig)
                signal.signal(sig, handler)
            log.info("stopped")

    def stop(self) -> None:
        """Stop serving (from any thread); a second call closes answers in flight at once. Once stopped, nothing."""
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: stopped already
                self._loop.call_soon_threadsafe(self._stop_now)

    def _stop_now(self) -> None:
        assert self._stop is not None
        if self._stop.is_set():
            self._force = True
        self._stop.set()

    def _connection(self, slot: Slot, source: str, deadline: float) -> Connection:
        return Connection(self.app, slot, source, self.headers, self.tls, deadline)

    def _hup(self) -> None:
        if self._on_hup is not None:
            threading.Thread(target=self._on_hup, name="gpuwarden-reload", daemon=True).start()

    def _capture_signals(self, loop: asyncio.AbstractEventLoop) -> dict[int, Any]:
        """In the main thread: SIGINT/SIGTERM stop, SIGHUP reloads; return the handlers to put back."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        originals: dict[int, Any] = {
            sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        }
        loop.add_signal_handler(signal.SIGINT, self._stop_now)
        loop.add_signal_handler(signal.SIGTERM, self._stop_now)
        loop.add_signal_handler(signal.SIGHUP, self._hup)
        return originals


def serve(
    app: Any,
    sock: socket.socket,
    limits: HttpLimits,
    on_hup: Callable[[], object] | None,
    on_ready: Callable[[], object] | None = None,
    hup_pending: threading.Event | None = None,
    tls: ssl.SSLContext | None = None,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Serve the ASGI ``app`` on the listening ``sock`` until SIGINT/SIGTERM, within ``limits`` (``Server``
    says what each argument does). The accept loop's and asyncio's warnings go through a rate-limited filter (at the
    descriptor limit the loop would log on every retry)."""
    for name in ("asyncio", "gpuwarden.web"):
        logging.getLogger(name).addFilter(RateLimitFilter(level=logging.WARNING))
    Server(app, limits, tls, headers, on_hup, on_ready, hup_pending).run(sock)
