"""The accept loop of the HTTP port: connections taken only while the descriptor budget holds them, and TLS
handshakes only for clients that have sent their ClientHello.

asyncio's own accept loop (``loop.create_server``) takes up to a listen backlog of connections in one go, before any
protocol sees one, and its transports close a refused or evicted connection only a loop iteration or two later:
a burst of connections at the open-file limit made accept fail with ``EMFILE``, whereupon asyncio stopped accepting
for a second, scrapes included. With TLS it starts every handshake at once, so connections that never say a word
take the handshake slots of real clients. ``Listener`` is gpuwarden's own loop, which counts every accepted socket
until it is closed (``HttpLimits.open``):

- below the connection cap it accepts; at the cap, when a connection waits in the listen queue, it first closes the
  connection that has waited longest for its request (``HttpLimits.pending``: an idle or slow client), and where
  none can be closed at once it stops accepting until a connection closes, so new clients wait in the kernel's
  listen queue instead of failing;
- a TLS connection waits, holding no TLS state and no transport, until its first TLS record (the ClientHello) has
  arrived in full (peeked, not read: the handshake reads it); it is a pending connection meanwhile, closed at the
  request-head deadline or evicted first at the cap. Only then does it take one of ``max_handshakes`` handshake
  slots (past them the oldest handshake is closed) and its TLS handshake (connection) within what is
  left of the deadline.
- handshakes are bounded per source address, by what they cost and what they hold: a source whose unfinished
  handshakes hold half its share of slots or more starts at most HANDSHAKE_RATE handshakes a second (a bucket of
  HANDSHAKE_BURST; past it its ClientHello is closed before any TLS work, counted ``handshake_refused``; sources
  whose handshakes finish are not held back), holds at most HANDSHAKES_PER_SOURCE of the slots at once (its own
  oldest is closed for its next), and at ``max_handshakes`` the handshake closed is the oldest of the source that
  holds the most. Clients that send a complete ClientHello and then nothing (each costs the server a key exchange and a
  signature) so take the slots and the time of their own source only: a scraper from another address still
  handshakes.

Every connection is then served by a connection.Connection, which reports its close back
(``Slot.release``). Only public asyncio calls are used: ``add_reader`` on sockets no transport owns yet, and
``connect_accepted_socket``.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import logging
import select
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuwarden.web.server.limits import HttpLimits

log = logging.getLogger(__name__)

#: Connections taken from the listen queue per readiness callback, so that other work interleaves with a burst.
ACCEPT_BATCH = 64
#: After accept fails for want of a resource the cap did not foresee (another part of the process holding
#: descriptors, the system's file table, kernel memory), accepting resumes after this many seconds.
ACCEPT_RETRY_SECONDS = 0.1
#: A TLS record header: content type (22: handshake), version, length of the record's body.
_RECORD_HEADER = 5
_HANDSHAKE = 0x16
#: How often a connection whose ClientHello has begun but not ended is looked at again (its socket stays readable
#: while the first bytes wait in it, so the readiness callback is taken off meanwhile).
_PARTIAL_RECHECK_SECONDS = 0.05
#: Handshakes one source address may start a second, and at once (a token bucket): a scraper needs one per connection
#: (Prometheus keeps its connection alive across scrapes), a browser a few.
HANDSHAKE_RATE = 10.0
HANDSHAKE_BURST = 20.0
#: Handshake slots one source address may hold at once (a browser opens up to 6 connections to a host).
HANDSHAKES_PER_SOURCE = 8
#: Source addresses whose buckets are kept; past this, the full buckets (sources quiet for a while) are forgotten.
_SOURCES_KEPT = 4096


class Listener:
    """Accepts connections on the listening ``sock`` within ``limits``, each served by the protocol ``factory``
    makes of its slot, its source address and, for TLS (``tls``), the deadline of its handshake (0.0 without);
    with ``tls``, each after its ClientHello, through a handshake slot. ``connections`` holds the protocols of the
    connections being served (each adds and removes itself)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        factory: Callable[[Slot, str, float], asyncio.Protocol],
        limits: HttpLimits,
        tls: bool = False,
    ) -> None:
        self.loop, self.limits = loop, limits
        self._sock, self._factory, self._tls = sock, factory, tls
        self._fd = sock.fileno()
        self._queue = select.poll()  # whether a connection waits in the listen queue
        self._queue.register(self._fd, select.POLLIN)
        self._accepting = False
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._buckets: dict[str, tuple[float, float]] = {}  # source -> (tokens, when last filled)
        self.connections: set[Any] = set()

    def start(self) -> None:
        """Listen with the limits' backlog, the kernel's buffers of every connection at SOCKET_BUFFER_BYTES (accepted
        sockets inherit them), and start accepting."""
        from gpuwarden.web.server.limits import SOCKET_BUFFER_BYTES

        self._sock.setblocking(False)
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            self._sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
        self._sock.listen(self.limits.backlog)
        self._resume()

    @property
    def closed(self) -> bool:
        """Whether the listener has stopped accepting (the server is stopping)."""
        return self._closed

    @property
    def serving(self) -> bool:
        """Whether a connection this listener accepted is still served or still starting."""
        return bool(self.connections or self._tasks)

    def close(self) -> None:
        """Stop accepting. Without TLS, the connections already in the listen queue are taken first (up to the cap:
        their clients may have sent a request); with TLS, the connections before their ClientHello are closed (no
        request can have been sent on them). Connections served or starting, TLS handshakes included, stay: the
        server shuts them down, and ``abort`` ends what is left."""
        if not self._tls and self._accepting:
            self._accept()
        self._closed = True
        self._pause()
        for pending in list(self.limits.pending):
            if isinstance(pending, _Hello):
                pending.close()

    def abort(self) -> None:
        """Close every connection still served or starting, now."""
        for conn in list(self.connections):
            conn.abort()
        for task in list(self._tasks):
            task.cancel()

    def _pause(self) -> None:
        if self._accepting:
            self.loop.remove_reader(self._fd)
            self._accepting = False

    def _resume(self) -> None:
        if not self._accepting and not self._closed:
            self.loop.add_reader(self._fd, self._accept)
            self._accepting = True

    def released(self) -> None:
        """A connection this listener accepted is closed: its descriptor is free; accept again if paused there.
        Once a flood of FLOOD_CONNECTIONS or more is gone (QUIET_CONNECTIONS or fewer left open: the scrapers'), its
        memory is handed back to the system."""
        from gpuwarden.web.server.limits import FLOOD_CONNECTIONS, QUIET_CONNECTIONS, release_free_heap

        limits = self.limits
        limits.open -= 1
        if limits.open < limits.max_connections:
            self._resume()
        if limits.open <= QUIET_CONNECTIONS and limits.peak >= FLOOD_CONNECTIONS:
            limits.peak = 0
            self.loop.call_later(1.0, release_free_heap)  # after the loop has freed the transports

    def waiting(self) -> None:
        """A served connection now waits for its request head, where it can be evicted: accept again if paused at
        the cap. The connections of one accept batch are in no list until their protocols start (a task each, run
        after the batch): at the cap with all of them starting, nothing could be evicted, and accepting would have
        waited for a head deadline."""
        if not self._accepting and self.limits.open >= self.limits.max_connections:
            self._resume()

    def _make_room(self) -> bool:
        """At the cap: close the connection waiting longest for its request. True when a descriptor is free now (a
        connection before its handshake closes at once; a served one when its transport has closed: released())."""
        limits = self.limits
        while limits.pending:
            oldest, _ = limits.pending.popitem(last=False)
            now = oldest.close_pending()
            if now is None:  # closing already
                continue
            limits.counts["evicted"] += 1
            return now and limits.open < limits.max_connections
        return False

    def _accept(self) -> None:
        limits = self.limits
        for _ in range(ACCEPT_BATCH):
            if limits.open >= limits.max_connections:
                if not self._queue.poll(0):  # nobody waits to be accepted: nothing to make room for
                    return
                if not self._make_room():
                    self._pause()  # resumed by released()
                    return
            try:
                conn, addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    raise
                limits.counts["accept_failed"] += 1
                log.warning("accept failed (%s): accepting again in %g s", exc.strerror, ACCEPT_RETRY_SECONDS)
                self._pause()
                self.loop.call_later(ACCEPT_RETRY_SECONDS, self._resume)
                return
            conn.setblocking(False)
            limits.open += 1
            limits.peak = max(limits.peak, limits.open)
            slot = Slot(self)
            source = addr[0] if isinstance(addr, tuple) else ""
            if self._tls:
                _Hello(self, conn, slot, source)
            else:
                self._serve(conn, functools.partial(self._factory, slot, source, 0.0), slot)

    def _serve(self, conn: socket.socket, factory: Callable[[], asyncio.Protocol], slot: Slot) -> None:
        task = self.loop.create_task(self._connect(conn, factory, slot))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, conn: socket.socket, factory: Callable[[], asyncio.Protocol], slot: Slot) -> None:
        try:
            await self.loop.connect_accepted_socket(factory, conn)
        except (Exception, asyncio.CancelledError):  # the listener closed, or the socket failed before its protocol
            conn.close()
            slot.release()

    def handshake(self, conn: socket.socket, slot: Slot, deadline: float, source: str) -> bool:
        """``conn`` has sent its ClientHello: its TLS handshake, through a slot, to end by ``deadline``; False (and
        nothing started) when its ``source`` has started HANDSHAKE_BURST handshakes faster than HANDSHAKE_RATE while
        half its share of slots (HANDSHAKES_PER_SOURCE) or more hold handshakes of its that have not finished: clients
        that finish their handshakes (many real clients behind one address) are not refused, only a source whose
        handshakes stall."""
        now = time.monotonic()
        tokens, then = self._buckets.pop(source, (HANDSHAKE_BURST, now))
        tokens = min(HANDSHAKE_BURST, tokens + (now - then) * HANDSHAKE_RATE)
        if len(self._buckets) >= _SOURCES_KEPT:  # forget the sources whose buckets are full again; all if none are
            refilled = HANDSHAKE_BURST / HANDSHAKE_RATE
            self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < refilled}
            if len(self._buckets) >= _SOURCES_KEPT:
                self._buckets.clear()
        self._buckets[source] = (tokens - 1 if tokens >= 1 else tokens, now)
        if tokens < 1 and sum(h.source == source for h in self.limits.handshaking) >= HANDSHAKES_PER_SOURCE // 2:
            self.limits.counts["handshake_refused"] += 1
            return False
        self._serve(conn, functools.partial(self._factory, slot, source, deadline), slot)
        return True

    def admit(self, conn: Any) -> None:
        """``conn`` (with ``source`` and ``abort()``) begins its handshake: it takes a handshake slot, closing its
        source's oldest unfinished handshake when the source holds HANDSHAKES_PER_SOURCE, and at ``max_handshakes``
        the oldest of the source that holds the most (each counted ``handshake_evicted``)."""
        limits = self.limits
        mine = [h for h in limits.handshaking if h.source == conn.source]
        while len(mine) >= HANDSHAKES_PER_SOURCE:  # its own oldest makes room
            limits.counts["handshake_evicted"] += 1
            mine.pop(0).abort()
        while len(limits.handshaking) >= limits.max_handshakes:  # the oldest of the source holding the most
            held = Counter(h.source for h in limits.handshaking)
            most = max(held.values())
            oldest = next(h for h in limits.handshaking if held[h.source] == most)
            limits.counts["handshake_evicted"] += 1
            oldest.abort()
        limits.handshaking[conn] = time.monotonic()


