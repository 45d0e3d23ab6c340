"""One connection of the HTTP port, owned whole: its TLS, its HTTP/1.1 parsing (h11) and the ASGI calls of its
requests, with every byte a client sends counted against a bound in whatever state the connection is.

- **TLS** runs in the connection (``ssl.SSLContext.wrap_bio``: OpenSSL over two memory buffers), so the only buffers
  a TLS connection holds are what its socket delivered in one read and what waits to be written; the handshake holds
  a handshake slot (accept.Listener.admit) until it ends, by ``deadline`` at the latest.
- **HTTP/1.1** is h11's: a request line and headers longer than ``max_head_bytes`` are refused by h11's
  ``max_incomplete_event_size`` (431), any other malformed head gets h11's 400, and the connection is closed. While a
  request is in flight, what the client sends next is not parsed: reading from the socket stops at the first bytes of
  it (``pause_reading``) and resumes once the answer is out, so a client pipelining ahead of its answers holds at most
  one read of the socket (SOCKET_BUFFER_BYTES) whatever it sends.
- **Bodies**: a request body (no route takes one) is read up to ``max_head_bytes``, past it 413 and the connection
  closed.
- **Deadlines**: until its request is complete (head and body) a connection is *pending*
  (``HttpLimits.pending``: closed at the head deadline, or first at the connection cap); after an answer it is pending
  again with the keep-alive deadline, switched to the head deadline once the next request's first byte has come.
- **Answers** go to the socket's write buffer, which pauses the app (its ``send`` waits) past SEND_HIGH_WATER_BYTES;
  a paused connection is *stalled* (``HttpLimits.stalled``): closed after ``send_timeout``, or, when the bytes waiting
  on all stalled connections pass ``max_unsent_bytes``, the one waiting longest first.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Sequence
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import h11

from gpuwarden.web.server.limits import ANSWER_PART_BYTES, SEND_HIGH_WATER_BYTES, SEND_LOW_WATER_BYTES

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message

    from gpuwarden.web.server.accept import Slot

log = logging.getLogger("gpuwarden.web")
#: One line a request (at ``debug`` only: gpuwarden.logs).
access_log = logging.getLogger("gpuwarden.access")

#: Plain text taken out of TLS per call (a TLS record holds at most 16 KiB).
_TLS_READ_BYTES = 16 * 1024
_REFUSAL_BODIES = {
    413: b"request body too large\n",
    431: b"request line and headers too large\n",
}


def _refusal(request: h11.Request) -> int:
    """The status a request is refused with before it is read further (0: none): 505 for an HTTP version other than
    1.0 and 1.1 (h11 parses any), 400 for a request with both Content-Length and Transfer-Encoding (RFC 9112, 6.3: a
    server may refuse it, and must close after answering it; a way to smuggle a request past a proxy)."""
    if request.http_version not in (b"1.0", b"1.1"):
        return 505
    names = {name for name, _ in request.headers}
    return 400 if b"content-length" in names and b"transfer-encoding" in names else 0


def _reason(status: int) -> bytes:
    """The reason phrase of ``status`` (RFC 9110's), empty for a code it does not name."""
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""


class Connection(asyncio.Protocol):
    """One accepted connection holding ``slot`` (its place under the connection cap, given back when it closes),
    served by the ASGI ``app``; over TLS from ``tls`` (an SSLContext) when given, whose handshake must end by
    ``deadline`` (time.monotonic()). ``source`` is the client's address, ``headers`` extra response headers (names and
    values as bytes), ``scheme`` the scheme the app sees."""

    def __init__(
        self,
        app: ASGIApp,
        slot: Slot,
        source: str,
        headers: Sequence[tuple[bytes, bytes]] = (),
        tls: ssl.SSLContext | None = None,
        deadline: float = 0.0,
    ) -> None:
        self.app, self.slot, self.source, self.extra_headers = app, slot, source, list(headers)
        self.listener = slot.listener
        self.limits = self.listener.limits
        self.loop = self.listener.loop
        self.transport: asyncio.Transport | None = None
        self._context, self._deadline = tls, deadline
        self._tls: ssl.SSLObject | None = None
        self._incoming: ssl.MemoryBIO | None = None
        self._outgoing: ssl.MemoryBIO | None = None
        self.handshaking = False
        self._http = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_head_bytes)
        self._request: h11.Request | None = None
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None  # the head, keep-alive or handshake deadline
        self._send_timer: asyncio.TimerHandle | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._gone = asyncio.Event()
        self._reading = True
        self._head_begun = False
        self.closing_after_answer = False  # the server is stopping: close once the answer in flight is out
        self._kept_alive = False  # an answer went out and the connection waits for the next request

    # -- the transport's calls -------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Take the connection: small write-buffer marks; a TLS handshake through a slot, or wait for a request."""
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(SEND_HIGH_WATER_BYTES, SEND_LOW_WATER_BYTES)
        self.listener.connections.add(self)
        self.closing_after_answer = self.listener.closed  # accepted as the server stopped: one answer, then closed
        if self._context is None:
            self._await_head(self.limits.head_timeout)
            self.listener.waiting()
            return
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = self._context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self.handshaking = True
        self.listener.admit(self)
        self._timer = self.loop.call_later(max(0.1, self._deadline - time.monotonic()), self._handshake_timed_out)

    def data_received(self, data: bytes) -> None:
        """Bytes from the socket: through TLS when it is on, then to the HTTP parser."""
        if self._tls is None:
            self._feed(data)
            return
        assert self._incoming is not None
        self._incoming.write(data)
        if self.handshaking and not self._handshake():
            return
        plain: list[bytes] = []
        ended = False
        while True:
            try:
                chunk = self._tls.read(_TLS_READ_BYTES)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # the client's close_notify
                ended = True
                break
            except ssl.SSLError:
                self._abort()
                return
            if not chunk:
                ended = True
                break
            plain.append(chunk)
        self._flush_tls()
        if plain:
            self._feed(b"".join(plain))
        if ended:
            self.eof_received()

    def eof_received(self) -> bool:
        """The client will send nothing more: an answer in flight is still written, then the connection closes."""
        if self.transport is not None and not self.transport.is_closing() and self._http.their_state != h11.CLOSED:
            self._http.receive_data(b"")
            if self._task is None:
                self._next()
        return True

    def pause_writing(self) -> None:
        """The write buffer is past its high mark: the app's ``send`` waits; the connection is stalled."""
        self._writable.clear()
        limits = self.limits
        if self not in limits.stalled:
            limits.stalled[self] = time.monotonic()
            self._send_timer = self.loop.call_later(limits.send_timeout, self._send_timed_out)
        limits.keep_unsent_within_budget()

    def resume_writing(self) -> None:
        """The write buffer is below its low mark: the app may send again."""
        self._unstall()
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection is gone: leave every list, wake a waiting app (its sends are dropped), give the place
        back."""
        limits = self.limits
        limits.pending.pop(self, None)
        limits.handshaking.pop(self, None)
        self._cancel_timer()
        self._unstall()
        self._gone.set()
        self._writable.set()
        self.listener.connections.discard(self)
        self.slot.release()

    # -- what the limits and the listener call ---------------------------------------------------------------------

    def unsent(self) -> int:
        """Bytes written for this client and not yet taken by its socket."""
        return 0 if self.transport is None else self.transport.get_write_buffer_size()

    def close_pending(self) -> bool | None:
        """Close this connection, waiting for a request, to make room: False (its descriptor is free once the
        transport has closed), None when it was closing already."""
        self.limits.pending.pop(self, None)
        self._cancel_timer()
        if self.transport is None or self.transport.is_closing():
            return None
        self.transport.abort()
        return False

    def close_stalled(self) -> None:
        """Close this connection, whose client does not take its answer."""
        self._unstall()
        self._abort()

    def abort(self) -> None:
        """Close this connection now (a handshake evicted for another)."""
        self.limits.handshaking.pop(self, None)
        self._abort()

    def shut_down(self) -> None:
        """The server stops: a connection kept alive between requests, with nothing of the next one come, closes now
        (a client sending on it then retries: RFC 9112, 9.3.1); any other answers one more request, the one in
        flight, begun or (on a connection that has had none yet, its TLS handshake included) about to come, with
        ``Connection: close``, and closes once it is out."""
        self.closing_after_answer = True
        if self._task is None and self._kept_alive and not self._head_begun:
            self._close()

    # -- TLS ---------------------------------------------------------------------------------------------------------

    def _handshake(self) -> bool:
        """Advance the handshake with what has arrived; True once it is done."""
        assert self._tls is not None
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            self._flush_tls()
            return False
        except ssl.SSLError:  # refused: a bad ClientHello, no shared version, a client certificate that fails
            self.limits.counts["handshake_failed"] += 1
            self.limits.handshaking.pop(self, None)
            self._flush_tls()  # the alert
            self._cancel_timer()
            if self.transport is not None:
                self.transport.close()
            return False
        self._flush_tls()
        self.handshaking = False
        self.limits.handshaking.pop(self, None)
        self._await_head(self.limits.head_timeout)
        self.listener.waiting()
        return True

    def _handshake_timed_out(self) -> None:
        self._timer = None
        if self.handshaking:
            self.limits.counts["handshake_failed"] += 1
            self.abort()

    def _flush_tls(self) -> None:
        if self._outgoing is not None and self._outgoing.pending and self.transport is not None:
            self.transport.write(self._outgoing.read())

    def _write(self, data: bytes) -> None:
        if not data or self.transport is None or self.transport.is_closing():
            return
        if self._tls is None:
            self.transport.write(data)
            return
        view = memoryview(data)
        while view:
            view = view[self._tls.write(view) :]
        self._flush_tls()

    # -- HTTP --------------------------------------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing() or self._http.their_state == h11.CLOSED:
            return
        if not self._head_begun and self in self.limits.pending:
            self._head_begun = True  # a request began: its head has the head deadline
            if self.limits.keep_alive != self.limits.head_timeout:
                self._await_head(self.limits.head_timeout)
        self._http.receive_data(data)
        if self._task is None:
            self._next()
        else:
            self._pause_reading()  # the next request waits for this one's answer, unread

    def _next(self) -> None:
        """Parse what has arrived, up to a whole request (then the app runs) or the need for more bytes."""
        while self._task is None and self.transport is not None and not self.transport.is_closing():
            try:
                event = self._http.next_event()
            except h11.RemoteProtocolError as exc:
                self._refuse(exc.error_status_hint)
                return
            if event is h11.NEED_DATA:
                self._resume_reading()
                return
            if event is h11.PAUSED:
                self._pause_reading()
                return
            if isinstance(event, h11.Request):
                refusal = _refusal(event)
                if refusal:
                    self._refuse(refusal)
                    return
                self._request, self._body, self._body_bytes = event, [], 0
                if self._http.they_are_waiting_for_100_continue:
                    self._write(self._http.send(h11.InformationalResponse(status_code=100, headers=[])))
            elif isinstance(event, h11.Data):
                self._body_bytes += len(event.data)
                if self._body_bytes > self.limits.max_head_bytes:
                    self._refuse(413)
                    return
                self._body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                self._start()
            else:  # ConnectionClosed: the client left between requests
                self._close()
                return

    def _refuse(self, status: int) -> None:
        """Answer ``status`` (4xx, 500, 505) and close."""
        if status == 431:
            self.limits.counts["head_too_large"] += 1
        body = _REFUSAL_BODIES.get(status) or _reason(status).lower() + b"\n"
        headers = [
            ("content-type", "text/plain; charset=utf-8"),
            ("content-length", str(len(body))),
            ("connection", "close"),
        ]
        try:
            self._write(self._http.send(h11.Response(status_code=status, headers=headers, reason=_reason(status))))
            self._write(self._http.send(h11.Data(data=body)) + (self._http.send(h11.EndOfMessage()) or b""))
        except h11.LocalProtocolError:  # an answer had begun already: nothing can follow it
            self._abort()
            return
        self._close()

    def _start(self) -> None:
        request = self._request
        assert request is not None and self.transport is not None
        self.limits.pending.pop(self, None)
        self._cancel_timer()
        raw_path, _, query = bytes(request.target).partition(b"?")
        sockname = self.transport.get_extra_info("sockname")
        peername = self.transport.get_extra_info("peername")
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.http_version.decode("ascii"),
            "server": tuple(sockname[:2]) if isinstance(sockname, tuple) else None,
            "client": tuple(peername[:2]) if isinstance(peername, tuple) else None,
            "scheme": "http" if self._tls is None else "https",
            "method": request.method.decode("ascii"),
            "root_path": "",
            "path": unquote(raw_path.decode("latin-1")),
            "raw_path": raw_path,
            "query_string": query,
            "headers": [(bytes(name), bytes(value)) for name, value in request.headers],
        }
        body, self._body = b"".join(self._body), []
        self._task = self.loop.create_task(self._run(scope, body))

    async def _run(self, scope: dict[str, Any], body: bytes) -> None:
        """One request through the app; then the next, or the connection closed."""
        answer = _Answer(self, scope, body)
        try:
            await self.app(scope, answer.receive, answer.send)
        except Exception:
            log.exception("the request %s %s failed", scope["method"], scope["path"][:200])
            if answer.status is None and not self._gone.is_set():
                self._task = None
                self._refuse(500)
                return
        finally:
            self._task = None
        if answer.status is not None:
            access_log.debug(
                '%s "%s %s HTTP/%s" %d',
                self.source,
                scope["method"],
                scope["path"][:200],
                scope["http_version"],
                answer.status,
            )
        self._answered()

    def _answered(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        http = self._http
        if http.our_state not in (h11.DONE, h11.MUST_CLOSE):  # the app ended without a whole answer
            if http.our_state == h11.SEND_RESPONSE:
                self._refuse(500)
            else:
                self._abort()
            return
        if self.closing_after_answer or http.our_state == h11.MUST_CLOSE or http.their_state != h11.DONE:
            self._close()
            return
        http.start_next_cycle()
        self._kept_alive = True
        self._request = None
        self._head_begun = bool(http.trailing_data[0])
        self._await_head(self.limits.head_timeout if self._head_begun else self.limits.keep_alive)
        self._next()

    # -- deadlines and closing -------------------------------------------------------------------------------------

    def _await_head(self, seconds: float) -> None:
        self.limits.pending[self] = time.monotonic()
        self._cancel_timer()
        self._timer = self.loop.call_later(seconds, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._timer = None
        if self.limits.pending.pop(self, None) is not None:
            self.limits.counts["head_timeout"] += 1
            self._abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _send_timed_out(self) -> None:
        self._send_timer = None
        if self.limits.stalled.pop(self, None) is not None:
            self.limits.counts["send_timeout"] += 1
            self._abort()

    def _unstall(self) -> None:
        self.limits.stalled.pop(self, None)
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _pause_reading(self) -> None:
        if self._reading and self.transport is not None and not self.transport.is_closing():
            self._reading = False
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if not self._reading and self.transport is not None and not self.transport.is_closing():
            self._reading = True
            self.transport.resume_reading()

    def _close(self) -> None:
        """Close after what is written has gone (with TLS, after a close_notify)."""
        if self.transport is None or self.transport.is_closing():
            return
        self.limits.pending.pop(self, None)
        self._cancel_timer()
        if self._tls is not None and not self.handshaking:
            try:
                self._tls.unwrap()
            except (ssl.SSLError, ValueError):  # SSLWantReadError: the client's close_notify is not awaited
                pass
            self._flush_tls()
        self.transport.close()

    def _abort(self) -> None:
        self._cancel_timer()
        if self.transport is not None:
            self.transport.abort()


_date_cache: list[Any] = [-1, b""]  # (second, its Date value): formatted at most once a second, when an answer needs it


def http_date() -> bytes:
    """The ``Date`` header's value now (RFC 9110's IMF-fixdate, email.utils.formatdate), formatted at most once a
    second and only when an answer is written: no timer wakes an idle daemon to refresh it."""
    second = int(time.time())
    if second != _date_cache[0]:
        _date_cache[:] = [second, formatdate(second, usegmt=True).encode()]
    date: bytes = _date_cache[1]
    return date


class _Answer:
    """The ASGI ``receive`` and ``send`` of one request on ``conn``."""

    def __init__(self, conn: Connection, scope: dict[str, Any], body: bytes) -> None:
        self.conn, self.body = conn, body
        self.head = scope["method"] == "HEAD"
        self.status: int | None = None
        self._delivered = False

    async def receive(self) -> Message:
        """The request's body (whole, once), then ``http.disconnect`` once the client has gone."""
        if not self._delivered:
            self._delivered = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.conn._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        """Write the answer's head (with a ``Date``: RFC 9110, 6.6.1) or its body, in parts of ANSWER_PART_BYTES
        (views of the app's body, each written once the client has taken enough of the one before: a client that
        reads nothing holds one part of an answer, whatever route answered); wait while the client has not taken
        what was written. Raises RuntimeError on a message out of order, h11.LocalProtocolError on a head HTTP cannot
        carry."""
        conn = self.conn
        if conn._gone.is_set():
            return
        kind = message["type"]
        if kind == "http.response.start":
            if self.status is not None:
                raise RuntimeError("the answer has begun already")
            self.status = int(message["status"])
            headers = [*message.get("headers", ()), (b"date", http_date()), *conn.extra_headers]
            if conn.closing_after_answer:
                headers.append((b"connection", b"close"))
            response = h11.Response(status_code=self.status, headers=headers, reason=_reason(self.status))
            conn._write(conn._http.send(response))
        elif kind == "http.response.body":
            if self.status is None:
                raise RuntimeError("an answer's body before its head")
            body = memoryview(message.get("body", b""))
            if not self.head:  # in parts, each once the client has taken enough of the one before
                for start in range(0, len(body), ANSWER_PART_BYTES):
                    if start:
                        await conn._writable.wait()
                        if conn._gone.is_set():
                            return
                    conn._write(conn._http.send(h11.Data(data=bytes(body[start : start + ANSWER_PART_BYTES]))))
            if not message.get("more_body", False):
                conn._write(conn._http.send(h11.EndOfMessage()) or b"")
        await conn._writable.wait()
