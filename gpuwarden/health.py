"""Readiness of each GPU for the next job: PASS, WARN or CRITICAL with the reason and the next action.

``assess(static, poll)`` is a pure function of one poll's readings (the NVML layer's NodeStatic and PollResult), so
``gpuwarden check`` (a Slurm prolog, a Kubernetes init container) and the tests read the same rules. The rules are
those of the on-call alerts (alerts/gpuwarden.rules.yml), read once at a job's start (``ALERTS`` says of every alert
whether it is read, and why not):

CRITICAL (the job should not start here)
- the GPU cannot be read (NVML: GPU is lost, unknown error) - GpuLost;
- the driver asks for a recovery (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION > 0) - GpuRecoveryActionNeeded;
- a row remap failed (nvmlDeviceGetRemappedRows) - GpuRowRemapFailure;
- uncorrectable ECC errors since the driver loaded (volatile counter) - GpuUncorrectableEccErrors;
- the GPU at or above its own slowdown temperature before any work (cooling) - GpuOverheating;
- the GPU's NVLink fabric not registered (state not ``completed``) - GpuFabricNotReady: it is not in its NVLink
  domain.

WARN (the job can start; the node needs a look)
- a row remap pending (applied at the next reset) - GpuRowRemapPending;
- the GPU within HOT_MARGIN_CELSIUS of its slowdown temperature, or HBM within it of its limit -
  GpuMemoryOverheating;
- a hardware slowdown or power-brake clock event active - GpuHardwareSlowdown;
- the PCIe link narrower than its maximum width - GpuPcieLinkDegraded (the link's generation drops at idle to save
  power, so only the width counts);
- processes hold the GPU, or memory is used with none visible: an earlier job's leftovers -
  GpuMemoryHeldWithoutProcess;
- NVLink links inactive while others of the GPU are active - GpuNvlinkLinkDown (a GPU whose links are all inactive
  may not use NVLink at all: not judged); a fabric health check reporting a problem - GpuFabricUnhealthy.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpuwarden.catalog import CLOCK_EVENT_REASONS
from gpuwarden.insight.thresholds import HOT_MARGIN_CELSIUS  # the diagnosis's "hot", the alerts' 5 °C
from gpuwarden.model import GpuReading, GpuStatic, NodeStatic, PollResult

#: Levels, least severe first.
LEVELS = ("PASS", "WARN", "CRITICAL")
#: Every alert of alerts/gpuwarden.rules.yml and what ``check`` does with it: ``read`` where one read at a job's start
#: judges it (a rule of this module), else why not. tests/test_readiness.py holds the keys to the rules file, so a new
#: alert is placed here on purpose, never left out unseen. ``check --prometheus`` adds the history of the service
#: tier (errors, links, fail-slow: gpuwarden.cluster.quality) to the one read.
ALERTS = {
    "GpuLost": "read",
    "GpuRecoveryActionNeeded": "read",
    "GpuRowRemapFailure": "read",
    "GpuUncorrectableEccErrors": "read",
    "GpuFabricNotReady": "read",
    "GpuOverheating": "read (before any work: at or above the slowdown temperature)",
    "GpuMemoryOverheating": "read (near the memory's limit: WARN)",
    "GpuRowRemapPending": "read",
    "GpuHardwareSlowdown": "read",
    "GpuPcieLinkDegraded": "read",
    "GpuNvlinkLinkDown": "read",
    "GpuFabricUnhealthy": "read",
    "GpuMemoryHeldWithoutProcess": "read (memory with no process: an earlier job's leftovers, WARN)",
    "GpuThermalSlowdown": "a job's own heat over minutes: nothing to read before it starts",
    "GpuCriticalXid": "an event within a job, not a state: --prometheus reads the history",
    "GpuXidErrors": "an event within a job, not a state: --prometheus reads the history",
    "GpuNvlinkLinkRecovering": "a count over time: --prometheus reads the history",
    "GpuNvlinkErrors": "a count over time: --prometheus reads the history",
    "GpuPcieReplays": "a count over time: --prometheus reads the history",
    "GpuSuspectFailSlow": "a straggler across jobs: --prometheus reads the history",
    "GpuMissing": "a GPU the node had: check reads the GPUs there are (--gpus names the ones a job expects)",
    "GpuMemoryFillingUp": "a job's memory over time, not the next job's readiness",
    "GpuMemoryAlmostFull": "a job's memory, not the next job's readiness",
    "GpuMemoryHeldIdle": "a job's use over an hour, for its owner",
    "GpuAllocatedIdle": "a job's use over an hour, for its owner",
    "GpuStarved": "a job's efficiency, not a fault",
    "GpuJobImbalanced": "a job's efficiency, not a fault",
    "GpuJobImbalancedAcrossNodes": "a job's efficiency, not a fault",
    "GpuHealthTelemetryMissing": "the exporter's readings over time (check fails on what it cannot read)",
    "GpuHealthTelemetryFailing": "the exporter's readings over time (check fails on what it cannot read)",
    "GpuwardenDown": "the daemon, not the GPU",
    "GpuwardenNvmlDown": "the daemon, not the GPU (check reads NVML itself)",
    "GpuwardenCollectionStale": "the daemon, not the GPU",
    "GpuwardenCollectorFailing": "the daemon, not the GPU",
    "GpuwardenNvmlErrors": "the daemon, not the GPU",
}
#: Memory used with no process visible above this: something holds the GPU (processes in another PID namespace).
HELD_BYTES = 1 << 30
#: What the driver's recovery action asks for (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values).
RECOVERY = {
    1: "a GPU reset (nvidia-smi -r, the GPU drained first)",
    2: "a node reboot",
    3: "peer-to-peer traffic drained",
    4: "the GPU drained and reset",
}
_HW_SLOWDOWN = sum(b for b, n in CLOCK_EVENT_REASONS.items() if n in ("hw_slowdown", "hw_power_brake_slowdown"))


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


def _findings(g: GpuReading, s: GpuStatic | None) -> list[Finding]:
    """Every finding of GPU reading ``g`` (``s``: its static facts, None when unknown)."""
    out: list[Finding] = []
    if not g.up:
        return [
            Finding(
                level="CRITICAL",
                reason=f"the GPU cannot be read ({g.error or 'unknown error'})",
                action="drain the node; check dmesg for XID 79 and PCIe errors, reset the GPU (nvidia-smi -r) or "
                "reboot",
            )
        ]
    if g.recovery_action:
        what = RECOVERY.get(g.recovery_action, f"recovery action {g.recovery_action}")
        out.append(Finding(level="CRITICAL", reason=f"the driver asks for {what}", action=f"drain the node: {what}"))
    if g.remapped_rows.get("failure"):
        out.append(Finding(level="CRITICAL", reason="a row remap failed", action="drain the node and service the GPU"))
    ecc = g.ecc_errors_total.get("uncorrected_volatile")
    if ecc:
        out.append(
            Finding(
                level="CRITICAL",
                reason=f"{ecc} uncorrectable ECC error(s) since the driver loaded",
                action="drain the GPU and reset it (nvidia-smi -r) so rows are remapped; replace it if errors return",
            )
        )
    out.extend(_temperatures(g, s))
    if g.remapped_rows.get("pending"):
        out.append(Finding(level="WARN", reason="a row remap is pending", action="reset the GPU when it is free"))
    if g.clock_event_reasons is not None and g.clock_event_reasons & _HW_SLOWDOWN:
        out.append(
            Finding(
                level="WARN",
                reason="a hardware slowdown or power brake holds the clocks down",
                action="check the power supply and cooling (nvidia-smi -q -d PERFORMANCE)",
            )
        )
    if s is not None and g.pcie_width is not None and s.pcie_max_width and g.pcie_width < s.pcie_max_width:
        out.append(
            Finding(
                level="WARN",
                reason=f"PCIe link at x{g.pcie_width} of x{s.pcie_max_width}",
                action="reseat the GPU or its riser; check the slot (lspci -vv: LnkSta)",
            )
        )
    out.extend(_holders(g))
    out.extend(_nvlink(g))
    return out


def _nvlink(g: GpuReading) -> list[Finding]:
    """Findings of the GPU's NVLink links and fabric (nvmlDeviceGetNvLinkState, nvmlDeviceGetGpuFabricInfoV)."""
    out = []
    f = g.fabric
    if f is not None and f.state != "completed":
        out.append(
            Finding(
                level="CRITICAL",
                reason=f"the NVLink fabric is {f.state.replace('_', ' ')} (registration status {f.status})",
                action="check the fabric manager (nvidia-fabricmanager) or IMEX service and the NVSwitch trays; "
                "restart it, then reset the GPU if the state stays",
            )
        )
    if f is not None and any(f.health.values()):
        problems = ", ".join(sorted(c.replace("_", " ") for c, bad in f.health.items() if bad))
        out.append(Finding(level="WARN", reason=f"the NVLink fabric reports {problems}",
                           action="the fabric manager's log names the link or switch; plan service"))  # fmt: skip
    down = sorted((int(link) for link, up in g.nvlink_link_up.items() if not up))
    if down and len(down) < len(g.nvlink_link_up):
        links = ", ".join(str(link) for link in down)
        out.append(
            Finding(
                level="WARN",
                reason=f"NVLink link(s) {links} inactive, {len(g.nvlink_link_up) - len(down)} active",
                action="nvidia-smi nvlink -s; drain and reset the GPU; a link that stays down needs service",
            )
        )
    return out


