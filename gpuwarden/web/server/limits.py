"""The bounds of the HTTP port: open connections, the time and the bytes a request head may take, the bytes of
answers clients have not taken, TLS handshakes. ``HttpLimits`` holds them; accept (the accept loop)
and connection (each connection) enforce them:

- **connections**: at most ``max_connections`` open, counted from accept to close; at the cap the connection that
  has waited longest for its request head (an idle or slow client, or a TLS client yet to send its ClientHello) is
  closed, so a scraper that connects during a flood of idle connections still gets in; when every open connection
  is inside a request, accepting waits until one closes (new clients wait in the listen queue);
- **head deadline**: a request (head and body) must be complete within ``head_timeout`` seconds of the connection
  or of its first byte (slowloris, idle sockets), and the next request on a kept-alive connection must start within
  ``keep_alive`` seconds of the previous answer: else the connection is closed;
- **head size**: a request line and headers over ``max_head_bytes`` get ``431`` and the connection is closed (h11's
  ``max_incomplete_event_size``); a body over it gets ``413``. While a request is in flight nothing more is read
  from its connection past the first bytes that follow it, so pipelining ahead of the answers holds at most one
  socket read (SOCKET_BUFFER_BYTES) in the daemon, whatever is sent;
- **unsent answers**: each connection's write buffer pauses its writer past SEND_HIGH_WATER_BYTES (answers go out
  in parts of ANSWER_PART_BYTES); a connection whose answer has waited ``send_timeout`` s is closed, and when the
  bytes waiting on all such connections pass ``max_unsent_bytes``, the one waiting longest is closed;
- **handshakes**: at most ``max_handshakes`` TLS handshakes at once, each begun only after a whole ClientHello
  (accept holds the per-source bounds).

Each eviction, timeout or close is counted (``HttpLimits.counts``, exported by reason); logging them is left to a
rate-limited logger (gpuwarden.logs.RateLimitFilter).
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


#: A connection's write buffer pauses its writer (the app's ``send`` waits before writing more) past this many
#: bytes, and is writable again under SEND_LOW_WATER_BYTES. Low, so that nearly every byte an idle reader holds is
#: on a paused (stalled) connection, where the unsent-bytes budget counts it: the bytes on connections not paused
#: are at most this much each.
SEND_HIGH_WATER_BYTES = 4 * 1024
SEND_LOW_WATER_BYTES = 1024
#: The kernel's send and receive buffers of every connection (set on the listening socket, which accepted ones
#: inherit; the kernel doubles the value for its bookkeeping). Linux grows a socket's send buffer up to 4 MiB by
#: itself (tcp_wmem), so an answer a client never reads would wait in kernel memory, where no bound of the daemon's
#: sees it and which a cgroup v2 memory limit charges to the daemon; small buffers keep it in the write buffers that
#: the unsent-bytes budget counts. 32 KiB in flight is ample for an answer of 1 MB at a 1-10 ms round trip.
SOCKET_BUFFER_BYTES = 16 * 1024
#: Answers are sent in parts of this size (the connection's ASGI ``send``, whatever route answered), each once the one
#: before has left the write buffer: a client that takes nothing holds one part (and what its socket took), not the
#: whole answer.
ANSWER_PART_BYTES = 16 * 1024


@dataclass
class HttpLimits:
    """The bounds (see the module doc; ``backlog``: the listen backlog) and what they did: ``counts`` by reason
    (catalog.HTTP_CLOSE_REASONS). ``pending`` holds the connections waiting for a request head (or a TLS ClientHello),
    oldest first; ``handshaking`` the TLS handshakes in progress; ``stalled`` the connections whose answers wait for
    their clients, longest first; ``open`` counts every accepted connection until it closes."""

    max_connections: int = 1000
    head_timeout: float = 10.0
    keep_alive: float = 120.0
    max_head_bytes: int = 65536
    backlog: int = 2048
    max_handshakes: int = 64
    max_unsent_bytes: int = 8 * 2**20
    send_timeout: float = 30.0
    counts: Counter[str] = field(default_factory=Counter)
    pending: OrderedDict[Any, float] = field(default_factory=OrderedDict)
    handshaking: OrderedDict[Any, float] = field(default_factory=OrderedDict)
    stalled: OrderedDict[Any, float] = field(default_factory=OrderedDict)
    open: int = 0
    peak: int = 0  # the most connections open at once since memory was last given back (release_free_heap)

    def keep_unsent_within_budget(self) -> int:
        """While the bytes waiting on stalled connections exceed ``max_unsent_bytes``, close the connection that has
        waited longest (each counted as "unsent_over_budget"); return how many were closed. One pass over the stalled
        connections (each one's ``unsent()``), at each new stall."""
        total = sum(conn.unsent() for conn in self.stalled)
        closed = 0
        while total > self.max_unsent_bytes and self.stalled:
            oldest = next(iter(self.stalled))
            total -= oldest.unsent()
            self.counts["unsent_over_budget"] += 1
            oldest.close_stalled()  # takes it out of stalled
            closed += 1
        return closed


#: Descriptors kept back from the connection cap for everything else the daemon opens: NVML's device files, /proc
#: reads, the kubelet socket, the listening socket, log and config files.
RESERVED_DESCRIPTORS = 64
#: The listen backlog: connections the kernel queues while the accept loop waits (they hold no descriptor of the
#: daemon's until accepted).
BACKLOG = 2048


def connection_cap(wanted: int) -> tuple[int, int, str | None]:
    """The connection cap and listen backlog the process's descriptor limit allows: (cap, backlog, warning).

    Raises the soft ``RLIMIT_NOFILE`` towards the hard one where ``wanted`` (``max_connections``) needs it (any
    process may). The cap is ``wanted`` when ``wanted`` + RESERVED_DESCRIPTORS fit the limit; else what fits, with a
    one-line warning (the accept loop, accept, counts every connection from accept to close and stops
    accepting at the cap, so accept never fails for want of a descriptor). The backlog is BACKLOG.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + RESERVED_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted, BACKLOG, None
    cap = max(1, soft - RESERVED_DESCRIPTORS)
    return (
        cap,
        BACKLOG,
        (
            f"max_connections {wanted} does not fit the open-file limit {soft} (hard {hard}) with "
            f"{RESERVED_DESCRIPTORS} descriptors kept back: at most {cap} connections (raise LimitNOFILE or ulimit -n)"
        ),
    )


#: Connections open at once past which, once they are gone, the freed memory is handed back to the system.
FLOOD_CONNECTIONS = 100
#: A flood is gone once no more than this many connections stay open: the scrapers' own, kept alive (Prometheus
#: keeps its connection between scrapes, two replicas two), so waiting for none would never trim while scraped.
QUIET_CONNECTIONS = 8


def release_free_heap() -> bool:
    """Hand the C heap's free pages back to the system: glibc's ``malloc_trim(0)`` (malloc(3)), through ctypes.
    Return True when memory was released, False when none was or the C library has no ``malloc_trim`` (musl,
    macOS). Raises nothing.

    glibc keeps freed pages below the heap's top resident until trimmed. The daemon trims once after start-up (which
    frees much of what it allocated: the imports' temporaries, the first poll) and a second after a connection flood
    (Python and OpenSSL free a flood's buffers into the C heap: without it, a daemon that weathered 600 TLS
    connections stays at their peak resident memory)."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))
