"""Rendering a snapshot as Prometheus text, through prometheus_client, once per snapshot.

``SnapshotCollector`` is a prometheus_client custom collector that runs every enabled collector over the
latest snapshot and adds ``gpuwarden_scrape_collector_success`` / ``_duration_seconds`` per collector
(as node_exporter does): a failing collector is visible and does not take the others down.
``Exposition.render()`` caches the rendered bytes by snapshot sequence number, so any number of scrapes
between two polls cost one render. The daemon renders ahead in the poll thread (``prerender``), so a scrape
finds the text ready and only sends bytes; it renders ahead only on the last poll before the next scrape is
due (scrapes are periodic: the next is expected one scrape gap after the last), so a 1 s poll scraped every
15 s pays one render per scrape, not fifteen. When polls come faster than once per ``min_age`` (1 s),
the rendered text is reused for up to ``min_age``: rendering at most once a second bounds the CPU a fast poll
costs (Prometheus scrapes every 10-60 s; the readings themselves and the insight accounting still take every
poll).

The text is written by prometheus_client's own ``generate_latest``: the exposition format is the library's
job, not ours (a faster hand-written renderer was measured and declined; see docs/performance.md). It is called
per metric family, and only for the families that changed since the previous render (``FamilyTexts``): between
two polls of a GPU most families are unchanged (identity, limits, thresholds, counters that did not move; about
two thirds of the samples in the recorded traces), and their text is reused.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.collectors import REGISTRY, CollectOptions, CollectorSpec
from exporter.poller import NodeSnapshot

log = logging.getLogger(__name__)


def select_collectors(enable: Iterable[str] = (), disable: Iterable[str] = ()) -> list[CollectorSpec]:
    """Return the collectors to run: enabled by default, plus ``enable``, minus ``disable``.

    Raises ValueError naming an unknown collector. The ``exporter`` collector cannot be disabled.
    """
    enable, disable = set(enable), set(disable)
    unknown = sorted((enable | disable) - set(REGISTRY))
    if unknown:
        raise ValueError(f"unknown collector {unknown[0]!r} (known: {', '.join(sorted(REGISTRY))})")
    if "exporter" in disable:
        raise ValueError("collector 'exporter' (self-metrics) cannot be disabled")
    return [
        spec
        for name, spec in sorted(REGISTRY.items())
        if (spec.enabled_by_default or name in enable) and name not in disable
    ]


class SnapshotCollector(Collector):
    """A prometheus_client Collector over ``get_snapshot()``: fresh metric families on every collect()."""

    def __init__(
        self, get_snapshot: Callable[[], NodeSnapshot | None], collectors: list[CollectorSpec], options: CollectOptions
    ) -> None:
        self._get = get_snapshot
        self.collectors = collectors
        self.options = options

    def collect(self) -> Iterable[Metric]:
        """Yield every enabled collector's families, then per-collector success and duration."""
        snap = self._get()
        if snap is None:
            return
        success = GaugeMetricFamily(
            "gpuwarden_scrape_collector_success", "1 when the collector rendered without error.", labels=["collector"]
        )
        duration = GaugeMetricFamily(
            "gpuwarden_scrape_collector_duration_seconds",
            "Time the collector took to render, in seconds.",
            labels=["collector"],
        )
        for spec in self.collectors:
            start = time.perf_counter()
            try:
                families = list(spec.fn(snap, self.options))
                ok = 1.0
            except Exception:  # noqa: BLE001 - one collector's failure must not break the scrape
                log.exception("collector %s failed", spec.name)
                families, ok = [], 0.0
            yield from families
            success.add_metric([spec.name], ok)
            duration.add_metric([spec.name], time.perf_counter() - start)
        yield success
        yield duration


class _One:
    """A collector of one metric family: what ``generate_latest`` is given to render that family alone."""

    __slots__ = ("family",)

    def __init__(self, family: Metric) -> None:
        self.family = family

    def collect(self) -> list[Metric]:
        """Return the family."""
        return [self.family]


class FamilyTexts:
    """Renders a sequence of metric families with ``generate_latest``, reusing the text of each family that is
    equal (name, help, type, unit and samples: ``Metric.__eq__``) to the same-named family of the previous call.

    ``render(families)`` returns the same bytes as ``generate_latest`` over a collector yielding ``families``
    (the text format is the concatenation of each family's block; tests/test_exposition_cache.py checks it on
    every poll of real recordings). Not thread-safe: the caller holds a lock.
    """

    def __init__(self) -> None:
        self._previous: dict[str, tuple[Metric, bytes]] = {}
        self.rendered = 0  # families rendered by the last call (the others were reused)

    def render(self, families: Iterable[Metric]) -> bytes:
        """Return the Prometheus text format of ``families`` (UTF-8 bytes)."""
        previous = self._previous
        current: dict[str, tuple[Metric, bytes]] = {}
        parts: list[bytes] = []
        rendered = 0
        for fam in families:
            old = previous.get(fam.name)
            if old is not None and old[0] == fam:
                text = old[1]
            else:
                text = generate_latest(_One(fam))  # type: ignore[arg-type]
                rendered += 1
            current[fam.name] = (fam, text)
            parts.append(text)
        self._previous = current
        self.rendered = rendered
        return b"".join(parts)