class Slot:
    """One accepted connection's place under the cap, given back once (``release``) by whoever ends it."""

    __slots__ = ("listener", "held")

    def __init__(self, listener: Listener) -> None:
        self.listener = listener
        self.held = True

    def release(self) -> None:
        """The connection is closed: give its place back (once)."""
        if self.held:
            self.held = False
            self.listener.released()


class _Hello:
    """A TLS connection before its ClientHello has arrived: a socket, a readiness callback and a deadline, in
    ``limits.pending`` (evicted first at the cap, as a connection idle before its request head is)."""

    def __init__(self, listener: Listener, conn: socket.socket, slot: Slot, source: str) -> None:
        self.listener, self.conn, self.slot, self.source = listener, conn, slot, source
        self.fd = conn.fileno()
        limits = listener.limits
        self.deadline = time.monotonic() + limits.head_timeout
        limits.pending[self] = time.monotonic()
        loop = listener.loop
        loop.add_reader(self.fd, self._readable)
        self._timer: asyncio.TimerHandle | None = loop.call_later(limits.head_timeout, self._timed_out)
        self._recheck: asyncio.TimerHandle | None = None

    def _readable(self) -> None:
        try:
            head = self.conn.recv(_RECORD_HEADER, socket.MSG_PEEK)
            if len(head) == _RECORD_HEADER and head[0] == _HANDSHAKE:
                whole = _RECORD_HEADER + int.from_bytes(head[3:5], "big")
                head = self.conn.recv(whole, socket.MSG_PEEK)
                if len(head) == whole:
                    self._stop_watching()
                    if not self.listener.handshake(self.conn, self.slot, self.deadline, self.source):
                        self.conn.close()
                        self.slot.release()
                    return
        except BlockingIOError:
            return
        except OSError:
            head = b""
        if not head:  # the client left before saying anything
            self.close()
        elif head[0] != _HANDSHAKE:  # not TLS
            self.listener.limits.counts["handshake_failed"] += 1
            self.close()
        else:  # a ClientHello begun, not yet whole: look again shortly (the socket stays readable meanwhile)
            self.listener.loop.remove_reader(self.fd)
            self._recheck = self.listener.loop.call_later(_PARTIAL_RECHECK_SECONDS, self._watch)

    def _watch(self) -> None:
        self._recheck = None
        self.listener.loop.add_reader(self.fd, self._readable)

    def _stop_watching(self) -> None:
        self.listener.limits.pending.pop(self, None)
        self.listener.loop.remove_reader(self.fd)
        for timer in (self._timer, self._recheck):
            if timer is not None:
                timer.cancel()
        self._timer = self._recheck = None

    def _timed_out(self) -> None:
        self._timer = None
        if self in self.listener.limits.pending:
            self.listener.limits.counts["head_timeout"] += 1
            self.close()

    def close_pending(self) -> bool:
        """Close this connection to make room; its descriptor is free at once: True."""
        self.close()
        return True

    def close(self) -> None:
        """Close the connection before its handshake."""
        self._stop_watching()
        self.conn.close()
        self.slot.release()
