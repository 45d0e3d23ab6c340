"""The collector registry: one collector per metric domain, each enabled or disabled by name.

A collector is a function ``collect(snapshot, options) -> Iterable[Metric]`` registered with
``@collector(name, enabled_by_default=..., help=...)``. It turns the latest NodeSnapshot into fresh
prometheus_client metric families on every render; it never calls NVML and keeps no state.
Learned from node_exporter (one file per domain, ``--collector.<name>`` / ``--no-collector.<name>``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.model import GpuReading, GpuStatic
from exporter.poller import NodeSnapshot

GPU_LABELS = ["gpu", "uuid"]


@dataclass(frozen=True)
class CollectOptions:
    """Knobs collectors read: process series bound and label choices (from the configuration)."""

    max_processes_per_gpu: int = 16
    process_cmdline: bool = False


CollectFn = Callable[[NodeSnapshot, CollectOptions], Iterable[Metric]]


@dataclass(frozen=True)
class CollectorSpec:
    """A registered collector: its name, default state, one-line help and function."""

    name: str
    enabled_by_default: bool
    help: str
    fn: CollectFn = field(compare=False)


REGISTRY: dict[str, CollectorSpec] = {}


def collector(name: str, *, enabled_by_default: bool = True, help: str) -> Callable[[CollectFn], CollectFn]:
    """Register the decorated function as collector ``name``. Raises ValueError on a duplicate name."""

    def wrap(fn: CollectFn) -> CollectFn:
        if name in REGISTRY:
            raise ValueError(f"collector {name!r} registered twice")
        REGISTRY[name] = CollectorSpec(name, enabled_by_default, help, fn)
        return fn

    return wrap


def gpu_label_values(g: GpuReading | GpuStatic) -> list[str]:
    """Return the values of GPU_LABELS for a GPU: [index as str, uuid]."""
    return [str(g.index), g.uuid]


def readings(snap: NodeSnapshot) -> Iterator[GpuReading]:
    """Yield the readings of every GPU that is up in the latest poll (none before the first poll)."""
    if snap.poll is None:
        return
    for g in snap.poll.gpus:
        if g.up:
            yield g


def gauge(name: str, doc: str, labels: list[str] | None = None, unit: str = "") -> GaugeMetricFamily:
    """Return a new GaugeMetricFamily with GPU_LABELS followed by ``labels``."""
    return GaugeMetricFamily(name, doc, labels=GPU_LABELS + (labels or []), unit=unit)


def counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
    """Return a new CounterMetricFamily (``name`` without ``_total``) with GPU_LABELS + ``labels``."""
    return CounterMetricFamily(name, doc, labels=GPU_LABELS + (labels or []))


def present(*families: Metric | None) -> Iterator[Metric]:
    """Yield the families that are not None (the gauges that have at least one sample)."""
    for fam in families:
        if fam is not None:
            yield fam


def static_gauge(
    snap: NodeSnapshot, name: str, doc: str, get: Callable[[GpuStatic], float | bool | None]
) -> Metric | None:
    """Return a gauge of a static fact with one sample per GPU where ``get`` is not None; None when none has it."""
    fam = gauge(name, doc)
    for s in snap.static.gpus:
        v = get(s)
        if v is not None:
            fam.add_metric(gpu_label_values(s), float(v))
    return fam if fam.samples else None


def per_gpu_gauge(snap: NodeSnapshot, name: str, doc: str, get: Callable[[GpuReading], float | None]) -> Metric | None:
    """Return a gauge with one sample per up GPU where ``get`` is not None; None when no GPU has it.

    A family with no sample is not exposed, so an unsupported reading is absent, never 0.
    """
    fam = gauge(name, doc)
    for g in readings(snap):
        v = get(g)
        if v is not None:
            fam.add_metric(gpu_label_values(g), float(v))
    return fam if fam.samples else None
