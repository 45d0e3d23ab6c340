"""The collector registry: each collector yields its families from the catalogue, in declaration order.

A family whose declaration names a reading (``gpuwarden.catalog.Family.reading`` or ``static``) is built here,
with no code of its collector's own; a hand-written family is built by the function its collector module
registers with ``@builds(family name)``. Either way the name, type, help and labels come from the catalogue.
Collectors never call NVML and keep no state: they turn the latest NodeSnapshot into fresh metric families
(gpuwarden.families.MetricFamily) on every render. Learned from node_exporter (one file per domain,
``--collector.NAME``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwarden.catalog import COLLECTORS, FAMILIES, FAMILY, GPU_LABELS, Family
from gpuwarden.families import MetricFamily
from gpuwarden.model import GpuReading, GpuStatic
from gpuwarden.snapshot import NodeSnapshot


@dataclass(frozen=True)
class CollectOptions:
    """Knobs collectors read (from the configuration): the bound on per-process series per GPU, the node's name
    (None: the host name the source reports), the price of one GPU-hour by GPU model and for any other model, with
    their currency (None: not priced), and
    the HTTP server's count of connections it closed, by reason (None: no server, as in a replay test)."""

    max_processes_per_gpu: int = 16
    node_name: str | None = None
    price_per_gpu_hour: float | None = None
    gpu_hour_prices: Mapping[str, float] = field(default_factory=dict)  # by GPU model (NVML's name)
    currency: str = "USD"
    http_closed: Mapping[str, int] | None = None  # the HTTP server's closes by reason (HttpLimits.counts), live


#: Builds one hand-written family from the snapshot; None leaves the family out of this render.
Builder = Callable[[NodeSnapshot, CollectOptions, Family], MetricFamily | None]

_BUILDERS: dict[str, Builder] = {}
_BY_COLLECTOR: dict[str, tuple[Family, ...]] = {
    name: tuple(f for f in FAMILIES if f.collector == name) for name in COLLECTORS
}


def builds(name: str) -> Callable[[Builder], Builder]:
    """Register the decorated function as the builder of the hand-written family ``name``.

    Raises ValueError when ``name`` is not declared in the catalogue, is declared with a reading (it needs no
    builder) or already has one.
    """
    fam = FAMILY.get(name)
    if fam is None or fam.reading is not None or fam.static is not None:
        raise ValueError(f"family {name!r} is not a hand-written family of the catalogue")
    if name in _BUILDERS:
        raise ValueError(f"family {name!r} has two builders")

    def wrap(fn: Builder) -> Builder:
        _BUILDERS[name] = fn
        return fn

    return wrap


def collect(name: str, snap: NodeSnapshot, opts: CollectOptions) -> Iterator[MetricFamily]:
    """Yield collector ``name``'s families for ``snap``, in catalogue order. A declared family with no sample is
    left out (an unsupported reading is absent, never 0); a builder decides for its own family."""
    for fam in _BY_COLLECTOR[name]:
        if fam.reading is None and fam.static is None:
            metric = _BUILDERS[fam.name](snap, opts, fam)
        else:
            metric = declared(snap, fam)
        if metric is not None:
            yield metric


def missing_builders() -> list[str]:
    """Return the hand-written families of the catalogue that no collector module builds (a test keeps it empty)."""
    return [
        f.name
        for f in FAMILIES
        if f.reading is None and f.static is None and f.collector in COLLECTORS and f.name not in _BUILDERS
    ]


def new_family(fam: Family, doc: str | None = None) -> MetricFamily:
    """Return an empty family for the declaration ``fam`` (``doc`` overrides its help).

    Gauges and counters take ``fam.all_labels``; an info family takes the GPU labels (its own labels are the keys
    of each sample's value).
    """
    text = fam.help if doc is None else doc
    if fam.type == "info":
        return MetricFamily(fam.base_name, text, "info", GPU_LABELS if fam.per_gpu else ())
    return MetricFamily(fam.base_name, text, fam.type, fam.all_labels)


def new_values(fam: Family, doc: str | None = None) -> MetricFamily:
    """``new_family`` of a gauge or counter declaration: a family whose ``add_metric`` takes the label values and
    one number. Raises ValueError for an info declaration."""
    if fam.type == "info":
        raise ValueError(f"{fam.name} is an info family: it takes a mapping of labels per sample")
    return new_family(fam, doc)


#: Collectors whose families keep a lost GPU's last readings (``health_readings``): memory errors and remaps.
KEPT_WHEN_LOST = frozenset({"ecc"})


def gpu_label_values(g: GpuReading | GpuStatic) -> list[str]:
    """Return the values of the GPU labels for a GPU: [index as str, uuid]."""
    return [str(g.index), g.uuid]


def readings(snap: NodeSnapshot) -> Iterator[GpuReading]:
    """Yield the readings of every GPU that is up in the latest poll (none before the first poll)."""
    if snap.poll is None:
        return
    for g in snap.poll.gpus:
        if g.up:
            yield g


def health_readings(snap: NodeSnapshot) -> Iterator[GpuReading]:
    """Yield, for every GPU of the latest poll, its reading if it is up, else its last reading while it was up (a
    lost GPU's ECC counters and row remap state are still what it last reported, and are what its service needs);
    GPUs never seen up are left out."""
    if snap.poll is None:
        return
    for g in snap.poll.gpus:
        if g.up:
            yield g
        elif (last := snap.last_up.get(g.index)) is not None and last.uuid == g.uuid:
            yield last


