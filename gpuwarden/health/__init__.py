"""Readiness of each GPU for the next job: PASS, WARN or CRITICAL with the reason and the next action.

``assess(static, poll)`` renders one poll's readings (the NVML layer's NodeStatic and PollResult) as gpuwarden's own
samples, through the collectors that make the series the health rules read, and judges every GPU by each rule of
gpuwarden.health.rules: the conditions the health alerts fire on, declared once (a critical rule is CRITICAL, a
warning WARN; one read, so an alert's ``for`` does not apply), and two rules only a read before a job makes
(processes holding the GPU; NVLink links inactive while others are active). ``gpuwarden check`` (a Slurm prolog, a
Kubernetes init container) and the tests read the same function; ``NOT_READ`` says of every other alert why one read
cannot judge it. Thresholds given as parameters (the heat margin, the held-memory floor) are the shipped defaults
of gpuwarden/mixin/params.yml.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.samples import Sample
from pydantic import BaseModel, ConfigDict, Field

from gpuwarden.catalog import FAMILY
from gpuwarden.collectors import CollectOptions, collect
from gpuwarden.health.conditions import GpuKey, Match, gpu_key, shipped
from gpuwarden.health.rules import NOT_READ, RULES, HealthRule
from gpuwarden.model import NodeStatic, PollResult
from gpuwarden.snapshot import NodeSnapshot

__all__ = ["LEVELS", "NOT_READ", "RULES", "Finding", "GpuCheck", "assess", "worst"]

#: Levels, least severe first.
LEVELS = ("PASS", "WARN", "CRITICAL")
#: The collectors whose families the rules read (each series' family in the catalogue), sorted.
COLLECTORS = sorted(
    {
        FAMILY[s.metric].collector
        for rule in RULES
        for s in (*rule.when.series_read(), *((rule.names,) if rule.names else ()))
    }
)


class Finding(BaseModel):
    """One reason a GPU is not PASS: its level, what was seen, and what to do next."""

    model_config = ConfigDict(frozen=True)

    level: str
    reason: str
    action: str


class GpuCheck(BaseModel):
    """One GPU's readiness: its index, UUID and name, its level (the worst of its findings; PASS with none)."""

    model_config = ConfigDict(frozen=True)

    gpu: int
    uuid: str
    name: str = ""
    level: str
    findings: list[Finding] = Field(default_factory=list)


def samples(static: NodeStatic, poll: PollResult) -> Iterator[Sample]:
    """gpuwarden's samples for ``poll`` (prometheus_client's), of the collectors the rules read (COLLECTORS): what a
    scrape of the daemon would show of these readings."""
    snap = NodeSnapshot(seq=1, source="check", static=static, poll=poll, interval_seconds=0.0)
    for name in COLLECTORS:
        for family in collect(name, snap, CollectOptions()):
            yield from family.samples


class _Fields(dict[str, Any]):
    """A finding's format fields; a label no matching series has reads "?"."""

    def __missing__(self, key: str) -> str:
        return "?"


def _fields(found: list[Match], named: list[Sample]) -> Mapping[str, Any]:
    """The format fields of a rule's finding (HealthRule.finding): the first match's value, the value it was compared
    with, and each label's distinct values over the matches and ``named`` joined."""
    out = _Fields(value=found[0].value, than=found[0].than, gib=found[0].value / 2**30)
    labels: dict[str, list[str]] = {}
    for lab in [m.labels for m in found] + [s.labels for s in named]:
        for k, v in lab.items():
            if v not in labels.setdefault(k, []):
                labels[k].append(v)
    out.update({k: ", ".join(v) for k, v in labels.items() if k not in out})
    return out


def findings(rules: tuple[HealthRule, ...], every: list[Sample]) -> dict[GpuKey, list[Finding]]:
    """Each GPU's findings among the samples ``every`` of one render, by ``rules`` in their order: GPU (gpu, uuid)
    label values -> its findings (a GPU with none is absent)."""
    out: dict[GpuKey, list[Finding]] = {}
    for rule in rules:
        for gpu, found in rule.when.matches(every, shipped).items():
            named = [s for s in every if rule.names.selects(s) and gpu_key(s.labels) == gpu] if rule.names else []
            reason = rule.finding.format_map(_fields(found, named))
            out.setdefault(gpu, []).append(Finding(level=rule.level, reason=reason, action=rule.action))
    return out


def assess(static: NodeStatic, poll: PollResult) -> list[GpuCheck]:
    """Return each GPU's readiness at ``poll`` (in index order): its level, the worst of its findings. Raises
    nothing for any reading."""
    statics = {s.uuid: s for s in static.gpus}
    found = findings(RULES, list(samples(static, poll)))
    out = []
    for g in sorted(poll.gpus, key=lambda r: r.index):
        s = statics.get(g.uuid)
        mine = found.get((str(g.index), g.uuid), [])
        level = max((f.level for f in mine), key=LEVELS.index, default="PASS")
        out.append(GpuCheck(gpu=g.index, uuid=g.uuid, name=s.name if s else "", level=level, findings=mine))
    return out


def worst(checks: list[GpuCheck]) -> str:
    """The worst level of ``checks`` (PASS for none)."""
    return max((c.level for c in checks), key=LEVELS.index, default="PASS")
