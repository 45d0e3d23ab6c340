"""The background loop: source -> NodeSnapshot, with timing, error counts and staleness.

One thread polls the source at a fixed interval and publishes an immutable NodeSnapshot; scrapes
and API calls only read the latest snapshot, so they never call NVML and never wait on it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter.model import NodeStatic, PollResult
from exporter.source import Source

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class XidTotal:
    """XID events of one code on one GPU since the daemon started: count and last event (Unix s)."""

    count: int
    last_timestamp: float


@dataclass(frozen=True)
class NodeSnapshot:
    """Everything known about the node after one poll; what collectors and the API read.

    ``poll`` is None until the first poll succeeds. ``xid`` maps GPU index -> XID code -> XidTotal.
    ``errors`` maps (call, error) -> count. ``analyses`` holds what analyzers (``exporter.insight``)
    derived from the history, keyed by analyzer name.
    """

    seq: int
    source: str
    static: NodeStatic
    poll: PollResult | None
    interval_seconds: float
    polls_total: int = 0
    poll_failures_total: int = 0
    last_success_timestamp: float | None = None
    errors: dict[tuple[str, str], int] = field(default_factory=dict)
    xid: dict[int, dict[int, XidTotal]] = field(default_factory=dict)
    analyses: dict[str, Any] = field(default_factory=dict)
    extra_info: dict[str, str] = field(default_factory=dict)

    def fresh(self, now: float, max_age_seconds: float) -> bool:
        """True when the last successful poll is at most ``max_age_seconds`` old at ``now``."""
        return self.last_success_timestamp is not None and now - self.last_success_timestamp <= max_age_seconds


#: An analyzer sees each new poll (and the snapshot before it) and returns its result for the snapshot.
Analyzer = Callable[[PollResult, NodeStatic], Any]


class Poller:
    """Polls ``source`` every ``interval`` seconds in a daemon thread.

    ``start()`` opens the source (SourceError propagates to the caller, before any thread runs) and
    takes the first poll synchronously, so the first scrape already has data. ``snapshot`` is the
    latest NodeSnapshot. ``stop()`` ends the loop and closes the source.
    """

    def __init__(
        self,
        source: Source,
        interval: float,
        analyzers: dict[str, Analyzer] | None = None,
        extra_info: dict[str, str] | None = None,
    ) -> None:
        self.source = source
        self.interval = interval
        self.analyzers = analyzers or {}
        self._extra_info = extra_info or {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._xid: dict[int, dict[int, XidTotal]] = {}
        self._polls = 0
        self._failures = 0
        self._last_success: float | None = None
        self._last_poll: PollResult | None = None
        self._analyses: dict[str, Any] = {}
        self.snapshot: NodeSnapshot | None = None
        self._static: NodeStatic | None = None
        self.poll_started: float | None = None

    def start(self, thread: bool = True) -> NodeSnapshot:
        """Open the source, poll once, start the thread (unless ``thread`` is False); return the first snapshot."""
        self._static = self.source.open()
        self._publish(None)
        self.poll_once()
        if not thread:
            assert self.snapshot is not None
            return self.snapshot
        self._thread = threading.Thread(target=self._run, name="gpuwarden-poller", daemon=True)
        self._thread.start()
        assert self.snapshot is not None
        return self.snapshot

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            self.poll_once()
            next_at += self.interval
            now = time.monotonic()
            if next_at < now:  # a slow poll: skip the missed ticks rather than bursting
                next_at = now + self.interval

    def poll_once(self) -> None:
        """Take one poll and publish a new snapshot; a failing poll is counted and logged, not raised."""
        self.poll_started = time.time()
        try:
            poll = self.source.poll()
        except Exception as exc:  # noqa: BLE001 - the loop must survive any source failure
            self._failures += 1
            log.error("poll failed: %s", exc)
            self.poll_started = None
            self._publish(self._last_poll)
            return
        self.poll_started = None
        self._polls += 1
        self._last_success = poll.timestamp
        for g in poll.gpus:
            for e in g.xid_events:
                codes = self._xid.setdefault(g.index, {})
                prev = codes.get(e.xid)
                codes[e.xid] = XidTotal(count=(prev.count if prev else 0) + 1, last_timestamp=e.timestamp)
        assert self._static is not None
        for name, analyzer in self.analyzers.items():
            try:
                self._analyses[name] = analyzer(poll, self._static)
            except Exception:  # noqa: BLE001 - one analyzer's bug must not stop polling
                log.exception("analyzer %s failed", name)
        self._last_poll = poll
        self._publish(poll)

    def _publish(self, poll: PollResult | None) -> None:
        assert self._static is not None
        seq = self.snapshot.seq + 1 if self.snapshot else 0
        self.snapshot = NodeSnapshot(
            seq=seq,
            source=self.source.kind,
            static=self._static,
            poll=poll,
            interval_seconds=self.interval,
            polls_total=self._polls,
            poll_failures_total=self._failures,
            last_success_timestamp=self._last_success,
            errors=self.source.errors(),
            xid={i: dict(c) for i, c in self._xid.items()},
            analyses=dict(self._analyses),
            extra_info=self._extra_info,
        )

    def stop(self) -> None:
        """Stop the loop (waits for a poll in flight up to 5 s) and close the source."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self.source.close()