@functools.lru_cache(maxsize=8192)
def gpu_rows(gpu: int, uuid: str, keys: tuple[str, ...] = ()) -> tuple[tuple[str, ...], ...]:
    """The label values of a GPU's series in a family whose one extra label takes ``keys`` (without keys: the GPU's
    one series, ``(index, uuid)``): made once per GPU and key set and the same tuples at every render, so the
    writer (gpuwarden.families.TextWriter) finds the last render's texts by identity."""
    if not keys:
        return ((str(gpu), uuid),)
    return tuple((str(gpu), uuid, k) for k in keys)


def add_grown(
    metric: MetricFamily, gpu: int, uuid: str, totals: Mapping[str, float] | None, order: Iterable[str]
) -> None:
    """Add to ``metric`` (a family with one label beyond the GPU's) a GPU's counters by key, in ``order``, for the keys
    whose counter has grown (is not 0): a counter still at 0 has no series, so a key that never occurred (an idle
    cause, a clock event reason) costs nothing. ``totals`` None or empty adds nothing."""
    if not totals:
        return
    keys = tuple(k for k in order if totals.get(k))
    if keys:
        metric.labels.extend(gpu_rows(gpu, uuid, keys))
        metric.numbers.extend([float(totals[k]) for k in keys])


@functools.lru_cache(maxsize=4096)
def gpu_key_rows(gpu: int, uuid: str, keys: tuple[tuple[str, ...], ...]) -> tuple[tuple[str, ...], ...]:
    """``gpu_rows`` for a family whose extra labels are several: each key the values of those labels."""
    return tuple((str(gpu), uuid, *k) for k in keys)


def _sources(snap: NodeSnapshot, fam: Family) -> tuple[list[GpuReading] | list[GpuStatic], list[tuple[str, ...]]]:
    """The GPUs that ``fam`` reads in ``snap`` (``readings``, ``health_readings`` or the statics) and each one's
    label row (``gpu_rows``)."""
    gpus: list[GpuReading] | list[GpuStatic]
    if fam.reading is None:
        gpus = list(snap.static.gpus)
    else:
        gpus = list(health_readings(snap) if fam.collector in KEPT_WHEN_LOST else readings(snap))
    return gpus, [gpu_rows(g.index, g.uuid)[0] for g in gpus]


def declared(snap: NodeSnapshot, fam: Family) -> MetricFamily | None:
    """Return the family of a declared field for every GPU that has it, or None when no GPU has it.

    ``fam.reading`` reads the up GPUs' ``GpuReading`` field, ``fam.static`` each GPU's ``GpuStatic`` field; a
    dict-valued field gives one sample per key (label ``fam.labels[0]``, keys sorted, or ``fam.keys`` in their order)
    unless ``fam.key`` picks one.
    The samples go straight into the family's columns (``MetricFamily.labels``, ``MetricFamily.numbers``): this runs
    for every declared family of every GPU at every render.
    """
    metric = new_values(fam)
    gpus, rows = _sources(snap, fam)
    attr = fam.reading if fam.reading is not None else fam.static
    assert attr is not None
    if fam.only_if is not None or not _one_number_each(metric, gpus, rows, attr, fam.key):
        _each(metric, snap, fam, gpus, attr)
    return metric if metric.numbers else None


def _one_number_each(
    metric: MetricFamily, gpus: Sequence[Any], rows: list[tuple[str, ...]], attr: str, key: str | None
) -> bool:
    """Fill ``metric`` with one number a GPU and return True, when every GPU of ``gpus`` has a number in ``attr``
    (the common case, in two C-level extends); False, ``metric`` untouched, otherwise."""
    values = [getattr(g, attr) for g in gpus]
    if key is not None:
        values = [v.get(key) if v.__class__ is dict else v for v in values]
    if None in values or any(v.__class__ is dict for v in values):
        return False
    metric.labels.extend(rows)
    metric.numbers.extend(map(float, values))
    return True


def _each(metric: MetricFamily, snap: NodeSnapshot, fam: Family, gpus: Sequence[Any], attr: str) -> None:
    """Fill ``metric`` GPU by GPU: the GPUs ``fam.only_if`` keeps, a dict-valued field a sample a key (or the one
    ``fam.key`` picks), nothing for a GPU without the value."""
    labels, numbers, key = metric.labels, metric.numbers, fam.key
    statics = {s.index: s for s in snap.static.gpus} if fam.only_if is not None else {}
    for g in gpus:
        if fam.only_if is not None:
            s = statics.get(g.index)
            if s is None or not getattr(s, fam.only_if):
                continue
        value = getattr(g, attr)
        if value is None:
            continue
        if value.__class__ is dict:
            if key is None:
                keys = tuple(sorted(value)) if fam.keys is None else tuple(k for k in fam.keys if k in value)
                labels.extend(gpu_rows(g.index, g.uuid, keys))
                numbers.extend([float(value[k]) for k in keys])
                continue
            value = value.get(key)
            if value is None:
                continue
        labels.append(gpu_rows(g.index, g.uuid)[0])
        numbers.append(float(value))
