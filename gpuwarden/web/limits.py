"""Bounds on the HTTP port that uvicorn lacks: open connections, the time and the bytes a request head may take.

uvicorn (0.54) keeps a connection that never completes a request head open for ever, reads request lines and
headers of any size into memory (its httptools parser has no limit; h11's ``h11_max_incomplete_event_size`` applies
to h11 only), and refuses connections only by running out of file descriptors. ``HttpLimits`` holds three bounds,
which gpuwarden.web.listener adds to uvicorn's own httptools protocol, so the HTTP parsing stays uvicorn's:

- **connections**: at most ``max_connections`` open; a new connection past the cap evicts the connection that has
  waited longest for its request head (an idle or slow client), so a scraper that connects during a flood of idle
  connections still gets in; when every open connection is inside a request, the new one is closed;
- **head deadline**: a request head must be complete within ``head_timeout`` seconds of the connection or of its
  first byte (slowloris, idle sockets), and the next request on a kept-alive connection must start within
  ``keep_alive`` seconds of the previous response: else the connection is closed;
- **head size**: a request line and headers over ``max_head_bytes`` get ``431`` and the connection is closed.

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
    """The bounds (see the module doc) and what they did: ``counts`` by "evicted", "head_timeout", "head_too_large",
    "refused". ``pending`` holds the connections waiting for a request head, oldest first."""

    max_connections: int = 1000
    head_timeout: float = 10.0
    keep_alive: float = 120.0
    max_head_bytes: int = 65536
    counts: Counter[str] = field(default_factory=Counter)
    pending: OrderedDict[Any, float] = field(default_factory=OrderedDict)