#: After a scrape, render ahead at every poll for at most this long while the next one is not known to be due
#: later (the period is not known yet, or the scrape is overdue); Prometheus's scrape intervals are seconds to a
#: minute.
FIRST_GAP_MAX = 120.0


class Exposition:
    """Renders the latest snapshot to the Prometheus text format, cached per snapshot.

    ``render()`` returns bytes; it re-renders when the snapshot's ``seq`` changed, except that with a poll
    interval shorter than ``min_age`` seconds a render less than ``min_age`` old is served (see module doc),
    unless the source went up or down since (stale readings are withdrawn, and come back, at once).
    ``cached()`` (called by the server for each scrape, whose time it notes) returns the text when ``render()``
    would not need to render, or the previous text while another thread renders the next one, else None.
    ``prerender(poll_interval)`` is the poll thread's hook.
    """

    def __init__(
        self,
        get_snapshot: Callable[[], NodeSnapshot | None],
        collectors: list[CollectorSpec],
        options: CollectOptions,
        min_age: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._get = get_snapshot
        self._clock = clock
        self._last_scrape: float | None = None
        self._scrape_gap: float | None = None
        self._lock = threading.Lock()
        self.min_age = min_age
        # (snapshot seq, source_up, monotonic render time, text)
        self._cache: tuple[int, bool, float, bytes] | None = None
        self._pinned: NodeSnapshot | None = None
        self.collector = SnapshotCollector(lambda: self._pinned, collectors, options)
        self.registry = CollectorRegistry(auto_describe=False)  # the same families, for generate_latest elsewhere
        self.registry.register(self.collector)
        self._texts = FamilyTexts()

    def reconfigure(self, collectors: list[CollectorSpec], options: CollectOptions) -> None:
        """Use new collectors and options from the next render on (configuration reload)."""
        with self._lock:
            self.collector.collectors = collectors
            self.collector.options = options
            self._cache = None
            self._texts = FamilyTexts()

    def _valid(self, snap: NodeSnapshot, age_limit: float) -> bytes | None:
        cached = self._cache
        if cached is None:
            return None
        seq, up, at, body = cached
        if seq >= snap.seq:  # greater: the poll thread rendered the next snapshot just before publishing it
            return body
        if up == snap.source_up and snap.interval_seconds < self.min_age and self._clock() - at < age_limit:
            return body
        return None

    def cached(self) -> bytes | None:
        """Note a scrape; return what ``render()`` would return if it needs no render (b"" before the first
        snapshot; at fast polls up to 2 x ``min_age`` old), else None."""
        now = self._clock()
        ahead = self._rendering_ahead(now)  # the poll thread has been rendering ahead of scrapes
        if self._last_scrape is not None:
            self._scrape_gap = now - self._last_scrape
        self._last_scrape = now
        snap = self._get()
        if snap is None:
            return b""
        # at fast polls the poll thread re-renders once the text is min_age old (when it renders ahead, i.e. once the
        # scrape period is known); a scrape in between is served the text up to 2 x min_age old rather than render
        body = self._valid(snap, 2 * self.min_age if ahead else self.min_age)
        if body is None and self._lock.locked():
            # the poll thread is rendering this very snapshot: serve the previous poll's text rather than queue
            # behind a render that takes tens of ms at 64 GPUs (unless the source went up or down since)
            cached = self._cache
            if cached is not None and cached[1] == snap.source_up:
                return cached[3]
        return body

    def _rendering_ahead(self, now: float) -> bool:
        last = self._last_scrape
        return last is not None and (self._scrape_gap is not None or now - last <= FIRST_GAP_MAX)

    def prerender(self, poll_interval: float, snap: NodeSnapshot | None = None) -> bool:
        """Render ``snap`` (default the latest snapshot) now if a scrape is expected before the next poll;
        return True when it rendered.

        Expected: the last scrape plus the last gap between two scrapes comes before the next poll
        (``poll_interval`` from now) or has passed (a late scrape, or a gap that did not tell the period: a probe
        or a person's request between two of Prometheus's scrapes). After the first scrape, until a second one
        shows the period, every poll renders. Before any scrape, only the first render is made. Once no scrape
        has come for FIRST_GAP_MAX seconds, or two gaps if longer (scrapes stopped: Prometheus is down), nothing
        is rendered ahead until the next scrape, which renders for itself.
        """
        last, gap, now = self._last_scrape, self._scrape_gap, self._clock()
        if last is None:
            if self._cache is not None:
                return False
        elif self._cache is not None and now - last > max(FIRST_GAP_MAX, 2 * (gap or 0.0)):
            return False
        elif gap is not None and now + poll_interval < last + gap:
            return False
        self.render(snap)
        return True

    def render(self, snap: NodeSnapshot | None = None) -> bytes:
        """Return the exposition of ``snap``, default the latest snapshot (b"" before the first snapshot)."""
        snap = snap if snap is not None else self._get()
        if snap is None:
            return b""
        body = self._valid(snap, self.min_age)
        if body is not None:
            return body
        with self._lock:
            body = self._valid(snap, self.min_age)
            if body is not None:
                return body
            self._pinned = snap
            body = self._texts.render(self.collector.collect())
            self._cache = (snap.seq, snap.source_up, self._clock(), body)
            return body
