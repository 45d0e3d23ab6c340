"""Rendering a snapshot as Prometheus text, through prometheus_client, once per snapshot.

``SnapshotCollector`` is a prometheus_client custom collector that runs every enabled collector over the
latest snapshot and adds ``gpuwarden_scrape_collector_success`` / ``_duration_seconds`` per collector
(as node_exporter does): a failing collector is visible and does not take the others down.
``Exposition.render()`` caches the rendered bytes by snapshot sequence number, so any number of scrapes
between two polls cost one render.

The text is written by prometheus_client's own ``generate_latest``: the exposition format is the library's
job, not ours (a faster hand-written renderer was measured and declined; see docs/performance.md).
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


class Exposition:
    """Renders the latest snapshot to the Prometheus text format, cached per snapshot.

    ``render()`` returns bytes; it re-renders only when the snapshot's ``seq`` changed.
    """

    def __init__(
        self, get_snapshot: Callable[[], NodeSnapshot | None], collectors: list[CollectorSpec], options: CollectOptions
    ) -> None:
        self._get = get_snapshot
        self._lock = threading.Lock()
        self._cache: tuple[int, bytes] | None = None
        self._pinned: NodeSnapshot | None = None
        self.collector = SnapshotCollector(lambda: self._pinned, collectors, options)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)

    def reconfigure(self, collectors: list[CollectorSpec], options: CollectOptions) -> None:
        """Use new collectors and options from the next render on (configuration reload)."""
        with self._lock:
            self.collector.collectors = collectors
            self.collector.options = options
            self._cache = None

    def render(self) -> bytes:
        """Return the exposition of the latest snapshot (b"" before the first snapshot)."""
        snap = self._get()
        if snap is None:
            return b""
        cached = self._cache
        if cached is not None and cached[0] == snap.seq:
            return cached[1]
        with self._lock:
            cached = self._cache
            if cached is not None and cached[0] == snap.seq:
                return cached[1]
            self._pinned = snap
            body = generate_latest(self.registry)
            self._cache = (snap.seq, body)
            return body
