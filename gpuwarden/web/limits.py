"""Bounds on the HTTP port that uvicorn lacks: open connections, the time and the bytes a request head may take,
the requests a client may pipeline.

uvicorn (0.54) keeps a connection that never completes a request head open for ever, reads request lines and
headers of any size into memory (its httptools parser has no limit; h11's ``h11_max_incomplete_event_size`` applies
to h11 only), and refuses connections only by running out of file descriptors. ``HttpLimits`` holds four bounds,
which gpuwarden.web.listener adds to uvicorn's own httptools protocol, so the HTTP parsing stays uvicorn's:

- **connections**: at most ``max_connections`` open; a new connection past the cap evicts the connection that has
  waited longest for its request head (an idle or slow client), so a scraper that connects during a flood of idle
  connections still gets in; when every open connection is inside a request, the new one is closed;
- **head deadline**: a request head must be complete within ``head_timeout`` seconds of the connection or of its
  first byte (slowloris, idle sockets), and the next request on a kept-alive connection must start within
  ``keep_alive`` seconds of the previous response: else the connection is closed;
- **head size**: a request line and headers over ``max_head_bytes`` get ``431`` and the connection is closed;
- **pipelining**: a client that sends more than ``max_pipelined`` requests ahead of its answers is closed (uvicorn
  queues every request of a read, a few KiB each, for a client that may never read an answer).

Each eviction, timeout or refusal is counted (``HttpLimits.counts``); logging them is left to a rate-limited
logger (gpuwarden.logs.RateLimitFilter), as is asyncio's accept-loop error at the descriptor limit.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class HttpLimits:
    """The bounds (see the module doc; ``backlog``: the listen backlog, see connection_cap) and what they did:
    ``counts`` by "evicted", "head_timeout", "head_too_large", "refused". ``pending`` holds the connections
    waiting for a request head, oldest first."""

    max_connections: int = 1000
    head_timeout: float = 10.0
    keep_alive: float = 120.0
    max_head_bytes: int = 65536
    backlog: int = 2048
    max_handshakes: int = 64
    max_pipelined: int = 8
    counts: Counter[str] = field(default_factory=Counter)
    pending: OrderedDict[Any, float] = field(default_factory=OrderedDict)
    handshaking: OrderedDict[Any, float] = field(default_factory=OrderedDict)
    peak: int = 0  # the most connections open at once since memory was last given back (give_back_memory)


#: Descriptors kept back from the connection cap for everything else the daemon opens: NVML's device files, /proc
#: reads, the kubelet socket, the listening socket, log and config files.
RESERVED_DESCRIPTORS = 64
#: uvicorn's listen backlog. asyncio accepts up to this many connections in one go before the protocols (and so the
#: cap's evictions) see any of them: the descriptors for one such batch are kept back too.
BACKLOG = 2048


def connection_cap(wanted: int) -> tuple[int, int, str | None]:
    """The connection cap and listen backlog the process's descriptor limit allows: (cap, backlog, warning).

    Raises the soft ``RLIMIT_NOFILE`` towards the hard one where ``wanted`` (``max_connections``) needs it (any
    process may). The cap is ``wanted`` when ``wanted`` + one accept batch + RESERVED_DESCRIPTORS fit the limit;
    else what fits, with a one-line warning: a cap above the limit has new connections fail at ``accept`` (and
    asyncio pause accepting for a second) instead of evicting idle ones. The backlog is BACKLOG, or an eighth of
    the limit where that is smaller.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + BACKLOG + RESERVED_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted, BACKLOG, None
    backlog = max(16, min(BACKLOG, soft // 8))
    cap = max(1, soft - backlog - RESERVED_DESCRIPTORS)
    if cap >= wanted:
        return wanted, backlog, None
    return (
        cap,
        backlog,
        (
            f"max_connections {wanted} does not fit the open-file limit {soft} (hard {hard}) with a listen backlog "
            f"of {backlog} and {RESERVED_DESCRIPTORS} descriptors kept back: at most {cap} connections (raise "
            f"LimitNOFILE or ulimit -n)"
        ),
    )


#: Connections open at once past which, once they are all gone, the freed memory is handed back to the system.
FLOOD_CONNECTIONS = 100


def give_back_memory() -> bool:
    """Hand memory freed after a connection flood back to the system (glibc's ``malloc_trim(0)``); return whether
    it ran. Python and OpenSSL free a flood's buffers into the C heap, which keeps them: without this, a daemon that
    weathered 600 TLS connections stays at their peak resident memory. Elsewhere than glibc: nothing (False)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True
