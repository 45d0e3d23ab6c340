"""Every reason the diagnosis can give (``REASON_TABLE``: severity, remedies): the verdicts, each declared once as
a row of gpuwarden.insight.rules.RULES (its rule, summary, severity and remedies; the rows' order is the order in
which the rules are tried, ``VERDICT_ORDER``: the first that holds is the verdict), and the findings
(``FINDINGS``). docs/scores.md's rule table is generated from them (``rule_table``; ``python3 -m gpuwarden.docs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuwarden.insight.gpu_window import GpuWindow
from gpuwarden.insight.rules import RULES, Facts, Rule


@dataclass(frozen=True)
class Reason:
    """One reason of the diagnosis: ``name`` (a gpu_diagnosis reason label), ``severity`` (ok, info, warning,
    critical) and ``remedies`` (what to do, most useful first)."""

    name: str
    severity: str
    remedies: tuple[str, ...]


#: The verdicts in the order their rules are tried (the first that holds for a window is its verdict): the order of
#: gpuwarden.insight.rules.RULES, where each verdict is declared once.
VERDICT_ORDER: tuple[str, ...] = tuple(RULES)

#: The reasons that are not verdicts: findings reported next to a verdict (or ``gpu_lost``, from ``lost``), each
#: with its severity and what to do.
FINDINGS: tuple[Reason, ...] = (
    Reason(
        "memory_nearly_full",
        "info",
        (
            "Over 90% of GPU memory is used: expect out-of-memory errors on growth; use smaller batches, "
            "activation checkpointing, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against "
            "fragmentation.",
        ),
    ),
    Reason(
        "host_phase",
        "info",
        (
            "Overlap or shorten what the job does on the host between GPU phases (gpu_idle_seconds_total's causes say "
            "which): metrics on the GPU with scalars copied, evaluation less often or in another process, the next "
            "input prefetched, checkpoints written asynchronously.",
        ),
    ),
    Reason(
        "tensor_cores_idle",
        "info",
        (
            "The math runs on the FP32 pipes with the tensor cores idle: enable TF32 "
            "(torch.backends.cuda.matmul.allow_tf32 = True, torch.set_float32_matmul_precision('high')) or train "
            "in bf16 with torch.autocast.",
        ),
    ),
    Reason(
        "straggler",
        "warning",
        (
            "The other GPUs of this job wait on this one: give it less work (balance shards, sequence lengths or "
            "the input pipeline across ranks) or find what slows it (its own verdict).",
        ),
    ),
    Reason(
        "hot",
        "warning",
        (
            "The GPU runs within a few degrees of its own slowdown threshold: check airflow, fans, inlet temperature "
            "and neighbouring cards before the clocks drop (nvidia-smi -q -d TEMPERATURE).",
        ),
    ),
    Reason(
        "uncorrectable_ecc",
        "critical",
        (
            "Uncorrectable memory errors since the driver loaded: drain the GPU, reset it (nvidia-smi -r) so rows are "
            "remapped, and replace it if errors return.",
        ),
    ),
    Reason(
        "xid_errors",
        "warning",
        (
            "The driver reported XID errors on this GPU: look each code up in NVIDIA's XID catalog "
            "(dmesg | grep -i xid) and follow its recovery action.",
        ),
    ),
    Reason(
        "row_remap_pending", "warning", ("A memory row remap is pending: reset the GPU to apply it (drain it first).",)
    ),
    Reason(
        "row_remap_failed",
        "critical",
        ("A row remap failed: the GPU's memory cannot be repaired in place; service the GPU.",),
    ),
    Reason(
        "blind",
        "info",
        (
            "gpuwarden cannot see this GPU's processes or their CPU: run it in the host PID namespace (hostPID: true, "
            "or --pid=host) with /proc and the cgroup mount readable, so the diagnosis can tell input, pauses and "
            "launch overhead apart.",
        ),
    ),
    Reason(
        "gpu_lost",
        "critical",
        (
            "The GPU does not answer (NVML_ERROR_GPU_IS_LOST: fallen off the bus, XID 79): drain the node, check "
            "dmesg for XID 79 and PCIe/power errors, reset the GPU (nvidia-smi -r) or reboot; replace it if it recurs.",
        ),
    ),
)


#: Every reason a GPU can be given, in the order gpu_diagnosis{reason} lists them: the verdicts (their severity and
#: remedies from their rule), then the findings.
REASON_TABLE: tuple[Reason, ...] = (*(Reason(n, r.severity, r.remedies) for n, r in RULES.items()), *FINDINGS)
#: Derived from REASON_TABLE: the reason names, each one's severity and remedies.
REASONS = tuple(r.name for r in REASON_TABLE)
SEVERITY = {r.name: r.severity for r in REASON_TABLE}
REMEDIES: dict[str, tuple[str, ...]] = {r.name: r.remedies for r in REASON_TABLE}
#: The verdict rules in VERDICT_ORDER.
VERDICT_RULES: tuple[tuple[str, Rule], ...] = tuple((name, RULES[name]) for name in VERDICT_ORDER)


def verdict_of(w: GpuWindow, peers: Sequence[GpuWindow]) -> str:
    """Return the first verdict of VERDICT_ORDER whose rule holds for window ``w`` (``peers``: the other GPUs of its
    job), without its summary. Raises nothing."""
    return verdict_of_facts(Facts(w, peers))


def verdict_of_facts(facts: Facts) -> str:
    """``verdict_of`` for the window and peers of ``facts``."""
    return next(n for n, r in VERDICT_RULES if r.when is None or r.when(facts))


def first_verdict(w: GpuWindow, peers: Sequence[GpuWindow]) -> tuple[str, str]:
    """Return the first verdict of VERDICT_ORDER whose rule holds for window ``w`` (``peers``: the other GPUs of its
    job), and its one-line summary. Raises nothing (``underutilized`` always holds)."""
    facts = Facts(w, peers)
    name, rule = next((n, r) for n, r in VERDICT_RULES if r.when is None or r.when(facts))
    return name, rule.summary(facts)


def rule_table() -> str:
    """Return the verdict rule table of docs/scores.md (Markdown, one row per verdict in VERDICT_ORDER, ``gpu_lost``
    before the last resort), from RULES."""
    rows = ["| # | verdict | rule | source of the numbers |", "|---|---|---|---|"]
    for i, (name, rule) in enumerate(VERDICT_RULES, start=1):
        if name == VERDICT_ORDER[-1]:
            rows.append(
                "| - | `gpu_lost` | the GPU could not be read at all this poll (NVML_ERROR_GPU_IS_LOST: off the bus), "
                "critical | [NVML] |"
            )
        rows.append(f"| {i} | `{name}` | {rule.text} | {rule.grounds} |")
    return "\n".join(rows) + "\n"
