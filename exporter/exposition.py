"""Rendering a snapshot as Prometheus text, through prometheus_client, once per snapshot.

``SnapshotCollector`` is a prometheus_client custom collector that runs every enabled collector over the
latest snapshot and adds ``gpuwarden_scrape_collector_success`` / ``_duration_seconds`` per collector
(as node_exporter does): a failing collector is visible and does not take the others down.
``Exposition.render()`` caches the rendered bytes by snapshot sequence number, so any number of scrapes
between two polls cost one render.

``render_text`` writes the families in prometheus_client's text format, byte for byte what
``prometheus_client.generate_latest`` writes for them, at a fraction of its cost: escaped metric and label
names are computed once per name and label values are escaped only when they hold a character that needs it
(profile and figures in docs/performance.md).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import escape_label_name, escape_metric_name
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

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


#: Escaped metric and label names (UNDERSCORES escaping, as generate_latest): names come from code, so few.
_METRIC_NAMES: dict[str, str] = {}
_LABEL_NAMES: dict[str, str] = {}
#: OpenMetrics-only samples that the Prometheus text format moves into a gauge family of their own.
_OM_SUFFIXES = ("_created", "_gsum", "_gcount")
#: OpenMetrics type -> Prometheus text format type (as generate_latest munges them).
_TYPES = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}


def _metric_name(name: str) -> str:
    esc = _METRIC_NAMES.get(name)
    if esc is None:
        esc = _METRIC_NAMES[name] = escape_metric_name(name)
    return esc


def _label_name(name: str) -> str:
    esc = _LABEL_NAMES.get(name)
    if esc is None:
        esc = _LABEL_NAMES[name] = escape_label_name(name)
    return esc


def _float(value: float) -> str:
    """floatToGoString with its common case (a finite number below 1e7, or not positive) inlined."""
    d = float(value)
    if not math.isfinite(d):
        return floatToGoString(d)
    s = repr(d)
    if d > 0 and s.find(".") > 6:
        return floatToGoString(d)
    return s


def _prefix(name: str, labels: dict[str, str]) -> str:
    """Return ``name{labels}`` of one sample: label names escaped and sorted, values escaped as needed."""
    if not labels:
        return _metric_name(name)
    parts = []
    for k, v in sorted(labels.items()) if len(labels) > 1 else labels.items():
        if "\\" in v or "\n" in v or '"' in v:
            v = v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
        parts.append(f'{_label_name(k)}="{v}"')
    return _metric_name(name) + "{" + ",".join(parts) + "}"


class SeriesCache:
    """The sample lines of the last two renders, so a series is formatted once and re-formatted only when its
    value changed (static facts, limits, thresholds and most counters do not change from poll to poll).

    Entries used by a render are kept for the next one and the rest dropped (``rotate()``): its size is
    bounded by the series of two consecutive renders, however series come and go over a long run.
    """

    def __init__(self) -> None:
        self._old: dict[tuple[object, ...], tuple[str, float, str]] = {}
        self._new: dict[tuple[object, ...], tuple[str, float, str]] = {}

    def line(self, s: Sample) -> str:
        """Return the text line of sample ``s`` (without a timestamp), from the cache when nothing changed."""
        key = (s.name, *s.labels.items())
        got = self._new.get(key)
        if got is None:
            got = self._old.get(key)
        value = s.value
        if got is not None and got[1] == value and (value or math.copysign(1.0, value) == math.copysign(1.0, got[1])):
            self._new[key] = got
            return got[2]
        prefix = got[0] if got is not None else _prefix(s.name, s.labels)
        line = f"{prefix} {_float(value)}\n"
        self._new[key] = (prefix, value, line)
        return line

    def rotate(self) -> None:
        """End a render: keep what it used, drop the rest."""
        self._old, self._new = self._new, {}

    def __len__(self) -> int:
        return len(self._new) + len(self._old)


def _sample_line(s: Sample, cache: SeriesCache | None) -> str:
    if cache is not None and s.timestamp is None:
        return cache.line(s)
    ts = "" if s.timestamp is None else f" {int(float(s.timestamp) * 1000):d}"
    return f"{_prefix(s.name, s.labels)} {_float(s.value)}{ts}\n"


def render_text(metrics: Iterable[Metric], cache: SeriesCache | None = None) -> bytes:
    """Return ``metrics`` in the Prometheus text format (0.0.4), as ``generate_latest`` writes them.

    ``cache`` (optional, one per caller, not shared between threads) keeps series strings between renders.
    """
    out: list[str] = []
    append = out.append
    for metric in metrics:
        mname, mtype = metric.name, metric.type
        if mtype == "counter":
            mname += "_total"
        elif mtype == "info":
            mname += "_info"
        mtype = _TYPES.get(mtype, mtype)
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        name = _metric_name(mname)
        append(f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n")
        om: dict[str, list[str]] | None = None
        base = metric.name
        for s in metric.samples:
            sname = s.name
            if sname != base and sname.startswith(base) and sname[len(base) :] in _OM_SUFFIXES:
                if om is None:
                    om = {}
                om.setdefault(sname[len(base) :], []).append(_sample_line(s, cache))
            else:
                append(_sample_line(s, cache))
        if om:
            for suffix, lines in sorted(om.items()):
                name = _metric_name(base + suffix)
                append(f"# HELP {name} {doc}\n# TYPE {name} gauge\n")
                out.extend(lines)
    if cache is not None:
        cache.rotate()
    return "".join(out).encode("utf-8")


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
        self._series = SeriesCache()
        self.collector = SnapshotCollector(lambda: self._pinned, collectors, options)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)

    def reconfigure(self, collectors: list[CollectorSpec], options: CollectOptions) -> None:
        """Use new collectors and options from the next render on (configuration reload)."""
        with self._lock:
            self.collector.collectors = collectors
            self.collector.options = options
            self._cache = None

    def cached(self) -> bytes | None:
        """Return the rendered exposition of the latest snapshot if it is already rendered, else None.

        Lets an async handler answer from the event loop when no render is due and hand ``render()`` to a
        thread only when one is (a sync handler's thread-pool hop costs about 0.4 ms a scrape).
        """
        snap = self._get()
        cached = self._cache
        if snap is None:
            return b""
        if cached is not None and cached[0] == snap.seq:
            return cached[1]
        return None

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
            body = render_text(self.registry.collect(), self._series)
            self._cache = (snap.seq, body)
            return body