def _temperatures(g: GpuReading, s: GpuStatic | None) -> list[Finding]:
    """Findings of the GPU's and HBM's temperatures against the card's own thresholds."""
    limits = s.temperature_thresholds_celsius if s is not None else {}
    slowdown, hbm_max = limits.get("slowdown"), limits.get("memory_max")
    t, m = g.temperature_gpu_celsius, g.temperature_memory_celsius
    action = "check airflow, fans, inlet temperature and neighbouring cards (nvidia-smi -q -d TEMPERATURE)"
    if t is not None and slowdown is not None:
        if t >= slowdown:
            return [
                Finding(level="CRITICAL", reason=f"GPU at {t:.0f} °C, its slowdown at {slowdown:.0f} °C", action=action)
            ]
        if t >= slowdown - HOT_MARGIN_CELSIUS:
            return [
                Finding(level="WARN", reason=f"GPU at {t:.0f} °C, its slowdown at {slowdown:.0f} °C", action=action)
            ]
    if m is not None and hbm_max is not None and m >= hbm_max - HOT_MARGIN_CELSIUS:
        return [Finding(level="WARN", reason=f"HBM at {m:.0f} °C, its limit {hbm_max:.0f} °C", action=action)]
    return []


def _holders(g: GpuReading) -> list[Finding]:
    """A finding when processes hold the GPU, or memory is used with none visible."""
    procs = g.processes or []
    if procs:
        named = ", ".join(
            f"PID {p.pid}" + (f" ({p.name}, {p.username})" if p.name and p.username else "") for p in procs[:3]
        )
        more = f" and {len(procs) - 3} more" if len(procs) > 3 else ""
        return [
            Finding(
                level="WARN",
                reason=f"{len(procs)} process(es) hold the GPU: {named}{more}",
                action="if no job should hold it, end them (an earlier job's leftovers)",
            )
        ]
    if g.processes is not None and (g.memory_used_bytes or 0) > HELD_BYTES + (g.memory_reserved_bytes or 0):
        return [
            Finding(
                level="WARN",
                reason=f"{(g.memory_used_bytes or 0) / 2**30:.1f} GiB used with no process visible",
                action="a process in another PID namespace holds it: find it (nvidia-smi on the host)",
            )
        ]
    return []


def assess(static: NodeStatic, poll: PollResult) -> list[GpuCheck]:
    """Return each GPU's readiness at ``poll`` (in index order): its level, the worst of its findings. Raises
    nothing."""
    statics = {s.uuid: s for s in static.gpus}
    out = []
    for g in sorted(poll.gpus, key=lambda r: r.index):
        s = statics.get(g.uuid)
        found = _findings(g, s)
        level = max((f.level for f in found), key=LEVELS.index, default="PASS")
        out.append(GpuCheck(gpu=g.index, uuid=g.uuid, name=s.name if s else "", level=level, findings=found))
    return out


def worst(checks: list[GpuCheck]) -> str:
    """The worst level of ``checks`` (PASS for none)."""
    return max((c.level for c in checks), key=LEVELS.index, default="PASS")
