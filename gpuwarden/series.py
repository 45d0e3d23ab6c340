"""Metric families as the collectors build them and the exposition writes them: each sample a row of label values
and a number, the label names once per family.

prometheus_client's metric families keep each sample as a named tuple with a dict of labels, built on every
``add_metric``, and its encoders escape and format every label of every sample on every scrape (47-51% of the
daemon's CPU samples at 8 GPUs, 31 ms of a 64-GPU render: docs/performance.md). ``Series`` keeps rows of label
values instead, and ``TextWriter`` renders them in either text format with each series' name-and-labels text made
once and kept while the series is in the exposition: only values are formatted per render.

The output is byte for byte what prometheus_client's encoders write for the same families (the text format 0.0.4,
``generate_latest``, and OpenMetrics 1.0, ``openmetrics.exposition.generate_latest``): the same TYPE munging (a
counter's samples and, in the text format, its HELP and TYPE named ``_total``; an info family a gauge named ``_info``
in the text format), labels sorted by name, the same escaping of label values (backslash, newline, double quote) and
of HELP text (backslash and newline; and double quote in OpenMetrics), values written by prometheus_client's own
``floatToGoString``. gpuwarden's metric and label names are legacy Prometheus names (the catalogue's test holds
them to it), which neither encoder rewrites. ``Series.samples`` gives prometheus_client's samples for anything that
wants its types (tests, ``generate_latest`` in bench/profile.py, which compares the two byte for byte).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

_TYPES = ("gauge", "counter", "info")


class Series:
    """One metric family: its base ``name`` (a counter's without ``_total``, an info family's without ``_info``, as
    prometheus_client names them), ``documentation``, ``type`` (gauge, counter or info), ``labelnames``, and its
    ``rows``: (label names, label values, value) per sample. Raises ValueError for another type."""

    __slots__ = ("name", "documentation", "type", "labelnames", "rows", "unit")

    def __init__(self, name: str, documentation: str, typ: str, labelnames: Sequence[str] = ()) -> None:
        if typ not in _TYPES:
            raise ValueError(f"series type {typ!r}: one of {', '.join(_TYPES)}")
        self.name, self.documentation, self.type = name, documentation, typ
        self.labelnames = tuple(labelnames)
        self.rows: list[tuple[tuple[str, ...], tuple[str, ...], float]] = []
        self.unit = ""

    def add_metric(self, labels: Sequence[str], value: float | Mapping[str, str]) -> None:
        """Add a sample: the values of ``labelnames``, and its number; for an info family, ``value`` is the mapping
        of its own labels (the sample's value is 1)."""
        cls = value.__class__
        if cls is float or cls is int or not isinstance(value, Mapping):  # an ABC check only for what is no number
            self.rows.append((self.labelnames, tuple(labels), float(value)))  # type: ignore[arg-type]
        else:
            self.rows.append((self.labelnames + tuple(value), (*labels, *value.values()), 1.0))

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def sample_name(self) -> str:
        """The name each sample carries: ``NAME_total`` for a counter, ``NAME_info`` for an info family."""
        return self.name + ("_total" if self.type == "counter" else "_info" if self.type == "info" else "")

    @property
    def samples(self) -> list[Sample]:
        """The samples as prometheus_client's (labels as dicts), made on each call: for tests and comparisons."""
        name = self.sample_name
        return [Sample(name, dict(zip(names, values, strict=True)), v, None, None) for names, values, v in self.rows]


def _escape_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    """``{a="x",b="y"}``: the labels sorted by name, values escaped; "" without labels."""
    if not names:
        return ""
    pairs = sorted(zip(names, values, strict=True))
    return "{" + ",".join(f'{k}="{_escape_value(v)}"' for k, v in pairs) + "}"


#: How many formatted values are kept (0.0, 1.0, small counts recur in every render).
_VALUE_CACHE = 4096


class TextWriter:
    """Writes Series in the text format 0.0.4 (``openmetrics`` False) or OpenMetrics 1.0: each family's HELP and TYPE
    lines and each series' name-and-labels text made once and kept while the series is written (the series of the
    last render are kept; one gone from it is forgotten), each value formatted per render. Not thread-safe."""

    def __init__(self, openmetrics: bool) -> None:
        self.openmetrics = openmetrics
        self._headers: dict[tuple[str, str, str], bytes] = {}
        self._prefixes: dict[tuple[str, tuple[str, ...], tuple[str, ...]], bytes] = {}
        self._values: dict[float, bytes] = {}

    def _header(self, fam: Series) -> bytes:
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

    def _value(self, value: float) -> bytes:
        text = self._values.get(value)
        if text is None:
            if len(self._values) >= _VALUE_CACHE:
                self._values.clear()
            text = self._values[value] = (floatToGoString(value) + "\n").encode()  # type: ignore[no-untyped-call]
        return text

    def render(self, families: Iterable[Series]) -> bytes:
        """The exposition of ``families``, in order (OpenMetrics closed by ``# EOF``), as UTF-8 bytes."""
        parts: list[bytes] = []
        append = parts.append
        old, kept = self._prefixes, {}
        value = self._value
        for fam in families:
            append(self._header(fam))
            name = fam.sample_name
            for names, values, number in fam.rows:
                key = (name, names, values)
                prefix = old.get(key)
                if prefix is None:
                    prefix = f"{name}{_labels(names, values)} ".encode()
                kept[key] = prefix
                append(prefix)
                append(value(number))
        if self.openmetrics:
            append(b"# EOF\n")
        self._prefixes = kept
        return b"".join(parts)
