"""Metric families as the collectors build them and the exposition writes them: each sample a row of label values
and a number, the label names once per family.

prometheus_client's metric families keep each sample as a named tuple with a dict of labels, built on every
``add_metric``, and its encoders escape and format every label of every sample on every scrape (47-51% of the
daemon's CPU samples at 8 GPUs, 31 ms of a 64-GPU render). ``MetricFamily`` keeps columns instead (each sample's
label values, its number), and ``TextWriter`` renders them in either text format with each series'
name-and-labels text made once and kept while the series is in the exposition: per render, a family whose series are
the same as in the last render costs C-level joins of its kept texts and its numbers' ``repr``.

The output is byte for byte what prometheus_client's encoders write for the same families (the text format 0.0.4,
``generate_latest``, and OpenMetrics 1.0, ``openmetrics.exposition.generate_latest``): the same TYPE munging (a
counter's samples and, in the text format, its HELP and TYPE named ``_total``; an info family a gauge named ``_info``
in the text format), labels sorted by name, the same escaping of label values (backslash, newline, double quote) and
of HELP text (backslash and newline; and double quote in OpenMetrics), values written by prometheus_client's own
``floatToGoString``. gpuwarden's metric and label names are legacy Prometheus names (the catalogue's test holds
them to it), which neither encoder rewrites. ``MetricFamily.samples`` gives prometheus_client's samples for anything
that wants its types (tests, ``generate_latest`` in bench/profile.py, which compares the two byte for byte).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from operator import add

from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

_TYPES = ("gauge", "counter", "info")


class MetricFamily:
    """One metric family: its base ``name`` (a counter's without ``_total``, an info family's without ``_info``, as
    prometheus_client names them), ``documentation``, ``type`` (gauge, counter or info), ``labelnames``, and its
    samples as columns: ``labels`` (each sample's label values), ``numbers`` (each sample's value) and, for an info
    family, ``names`` (each sample's label names: ``labelnames`` and the keys of its own labels; None for a gauge or
    counter, whose samples all take ``labelnames``). Raises ValueError for another type."""

    __slots__ = ("name", "documentation", "type", "labelnames", "labels", "numbers", "names", "unit")

    def __init__(self, name: str, documentation: str, typ: str, labelnames: Sequence[str] = ()) -> None:
        if typ not in _TYPES:
            raise ValueError(f"series type {typ!r}: one of {', '.join(_TYPES)}")
        self.name, self.documentation, self.type = name, documentation, typ
        self.labelnames = tuple(labelnames)
        self.labels: list[tuple[str, ...]] = []
        self.numbers: list[float] = []
        self.names: list[tuple[str, ...]] | None = [] if typ == "info" else None
        self.unit = ""

    def add_metric(self, labels: Sequence[str], value: float | Mapping[str, str]) -> None:
        """Add a sample: the values of ``labelnames``, and its number; for an info family, ``value`` is the mapping
        of its own labels (the sample's value is 1)."""
        cls = value.__class__
        if cls is float or cls is int or not isinstance(value, Mapping):  # an ABC check only for what is no number
            self.labels.append(tuple(labels))
            self.numbers.append(float(value))  # type: ignore[arg-type]
            if self.names is not None:
                self.names.append(self.labelnames)
        else:
            self.labels.append((*labels, *value.values()))
            self.numbers.append(1.0)
            if self.names is None:
                raise ValueError(f"{self.name}: a mapping of labels is a sample of an info family")
            self.names.append(self.labelnames + tuple(value))

    def __len__(self) -> int:
        return len(self.numbers)

    @property
    def sample_name(self) -> str:
        """The name each sample carries: ``NAME_total`` for a counter, ``NAME_info`` for an info family."""
        return self.name + ("_total" if self.type == "counter" else "_info" if self.type == "info" else "")

    def label_names(self) -> list[tuple[str, ...]]:
        """Each sample's label names (``names``, or ``labelnames`` for every sample of a gauge or counter)."""
        return self.names if self.names is not None else [self.labelnames] * len(self.labels)

    @property
    def samples(self) -> list[Sample]:
        """The samples as prometheus_client's (labels as dicts), made on each call: for tests and comparisons."""
        name = self.sample_name
        return [
            Sample(name, dict(zip(names, values, strict=True)), v, None, None)
            for names, values, v in zip(self.label_names(), self.labels, self.numbers, strict=True)
        ]


def _escape_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    """``{a="x",b="y"}``: the labels sorted by name, values escaped; "" without labels."""
    if not names:
        return ""
    pairs = sorted(zip(names, values, strict=True))
    return "{" + ",".join(f'{k}="{_escape_value(v)}"' for k, v in pairs) + "}"


#: Below this, a positive number's ``repr`` is what prometheus_client's floatToGoString writes (Go switches to an
#: exponent at 7 integer digits, Python's repr at 17); so is a finite negative number's.
_REPR_BELOW = 1e6


def _values(numbers: list[float]) -> Iterable[str]:
    """Each number as prometheus_client writes it (``floatToGoString``): a C-level ``repr`` over the whole column
    when every number is finite and below _REPR_BELOW (the sum is finite only when every number is); else per
    number, ``repr`` below _REPR_BELOW, floatToGoString at or above it and for NaN and the infinities."""
    if math.isfinite(sum(numbers)) and (not numbers or max(numbers) < _REPR_BELOW):
        return map(repr, numbers)
    return [
        repr(v) if -math.inf < v < _REPR_BELOW else floatToGoString(v)  # type: ignore[no-untyped-call]
        for v in numbers
    ]


class _Kept:
    """One family's series of the last render: their label names and values, and the name-and-labels text of each
    (``NAME{labels} ``)."""

    __slots__ = ("names", "labels", "prefixes")

    def __init__(self, names: list[tuple[str, ...]] | None, labels: list[tuple[str, ...]], prefixes: list[str]):
        self.names, self.labels, self.prefixes = names, labels, prefixes


class TextWriter:
    """Writes metric families in the text format 0.0.4 (``openmetrics`` False) or OpenMetrics 1.0: each family's HELP
    and TYPE lines and each series' name-and-labels text made once and kept while the series is written (the families
    of the last render are kept; a series gone from its family is forgotten), the values formatted per render. A
    family whose label values are those of the last render, in the same order, reuses its texts as they are; one that
    changed remakes only the texts of series it did not have. Not thread-safe."""

    def __init__(self, openmetrics: bool) -> None:
        self.openmetrics = openmetrics
        self._headers: dict[tuple[str, str, str], bytes] = {}
        self._kept: dict[str, _Kept] = {}

    def _header(self, fam: MetricFamily) -> bytes:
        key = (fam.name, fam.type, fam.documentation)
        text = self._headers.get(key)
        if text is None:
            doc = fam.documentation.replace("\\", "\\\\").replace("\n", "\\n")
            if self.openmetrics:
                doc = doc.replace('"', '\\"')
                name, typ = fam.name, fam.type
            else:
                name = fam.sample_name
                typ = "gauge" if fam.type == "info" else fam.type
            text = self._headers[key] = f"# HELP {name} {doc}\n# TYPE {name} {typ}\n".encode()
        return text

    def _prefixes(self, fam: MetricFamily, kept: _Kept | None) -> list[str]:
        """The name-and-labels text of each of ``fam``'s series, those of ``kept`` (the last render's) reused."""
        if kept is not None and kept.labels == fam.labels and kept.names == fam.names:
            return kept.prefixes
        known: dict[tuple[tuple[str, ...], tuple[str, ...]], str] = {}
        if kept is not None:
            old_names = kept.names if kept.names is not None else [fam.labelnames] * len(kept.labels)
            known = dict(zip(zip(old_names, kept.labels, strict=True), kept.prefixes, strict=True))
        name = fam.sample_name
        prefixes = []
        for key in zip(fam.label_names(), fam.labels, strict=True):
            prefix = known.get(key)
            if prefix is None:
                prefix = f"{name}{_labels(*key)} "
            prefixes.append(prefix)
        return prefixes

    def render(self, families: Iterable[MetricFamily]) -> bytes:
        """The exposition of ``families``, in order (OpenMetrics closed by ``# EOF``), as UTF-8 bytes."""
        parts: list[bytes] = []
        append = parts.append
        old, kept = self._kept, {}
        for fam in families:
            append(self._header(fam))
            if not fam.numbers:
                continue
            prefixes = self._prefixes(fam, old.get(fam.name))
            kept[fam.name] = _Kept(fam.names, fam.labels, prefixes)
            append(("\n".join(map(add, prefixes, _values(fam.numbers))) + "\n").encode())
        if self.openmetrics:
            append(b"# EOF\n")
        self._kept = kept
        return b"".join(parts)
