"""Diagnosis: one verdict per GPU, with the numbers behind it and what to do (rules in docs/scores.md).

The parts: thresholds (gpuwarden.insight.vocabulary.thresholds), the window a rule reads (gpu_window), the evidence
shown (evidence), the peer test (peers), the rules (rules), their order and remedies (reasons), the served models
(verdicts).

``diagnose(window, peers)`` is a pure function of a GPU's window statistics (``GpuWindow``, built by the
analyzer) and those of the other GPUs of the same job. The verdict rules (gpuwarden.insight.rules.RULES) are tried
in VERDICT_ORDER (gpuwarden.insight.reasons) and the first that holds is the verdict; docs/scores.md's rule table is
generated from them. ``throttled``, ``memory_nearly_full``, ``host_phase`` (a working GPU's idle time while its job
works on the CPU, under the starved line), ``tensor_cores_idle``, ``straggler`` and the health findings (``hot``,
``uncorrectable_ecc``, ``xid_errors``, ``row_remap_pending``, ``row_remap_failed``) are also reported as findings
next to any verdict.

A GPU that cannot be read at all (lost, off the bus) gets ``gpu_lost`` (``lost``), critical.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwarden.insight.evidence import evidence_of
from gpuwarden.insight.gpu_window import GpuWindow, named, pct
from gpuwarden.insight.margins import MARGIN, VerdictMemory, alternatives
from gpuwarden.insight.peers import utilized, waiters
from gpuwarden.insight.reasons import REMEDIES, SEVERITY, first_verdict
from gpuwarden.insight.rules import RULES, Facts, input_source, throttled
from gpuwarden.insight.vocabulary.thresholds import (
    FP32_BUSY_MIN,
    HOST_PHASE_MIN,
    HOT_MARGIN_CELSIUS,
    MEMORY_FULL_RATIO,
    MIN_SECONDS,
    TENSOR_IDLE_MAX,
    THROTTLE_MIN_FRACTION,
)
from gpuwarden.insight.vocabulary.verdicts import Diagnosis


def _health(w: GpuWindow) -> list[tuple[str, str]]:
    """The health findings of ``w`` with one sentence each (the card's own thresholds, memory errors, XIDs)."""
    h, out = w.health, []
    if h.temperature_celsius is not None and h.slowdown_celsius is not None:
        if h.temperature_celsius >= h.slowdown_celsius - HOT_MARGIN_CELSIUS:
            out.append(("hot", f"GPU at {h.temperature_celsius:.0f} °C, slowdown at {h.slowdown_celsius:.0f} °C."))
    if h.memory_temperature_celsius is not None and h.memory_max_celsius is not None:
        if h.memory_temperature_celsius >= h.memory_max_celsius - HOT_MARGIN_CELSIUS and not out:
            out.append(
                ("hot", f"HBM at {h.memory_temperature_celsius:.0f} °C, its limit {h.memory_max_celsius:.0f} °C.")
            )
    if h.uncorrected_ecc:
        out.append(("uncorrectable_ecc", f"{h.uncorrected_ecc} uncorrectable ECC error(s) since the driver loaded."))
    if h.xids:
        out.append(("xid_errors", f"XID {', '.join(map(str, h.xids))} since gpuwarden started."))
    if h.remap_failed:
        out.append(("row_remap_failed", "A row remap failed."))
    elif h.remap_pending:
        out.append(("row_remap_pending", "A row remap is pending (needs a GPU reset)."))
    return out


@dataclass(frozen=True, slots=True)
class Decided:
    """A GPU's verdict as decided after a poll: its ``findings`` (the verdict first: what ``gpu_diagnosis``
    exports), and the Diagnosis made when first asked for (``diagnosis()``) from the decided ``fields`` and the
    evidence rows of ``window``. The rows and the model's validation are most of what a verdict costs (26 Evidence
    models per GPU), and only the JSON routes, the pages and the reports read them."""

    findings: tuple[str, ...]
    fields: dict[str, Any]  # the Diagnosis's fields but ``evidence``
    window: GpuWindow | None = None  # None: no evidence rows

    def diagnosis(self) -> Diagnosis:
        """Return the Diagnosis (a new validated model at each call: ``evidence_of(window)`` as its rows)."""
        evidence = evidence_of(self.window) if self.window is not None else []
        return Diagnosis.model_validate({**self.fields, "evidence": evidence})  # rows validated in pydantic-core


def lost(index: int, uuid: str, error: str) -> Decided:
    """Return the verdict on a GPU that could not be read at all this poll (``error``: NVML's, e.g. gpu_is_lost):
    ``gpu_lost``, with no evidence rows."""
    fields = {
        "gpu": index,
        "uuid": uuid,
        "verdict": "gpu_lost",
        "severity": SEVERITY["gpu_lost"],
        "summary": f"The GPU could not be read ({error}): it is lost to the node until it is reset.",
        "findings": ["gpu_lost"],
        "remedies": list(REMEDIES["gpu_lost"]),
        "window_seconds": 0.0,
    }
    return Decided(("gpu_lost",), fields)


def _findings(w: GpuWindow, peers: Sequence[GpuWindow], verdict: str) -> tuple[list[str], list[str]]:
    """The findings next to ``verdict`` (throttled, memory nearly full, a host phase, tensor cores idle, straggler,
    health, blind) and one sentence for each that says why (``blind`` has none: its remedy says it)."""
    findings: list[str] = []
    extra: list[str] = []
    for name, check in _CHECKS:
        text = check(w, peers, verdict)
        if text is not None:
            findings.append(name)
            extra.append(text)
    for name, text in _health(w):
        findings.append(name)
        extra.append(text)
    if verdict == "underutilized" and w.held and w.job_cpu_cores is None:
        findings.append("blind")
    return findings, extra


def _throttled(w: GpuWindow, peers: Sequence[GpuWindow], verdict: str) -> str | None:
    if verdict in ("throttled", "free") or not (utilized(w) and throttled(w)):
        return None
    return f"Clocks at {pct(w.sm_clock_ratio)} of max ({', '.join(w.throttle_reasons) or 'unknown reason'})."


def _memory_nearly_full(w: GpuWindow, peers: Sequence[GpuWindow], verdict: str) -> str | None:
    ratio = w.memory_used_ratio
    return f"Memory {pct(ratio)} full." if ratio is not None and ratio > MEMORY_FULL_RATIO else None


def _host_phase(w: GpuWindow, peers: Sequence[GpuWindow], verdict: str) -> str | None:
    if verdict not in _WORKING or w.share("starved") < HOST_PHASE_MIN:
        return None
    return (
        f"Host phase: the GPU idles {pct(w.share('starved'))} of the time while its job works on the host "
        f"({w.job_cpu_cores or 0.0:.2f} cores): GPU time lost between its busy phases, under the starved line."
    )


def _tensor_idle(w: GpuWindow, peers: Sequence[GpuWindow], verdict: str) -> str | None:
    if verdict != "compute_bound" or not _tensor_cores_idle(w):
        return None
    return f"Tensor cores {pct(w.tensor)} active while the FP32 pipes are {pct(w.fp32)}: no TF32/bf16."


def _straggler(w: GpuWindow, peers: Sequence[GpuWindow], verdict: str) -> str | None:
    waiting = waiters(w, peers)
    if not waiting or verdict == "waiting_on_peers":
        return None
    own = "" if w.rank is None else f" (rank {w.rank})"
    return f"Straggler of its job{own}: {', '.join(named(p) for p in waiting)} wait(s) on it."


#: The findings a window is checked for, in the order they are listed: each check returns its sentence, or None.
_CHECKS: tuple[tuple[str, Callable[[GpuWindow, Sequence[GpuWindow], str], str | None]], ...] = (
    ("throttled", _throttled),
    ("memory_nearly_full", _memory_nearly_full),
    ("host_phase", _host_phase),
    ("tensor_cores_idle", _tensor_idle),
    ("straggler", _straggler),
)


#: The verdicts of a GPU that mostly works, where a host phase under STARVED_MIN is a finding of its own.
_WORKING = ("compute_bound", "memory_bound", "underutilized")


def _tensor_cores_idle(w: GpuWindow) -> bool:
    """Tensor cores below TENSOR_IDLE_MAX while the FP32 pipes are at least FP32_BUSY_MIN (GPM)."""
    return w.tensor is not None and w.fp32 is not None and w.tensor < TENSOR_IDLE_MAX and w.fp32 >= FP32_BUSY_MIN


def diagnose(
    w: GpuWindow, peers: Sequence[GpuWindow] = (), previous: str | None = None, memory: VerdictMemory | None = None
) -> Diagnosis | None:
    """Return the verdict on GPU ``w`` given the other GPUs of its job (``peers``); None before MIN_SECONDS
    (``decide``, and its Diagnosis made)."""
    decided = decide(w, peers, previous, memory)
    return None if decided is None else decided.diagnosis()


def decide(
    w: GpuWindow, peers: Sequence[GpuWindow] = (), previous: str | None = None, memory: VerdictMemory | None = None
) -> Decided | None:
    """Return the verdict on GPU ``w`` given the other GPUs of its job (``peers``); None before MIN_SECONDS.

    The verdict is the first rule of VERDICT_ORDER that holds, unless ``previous`` (the verdict this GPU was last
    given for the same job) is among the verdicts the window gives with a value moved by the margin
    (gpuwarden.insight.margins): then it stays. The others within the margin are the Diagnosis's ``alternatives``
    (``memory``: where they were found last, reused while the window stays close to that one).
    """
    if w.seconds < MIN_SECONDS:
        return None
    verdict, summary = first_verdict(w, peers)
    near = memory.alternatives(w, peers, verdict) if memory is not None else alternatives(w, peers, verdict)
    if previous is not None and previous in near:
        near = [verdict, *(n for n in near if n != previous)]
        verdict, summary = previous, RULES[previous].summary(Facts(w, peers))
    if near:
        summary += (
            f" Near the line: within {MARGIN:.0%} of the numbers above the verdict would be "
            f"{' or '.join(n.replace('_', ' ') for n in near)}."
        )
    more, extra = _findings(w, peers, verdict)
    findings = [verdict, *more]
    remedies: list[str] = []
    order = [f for f in findings if SEVERITY[f] == "critical"] + [f for f in findings if SEVERITY[f] != "critical"]
    facts = Facts(w, peers)  # one for every finding: its values are computed once, when first asked
    for f in order:
        remedies.extend(led_by_evidence(f, REMEDIES[f], facts))
    levels = [SEVERITY[f] for f in findings]
    if "throttled" in findings and w.severe_throttle_fraction < THROTTLE_MIN_FRACTION:
        levels[findings.index("throttled")] = "info"  # a power cap at full load is expected, not a fault
    severity = max(levels, key=("ok", "info", "warning", "critical").index)
    fields = {
        "gpu": w.index,
        "uuid": w.uuid,
        "verdict": verdict,
        "severity": severity,
        "summary": " ".join([summary, *extra]),
        "findings": findings,
        "remedies": remedies,
        "window_seconds": round(w.seconds, 3),
        "job": w.job,
        "job_kind": w.job_kind,
        "alternatives": near,
    }
    return Decided(tuple(findings), fields, w)


#: For a verdict whose remedies answer several causes, the remedy its evidence points at (by the beginning of its
#: text), by where the input comes from (gpuwarden.insight.rules.input_source): remote storage for reads through
#: sockets or many short waits, a local cache for reads from storage; the order as written otherwise.
EVIDENCE_FIRST: dict[str, dict[str, str]] = {
    "input_starved": {"remote": "Input from remote storage", "waits": "Input from remote storage",
                      "storage": "Cache preprocessed data"},
}  # fmt: skip


def led_by_evidence(finding: str, remedies: Sequence[str], facts: Facts) -> list[str]:
    """``remedies`` of ``finding`` with the one its evidence points at first (EVIDENCE_FIRST), the others in their
    order; as they are where nothing points."""
    start = EVIDENCE_FIRST.get(finding, {}).get(input_source(facts)) if finding in EVIDENCE_FIRST else None
    if start is None:
        return list(remedies)
    return [r for r in remedies if r.startswith(start)] + [r for r in remedies if not r.startswith(start)]
