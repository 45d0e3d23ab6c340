"""A health rule's condition, declared once and read two ways: as PromQL (the alert, ``top --quality``'s history) and
over one render of gpuwarden's own samples (``gpuwarden check``).

A condition is one comparison of a gauge of a GPU with a number or with another gauge of the same GPU, optionally
joined (``and``) with a second condition on the same GPU: the shape every health alert that one read can judge has
(``gpu_row_remap_failure == 1``; ``gpu_temperature_celsius >= ignoring (threshold)
gpu_temperature_threshold_celsius{threshold="slowdown"} - 5``; ``gpu_memory_used_bytes > 1 GiB and
gpu_compute_processes == 0``). It is data, not a parser: PromQL is written from it, and ``matches`` evaluates it
over prometheus_client samples with PromQL's semantics for these operators (a label matcher is ``=``, ``!=``, ``=~``
or ``!~``, regular expressions anchored at both ends; a comparison between two series matches them one to one on
their labels, less those in ``ignoring``, and keeps the left side's value; ``and`` keeps the left side's series of a
GPU the right side has).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.samples import Sample

from gpuwarden.insight.vocabulary.thresholds import ALERT_PARAMS

#: The comparison operators a condition may use, with Python's.
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
#: A label matcher's operators.
_MATCHERS: dict[str, Callable[[str, str], bool]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "=~": lambda value, pattern: re.fullmatch(pattern, value) is not None,
    "!~": lambda value, pattern: re.fullmatch(pattern, value) is None,
}


def shipped(name: str) -> float:
    """The shipped value of the alert rules' parameter ``name`` (gpuwarden/mixin/params.yml), as a number: what a
    condition's parameter is outside the alert rules. Raises KeyError for a parameter the file does not have,
    ValueError for one that is no number."""
    return float(str(ALERT_PARAMS[name]))


def number(x: float) -> str:
    """``x`` as a PromQL number literal, exactly (``1073741824``, ``0.5``; ``%g`` would round it)."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


#: A GPU's key among one render's samples: its (gpu, uuid) label values.
GpuKey = tuple[str, str]


@dataclass(frozen=True)
class Series:
    """The series of one metric ``metric`` (its exposed name: a counter's with ``_total``) that ``matchers`` select,
    each (label, operator, value) with a PromQL matcher's operator (=, !=, =~, !~). Raises ValueError for another
    operator."""

    metric: str
    matchers: tuple[tuple[str, str, str], ...] = ()

    def __post_init__(self) -> None:
        bad = [op for _, op, _ in self.matchers if op not in _MATCHERS]
        if bad:
            raise ValueError(f"{self.metric}: label matcher operator {bad[0]!r}: one of {', '.join(_MATCHERS)}")

    @property
    def matcher_text(self) -> str:
        """The matchers as PromQL: ``type="uncorrected", counter="volatile"`` ("" for none)."""
        return ", ".join(f'{label}{op}"{value}"' for label, op, value in self.matchers)

    def selects(self, sample: Sample) -> bool:
        """True when ``sample`` (prometheus_client's) is of this metric and its labels pass every matcher (a label
        the sample lacks reads "", as in PromQL)."""
        return sample.name == self.metric and all(
            _MATCHERS[op](sample.labels.get(label, ""), value) for label, op, value in self.matchers
        )


#: Writes a series' selector: (metric, matcher text) -> PromQL, with the caller's own matchers added.
Selector = Callable[[str, str], str]


@dataclass(frozen=True)
class Condition:
    """``series op value``, or with ``than`` ``series op ignoring (ignoring) than - value`` (a margin below another
    gauge of the GPU); ``also``: a second condition the GPU must meet as well (PromQL's ``and`` on the GPU's labels).
    ``value`` is a number, or the name of a parameter of gpuwarden/mixin/params.yml (the alert reads a site's value,
    ``check`` the shipped default). Raises ValueError for an operator not in OPERATORS."""

    series: Series
    op: str
    value: float | str = 0.0
    than: Series | None = None
    ignoring: tuple[str, ...] = ()
    also: Condition | None = None

    def __post_init__(self) -> None:
        if self.op not in OPERATORS:
            raise ValueError(f"comparison {self.op!r}: one of {', '.join(OPERATORS)}")

    def series_read(self) -> tuple[Series, ...]:
        """Every series the condition reads (its own, ``than``'s and ``also``'s)."""
        own = (self.series,) + ((self.than,) if self.than is not None else ())
        return own + (self.also.series_read() if self.also is not None else ())

    def promql(self, select: Selector, param: Callable[[str], str]) -> str:
        """The condition as PromQL: ``select`` writes each series' selector, ``param`` a parameter's text (the alert
        template's ``@{name}``, or a value)."""
        value = param(self.value) if isinstance(self.value, str) else number(self.value)
        left = select(self.series.metric, self.series.matcher_text)
        if self.than is None:
            text = f"{left} {self.op} {value}"
        else:
            match = f" ignoring ({', '.join(self.ignoring)})" if self.ignoring else ""
            right = select(self.than.metric, self.than.matcher_text)
            text = f"{left}\n{self.op}{match} {right}" + (f" - {value}" if value != "0" else "")
        if self.also is not None:
            text += f"\nand on (instance, job, gpu, uuid) {self.also.promql(select, param)}"
        return text

    def matches(self, samples: Iterable[Sample], param: Callable[[str], float]) -> dict[GpuKey, list[Match]]:
        """The series of each GPU that meet the condition among ``samples`` (one render's, prometheus_client's): GPU
        key -> its matches of ``series`` in sample order (a GPU with none, or that ``also`` leaves out, is absent).
        ``param`` reads a parameter's number."""
        samples = list(samples)
        value = param(self.value) if isinstance(self.value, str) else float(self.value)
        compare = OPERATORS[self.op]
        rights: dict[frozenset[tuple[str, str]], float] = {}
        if self.than is not None:
            rights = {_without(s.labels, self.ignoring): s.value for s in samples if self.than.selects(s)}
        out: dict[GpuKey, list[Match]] = {}
        for s in samples:
            if not self.series.selects(s):
                continue
            if self.than is None:
                than = None
                met = compare(s.value, value)
            else:
                than = rights.get(_without(s.labels, self.ignoring))
                met = than is not None and compare(s.value, than - value)
            if met:
                out.setdefault(gpu_key(s.labels), []).append(Match(s.labels, s.value, than))
        if self.also is not None:
            both = self.also.matches(samples, param)
            out = {gpu: found for gpu, found in out.items() if gpu in both}
        return out


@dataclass(frozen=True)
class Match:
    """One series that met a condition: its ``labels``, its ``value``, and ``than``, the value it was compared with
    where that was another series (None for a number)."""

    labels: Mapping[str, str]
    value: float
    than: float | None = None


def _without(labels: Mapping[str, str], ignoring: tuple[str, ...]) -> frozenset[tuple[str, str]]:
    return frozenset((k, v) for k, v in labels.items() if k not in ignoring)


def gpu_key(labels: Mapping[str, str]) -> GpuKey:
    """The GPU a series of gpuwarden is about: its (gpu, uuid) label values ("" for one it lacks)."""
    return labels.get("gpu", ""), labels.get("uuid", "")
