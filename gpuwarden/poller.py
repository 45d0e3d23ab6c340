"""The background loop: source -> NodeSnapshot, with timing, error counts, staleness and a watchdog.

One thread polls the source at a fixed interval and publishes an immutable NodeSnapshot; scrapes
and API calls only read the latest snapshot, so they never call NVML and never wait on it.

A second thread is the watchdog. While a poll runs past ``deadline`` seconds (an NVML call that hangs)
it logs "poll has been running for N s" (once, then at every doubling), publishes a snapshot without
readings and with ``source_up`` False - the last values are stale, so they are withdrawn rather than
served as if current - and stops sending systemd's ``WATCHDOG=1``, so a unit with ``WatchdogSec=``
restarts the daemon if the hang outlasts it. Otherwise it sends ``WATCHDOG=1`` every tick.
``READY=1`` follows the first poll, ``STOPPING=1`` the start of ``stop()`` (``gpuwarden.sdnotify``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuwarden.model import GpuReading, NodeStatic, PollResult
from gpuwarden.sdnotify import Notifier
from gpuwarden.snapshot import NodeSnapshot, XidTotal
from gpuwarden.source import Source

log = logging.getLogger(__name__)

#: A slow poll (over half the interval) is logged at most this often.
SLOW_POLL_LOG_SECONDS = 300.0


#: An analyzer sees each new poll (and the snapshot before it) and returns its result for the snapshot.
Analyzer = Callable[[PollResult, NodeStatic], Any]


class Poller:
    """Polls ``source`` every ``interval`` seconds in a daemon thread, watched by a watchdog thread.

    ``start()`` opens the source (SourceError propagates to the caller, before any thread runs) and
    takes the first poll synchronously, so the first scrape already has data. ``snapshot`` is the
    latest NodeSnapshot. ``stop()`` ends the loop and closes the source.

    The source's ``up`` False (it cannot read, e.g. NVML re-initialising) makes a poll count as a failure,
    published with ``source_up`` False; its ``static`` replaces the static facts when it changes (a waited-for
    driver appears). ``deadline`` (seconds, default
    max(3 intervals, 5 s)) is how long a poll may run before the watchdog marks the data stale.
    ``notifier`` sends systemd notifications (default: from the environment, a no-op outside systemd).
    ``on_publish(snapshot)`` is called in the poll thread with the snapshot of each successful poll just
    before it is published (the daemon renders the exposition ahead there, so a scrape never sees a new
    snapshot whose text is still being made).
    """

    def __init__(
        self,
        source: Source,
        interval: float,
        analyzers: dict[str, Analyzer] | None = None,
        extra_info: dict[str, str] | None = None,
        deadline: float | None = None,
        notifier: Notifier | None = None,
        on_publish: Callable[[NodeSnapshot], object] | None = None,
    ) -> None:
        self.source = source
        self.on_publish = on_publish
        self.interval = interval
        self.deadline = deadline
        self.notifier = notifier if notifier is not None else Notifier()
        self._lock = threading.Lock()
        self._watchdog: threading.Thread | None = None
        self._hung_logged_at = 0.0
        self._slow_logged_at = -SLOW_POLL_LOG_SECONDS  # the first slow poll is logged at once
        self._slow_polls = 0
        self.analyzers = analyzers or {}
        self._extra_info = extra_info or {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._xid: dict[int, dict[int, XidTotal]] = {}
        self._last_up: dict[int, GpuReading] = {}
        self._polls = 0
        self._failures = 0
        self._last_success: float | None = None
        self._last_poll: PollResult | None = None
        self._analyses: dict[str, Any] = {}
        self.snapshot: NodeSnapshot | None = None
        self._static: NodeStatic | None = None
        self.poll_started: float | None = None
        self.reload_successful = True
        self.reload_success_timestamp: float | None = time.time()  # the configuration loaded at start

    def start(self, thread: bool = True, ready: bool = True) -> NodeSnapshot:
        """Open the source, poll once, start the thread (unless ``thread`` is False); return the first snapshot.

        Sends READY=1 unless ``ready`` is False (the daemon sends it once it also serves HTTP and takes SIGHUP).
        """
        self._static = self.source.open()
        self._publish(None, source_up=False)
        self.poll_once()
        assert self.snapshot is not None
        if ready:
            self.notifier.ready(self.ready_status())
        if not thread:
            return self.snapshot
        self._thread = threading.Thread(target=self._run, name="gpuwarden-poller", daemon=True)
        self._thread.start()
        self._watchdog = threading.Thread(target=self._watch, name="gpuwarden-watchdog", daemon=True)
        self._watchdog.start()
        return self.snapshot

    def ready_status(self) -> str:
        """The status line sent with READY=1: how many GPUs from which source."""
        gpus = len(self.snapshot.static.gpus) if self.snapshot is not None else 0
        return f"serving {gpus} GPU(s) from {self.source.kind}"

    @property
    def effective_deadline(self) -> float:
        """Seconds a poll may run before its data counts as stale: ``deadline``, else max(3 intervals, 5 s)."""
        return self.deadline if self.deadline is not None else max(3 * self.interval, 5.0)

    def _watch(self) -> None:
        tick = 1.0
        if self.notifier.watchdog_seconds is not None:
            tick = min(tick, self.notifier.watchdog_seconds / 2)
        while not self._stop.wait(tick):
            self.check_hang()

    def check_hang(self, now: float | None = None) -> bool:
        """One watchdog tick: True when a poll runs past the deadline (logged, data marked stale).

        Otherwise sends WATCHDOG=1 (when systemd's watchdog is on) and returns False.
        """
        now = time.time() if now is None else now
        started = self.poll_started
        running = now - started if started is not None else 0.0
        limit = self.effective_deadline
        if running <= limit:
            self.notifier.watchdog()
            return False
        if self._hung_logged_at == 0.0 or running >= 2 * self._hung_logged_at:
            first = self._hung_logged_at == 0.0
            self._hung_logged_at = running
            log.error(
                "poll has been running for %.0f s (deadline %g s): an NVML call hangs; %s",
                running,
                limit,
                "readings withdrawn as stale, /readyz fails" if first else "still hanging",
            )
            if first:
                self.notifier.status(f"poll hanging for {running:.0f} s")
                with self._lock:
                    if self.poll_started == started:
                        why = f"a poll has been running for {running:.0f} s: an NVML call does not return"
                        self._publish_locked(None, source_up=False, why=why)
        return True

    def _run(self) -> None:
        next_at = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            self.poll_once()
            next_at += self.interval
            now = time.monotonic()
            if next_at < now:  # a slow poll: skip the missed ticks rather than bursting
                next_at = now + self.interval

    def poll_once(self) -> None:
        """Take one poll and publish a new snapshot; a failing poll is counted and logged, not raised.

        After a poll that raised, the snapshot has no readings (stale values are not served as current).
        """
        self.poll_started = started = time.time()
        try:
            poll = self.source.poll()
        except Exception as exc:  # noqa: BLE001 - the loop must survive any source failure
            self._failures += 1
            log.error("poll failed: %s", exc)
            self._finished(started)
            self._publish(None, source_up=False, why=f"the last poll failed: {exc}")
            return
        self._finished(started)
        static = self.source.static
        if isinstance(static, NodeStatic) and static is not self._static:
            self._static = static
        if not self.source.up:
            self._failures += 1
            self._publish(poll, source_up=False)
            return
        self._polls += 1
        self._last_success = poll.timestamp
        for g in poll.gpus:
            if g.up:
                self._last_up[g.index] = g
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
        snap = self._snapshot(poll, True)
        if self.on_publish is not None:
            try:
                self.on_publish(snap)
            except Exception:  # noqa: BLE001 - e.g. a render failure must not stop polling
                log.exception("before-publish hook failed")
        with self._lock:
            self.snapshot = snap
        self._warn_if_slow(time.time() - started)

    def _warn_if_slow(self, seconds: float) -> None:
        """Log a warning when a poll (reading, analysis, render ahead) took more than half the poll interval: the
        poll thread is near falling behind. At most once per SLOW_POLL_LOG_SECONDS, with how many were slow."""
        if seconds <= self.interval / 2:
            return
        self._slow_polls += 1
        now = time.monotonic()
        if now - self._slow_logged_at >= SLOW_POLL_LOG_SECONDS:
            log.warning(
                "polls take more than half the poll interval: the last %.3f s of %.3f s (%d slow since the last "
                "warning); raise poll_interval_seconds, or read fewer GPUs or collectors",
                seconds,
                self.interval,
                self._slow_polls,
            )
            self._slow_logged_at, self._slow_polls = now, 0

    def _finished(self, started: float) -> None:
        self.poll_started = None
        if self._hung_logged_at:
            self._hung_logged_at = 0.0
            log.warning("the hanging poll finished after %.1f s", time.time() - started)
            self.notifier.status(f"serving {len(self._static.gpus) if self._static else 0} GPU(s)")

    def _publish(self, poll: PollResult | None, source_up: bool = True, why: str | None = None) -> None:
        with self._lock:
            self._publish_locked(poll, source_up, why)

    def _publish_locked(self, poll: PollResult | None, source_up: bool, why: str | None = None) -> None:
        self.snapshot = self._snapshot(poll, source_up, why)

    def _snapshot(self, poll: PollResult | None, source_up: bool, why: str | None = None) -> NodeSnapshot:
        assert self._static is not None
        seq = self.snapshot.seq + 1 if self.snapshot else 0
        return NodeSnapshot(
            seq=seq,
            source=self.source.kind,
            static=self._static,
            poll=poll,
            interval_seconds=self.interval,
            polls_total=self._polls,
            poll_failures_total=self._failures,
            last_success_timestamp=self._last_success,
            source_up=source_up and poll is not None,
            down_reason=None if source_up and poll is not None else (why or self.source.down_reason),
            errors=self.source.errors(),
            xid={i: dict(c) for i, c in self._xid.items()},
            last_up=dict(self._last_up),
            analyses=dict(self._analyses),
            extra_info=self._extra_info,
            reload_successful=self.reload_successful,
            reload_success_timestamp=self.reload_success_timestamp,
        )

    def stop(self) -> None:
        """Stop the loop (waits for a poll in flight up to 5 s) and close the source (nvmlShutdown).

        Sends STOPPING=1. When a poll still hangs after 5 s, the source is closed anyway from a helper thread
        that is given 5 s more, so shutdown stays bounded even if NVML never returns.
        """
        self.notifier.stopping()
        self._stop.set()
        for t in (self._thread, self._watchdog):
            if t is not None:
                t.join(timeout=5.0)
        if self._thread is None or not self._thread.is_alive():
            self.source.close()
        else:
            log.error("a poll is still hanging at shutdown; shutting the source down anyway")
            closer = threading.Thread(target=self.source.close, name="gpuwarden-close", daemon=True)
            closer.start()
            closer.join(timeout=5.0)
        self.notifier.close()
