"""Bounds on the HTTP port that uvicorn lacks: open connections, the time and the bytes a request head may take.

uvicorn (0.54) keeps a connection that never completes a request head open for ever, reads request lines and
headers of any size into memory (its httptools parser has no limit; h11's ``h11_max_incomplete_event_size`` applies
to h11 only), and refuses connections only by running out of file descriptors. ``bounded_protocol(limits)`` returns
uvicorn's own httptools protocol class with three checks added, so the HTTP parsing stays uvicorn's:

- **connections**: at most ``max_connections`` open; a new connection past the cap evicts the connection that has
  waited longest for its request head (an idle or slow client), so a scraper that connects during a flood of idle
  connections still gets in; when every open connection is inside a request, the new one is closed;
- **head deadline**: a request head must be complete within ``head_timeout`` seconds of the connection, or of the
  previous response (slowloris, idle sockets): the connection is closed;
- **head size**: a request line and headers over ``max_head_bytes`` get ``431`` and the connection is closed.

Each eviction, timeout or refusal is counted (``HttpLimits.counts``); logging them is left to a rate-limited
logger (``RateLimitFilter``), as is asyncio's accept-loop error at the descriptor limit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)


@dataclass
class HttpLimits:
    """The bounds (see the module doc) and what they did: ``counts`` by "evicted", "head_timeout", "head_too_large",
    "refused". ``pending`` holds the connections waiting for a request head, oldest first."""

    max_connections: int = 1000
    head_timeout: float = 10.0
    max_head_bytes: int = 65536
    counts: Counter[str] = field(default_factory=Counter)
    pending: OrderedDict[Any, float] = field(default_factory=OrderedDict)


_431_BODY = b"request line and headers too large\n"
_431 = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: " + str(len(_431_BODY)).encode() + b"\r\nconnection: close\r\n\r\n" + _431_BODY
)


def bounded_protocol(limits: HttpLimits) -> type[HttpToolsProtocol]:
    """Return a subclass of uvicorn's HttpToolsProtocol enforcing ``limits`` (for ``uvicorn.Config(http=...)``)."""

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol with connection, head-time and head-size bounds (gpuwarden.httplimits)."""

        _head_bytes = 0
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= limits.max_connections and not self._evict():
                limits.counts["refused"] += 1
                transport.abort()
                return
            super().connection_made(transport)
            self._await_head()

        def _evict(self) -> bool:
            while limits.pending:
                oldest, _ = limits.pending.popitem(last=False)
                if oldest.transport is not None and not oldest.transport.is_closing():
                    limits.counts["evicted"] += 1
                    oldest._close_pending()
                    return True
            return False

        def _await_head(self) -> None:
            self._head_bytes = 0
            limits.pending[self] = time.monotonic()
            self._cancel_head_timer()
            self._head_timer = self.loop.call_later(limits.head_timeout, self._head_timed_out)

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
                self._head_bytes += len(data)
                if self._head_bytes > limits.max_head_bytes:
                    limits.counts["head_too_large"] += 1
                    limits.pending.pop(self, None)
                    self._cancel_head_timer()
                    self.transport.write(_431)
                    self.transport.close()
                    return
            super().data_received(data)

        def on_headers_complete(self) -> None:
            limits.pending.pop(self, None)
            self._cancel_head_timer()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._await_head()  # the next request head (keep-alive) has the same deadline

        def connection_lost(self, exc: Exception | None) -> None:
            limits.pending.pop(self, None)
            self._cancel_head_timer()
            if self.transport is not None:
                super().connection_lost(exc)

    return BoundedHttpToolsProtocol


class RateLimitFilter(logging.Filter):
    """Lets at most ``burst`` records through per ``period`` seconds and logger, then one line saying how many were
    dropped (asyncio logs its accept-loop error at the descriptor limit on every retry)."""

    def __init__(self, burst: int = 5, period: float = 60.0) -> None:
        super().__init__()
        self.burst, self.period = burst, period
        self._window: dict[str, tuple[float, int, int]] = {}  # logger -> (window start, passed, dropped)

    def filter(self, record: logging.LogRecord) -> bool:
        """Return True for a record within the rate; a record that opens a window also reports the dropped ones."""
        now = time.monotonic()
        start, passed, dropped = self._window.get(record.name, (now, 0, 0))
        if now - start >= self.period:
            if dropped:
                record.msg = f"{record.getMessage()} ({dropped} similar messages dropped in the last {self.period:g} s)"
                record.args = ()
            start, passed, dropped = now, 0, 0
        if passed >= self.burst:
            self._window[record.name] = (start, passed, dropped + 1)
            return False
        self._window[record.name] = (start, passed + 1, dropped)
        return True
