"""Diagnosis: one verdict per GPU, with the numbers behind it and what to do (rules in docs/scores.md).

``diagnose(window, peers)`` is a pure function of a GPU's window statistics (``GpuWindow``, built by the
analyzer) and those of the other GPUs of the same job. The rules are checked in this order and the first
that holds is the verdict; ``throttled`` and ``memory_nearly_full`` are also reported as extra findings
next to any verdict.

1. ``free``              no process holds the GPU.
2. ``h2d_copy_bound``    PCIe receive >= H2D_RX_BYTES_PER_SECOND and SM activity < H2D_SM_MAX.
3. ``held_idle``         held_idle time >= HELD_IDLE_MIN of the window, or both sides idle over the window:
                         util.gpu < WORK_SAMPLE_RATIO and job CPU < JOB_CPU_BUSY_CORES.
4. ``throttled``         utilized (util.gpu >= BUSY_UTIL), thermal / hardware slowdown / power brake in
                         >= THROTTLE_MIN_FRACTION of the time and SM clock < THROTTLE_CLOCK_RATIO of max.
5. ``waiting_on_peers``  utilized, SM activity < SPIN_SM_PER_UTIL x util.gpu, and a GPU of the same job has
                         util.gpu <= PEER_LAG x this GPU's (the straggler the collective waits for).
6. ``launch_bound``      utilized but SM activity < LAUNCH_SM_MAX ("utilized" with SMs nearly empty).
7. ``input_starved``     starved time >= STARVED_MIN of the window (GPU idle while its job works).
8. ``compute_bound``     utilized (and SM activity >= LAUNCH_SM_MAX where GPM exists): healthy.
9. ``underutilized``     none of the above: the time is split with no dominant cause.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from gpuwarden.insight.states import JOB_CPU_BUSY_CORES, WORK_SAMPLE_RATIO

#: Every reason ``gpu_diagnosis{reason}`` may carry (bounded label set), in exposition order.
REASONS = (
    "compute_bound",
    "input_starved",
    "h2d_copy_bound",
    "held_idle",
    "launch_bound",
    "waiting_on_peers",
    "throttled",
    "memory_nearly_full",
    "underutilized",
    "free",
)

#: util.gpu at or above this is "utilized" (a kernel ran at least half the time).
BUSY_UTIL = 0.5
#: Utilized with SM activity below this: launch bound. H100 traces: compute_bound 0.96; a DDP rank spinning
#: in all-reduce 0.25-0.27 (reference measurements; our calibration).
LAUNCH_SM_MAX = 0.30
#: SM activity per util.gpu below this marks a kernel that occupies the GPU without working (spin).
SPIN_SM_PER_UTIL = 0.5
#: A peer GPU of the same job at or below this fraction of this GPU's util.gpu is a straggler.
PEER_LAG = 0.5
#: PCIe receive rate that marks a copy-bound GPU. H100 traces: h2d_pageable_copy 7.7-9.6 GB/s,
#: starved_cpu_heavy 0.04-0.15 GB/s, compute_bound 0.017 GB/s (our calibration: 1 GiB/s between them).
H2D_RX_BYTES_PER_SECOND = float(2**30)
#: ... while SM activity stays below this (h2d_pageable_copy: 0.000).
H2D_SM_MAX = 0.10
#: Share of the window in held_idle / starved that makes the verdict.
HELD_IDLE_MIN = 0.5
STARVED_MIN = 0.5
#: Throttled: clock-event reasons present this share of the time, SM clock below this share of its maximum.
THROTTLE_MIN_FRACTION = 0.5
THROTTLE_CLOCK_RATIO = 0.9
#: Used / total GPU memory above this: memory nearly full.
MEMORY_FULL_RATIO = 0.9
#: Fewer accounted seconds than this in the window: no verdict yet.
MIN_SECONDS = 2.0

#: Clock-event reasons that slow the clocks (NVML nvmlClocksEventReason*): "power" ones are expected at full
#: load; the others mean cooling, power delivery or a hardware fault.
POWER_REASONS = ("sw_power_cap",)
SEVERE_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")

SEVERITY = {
    "compute_bound": "ok",
    "free": "ok",
    "underutilized": "info",
    "memory_nearly_full": "info",
    "throttled": "warning",
    "input_starved": "warning",
    "h2d_copy_bound": "warning",
    "held_idle": "warning",
    "launch_bound": "warning",
    "waiting_on_peers": "warning",
}

REMEDIES: dict[str, tuple[str, ...]] = {
    "compute_bound": (
        "Nothing blocks the GPU. To go faster: mixed precision (bf16/fp8), larger batches, fused kernels, "
        "or more GPUs.",
    ),
    "input_starved": (
        "Move input work off the training loop: DataLoader(num_workers=N, pin_memory=True, "
        "persistent_workers=True, prefetch_factor>=2).",
        "Do decoding and augmentation on the GPU (NVIDIA DALI, torchvision.transforms.v2 on CUDA tensors).",
        "Cache preprocessed data; check that the job was given enough CPU cores (cgroup cpu.max, Slurm "
        "--cpus-per-task, Kubernetes CPU limits).",
    ),
    "h2d_copy_bound": (
        "Copy from pinned memory: pin_memory=True in the DataLoader, or tensor.pin_memory() once; then "
        ".to(device, non_blocking=True) to overlap copies with compute.",
        "Keep data on the GPU across steps; send compact dtypes (uint8 images, not float32) and convert there.",
    ),
    "held_idle": (
        "The GPU's memory is held but nothing runs: end the idle process (notebook kernel, stopped job) or "
        "release memory (del tensors; torch.cuda.empty_cache()).",
        "Schedulers: reclaim idle GPUs (JupyterHub culling, Slurm/Kubernetes idle-GPU policies).",
    ),
    "launch_bound": (
        "Kernels are too small to fill the SMs: larger batches, fuse operations (torch.compile), or capture "
        "the step in CUDA Graphs to remove launch overhead.",
        "Remove host synchronisations in the loop (.item(), .cpu(), printing tensors).",
    ),
    "waiting_on_peers": (
        "This GPU spins in a collective waiting for a slower rank: fix the straggler (its own diagnosis says "
        "why), balance the input work across ranks.",
        "Check the interconnect if no rank is slow (NVLink/PCIe errors, NCCL_DEBUG=INFO).",
    ),
    "throttled": (
        "Clocks are held below their maximum: power cap (expected at full load; raise the limit with "
        "nvidia-smi -pl if allowed), thermal (check cooling, airflow, fan/chassis), hardware slowdown or "
        "power brake (check the power supply; nvidia-smi -q -d PERFORMANCE).",
    ),
    "memory_nearly_full": (
        "Over 90% of GPU memory is used: expect out-of-memory errors on growth; use smaller batches, "
        "activation checkpointing, or set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against "
        "fragmentation.",
    ),
    "underutilized": (
        "No single cause dominates: profile a few steps (torch.profiler, Nsight Systems) to see where the "
        "step time goes.",
    ),
    "free": ("No process holds this GPU: it is available.",),
}


class Evidence(BaseModel):
    """One number behind a verdict: its name, value, unit and the rule it was compared with (if any)."""

    model_config = ConfigDict(frozen=True)

    name: str
    value: float
    unit: str = Field(description="ratio (0-1), bytes_per_second, cores, bytes, watts or seconds")
    rule: str | None = Field(default=None, description="the threshold this value met or missed, in words")


class Diagnosis(BaseModel):
    """The verdict on one GPU over the diagnosis window.

    ``verdict`` is one of REASONS; ``findings`` every reason that applies (the verdict first, then
    ``throttled`` / ``memory_nearly_full`` where they hold); ``severity`` ok / info / warning.
    """

    model_config = ConfigDict(frozen=True)

    gpu: int
    uuid: str
    verdict: str
    severity: str
    summary: str
    findings: list[str]
    evidence: list[Evidence]
    remedies: list[str]
    window_seconds: float = Field(description="seconds of history the verdict is based on")
    job: str | None = Field(default=None, description="the job holding most of the GPU's memory")
    job_kind: str | None = None


@dataclass(frozen=True)
class GpuWindow:
    """What the analyzer measured on one GPU over the diagnosis window (means are time-weighted).

    Ratios are in [0, 1], rates in bytes/s, CPU in cores (CPU seconds per second). None: not available.
    ``states`` are seconds per state (gpuwarden.insight.states.STATES); ``seconds`` their sum.
    ``throttle_fraction`` is the share of the time with any slowing clock-event reason;
    ``severe_throttle_fraction`` with a thermal / hardware one; ``throttle_reasons`` the names seen.
    """

    index: int
    uuid: str
    seconds: float
    states: dict[str, float]
    held: bool
    util: float | None = None
    sm: float | None = None
    tensor: float | None = None
    pcie_rx: float | None = None
    nvlink_rx: float | None = None
    job_cpu_cores: float | None = None
    max_process_cpu_cores: float | None = None
    host_cpu_busy_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    sm_clock_ratio: float | None = None
    throttle_fraction: float = 0.0
    severe_throttle_fraction: float = 0.0
    throttle_reasons: tuple[str, ...] = ()
    power_watts: float | None = None
    power_limit_watts: float | None = None
    job: str | None = None
    job_kind: str | None = None
    processes: tuple[int, ...] = field(default=())

    def share(self, state: str) -> float:
        """Return the share of the window spent in ``state`` (0 when nothing is accounted)."""
        return self.states.get(state, 0.0) / self.seconds if self.seconds > 0 else 0.0

    @property
    def memory_used_ratio(self) -> float | None:
        """Used / total GPU memory at the last poll, None when either is unknown."""
        if self.memory_used_bytes is None or not self.memory_total_bytes:
            return None
        return self.memory_used_bytes / self.memory_total_bytes


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def _evidence(w: GpuWindow) -> list[Evidence]:
    ev: list[Evidence] = []

    def add(name: str, value: float | None, unit: str, rule: str | None = None) -> None:
        if value is not None:
            ev.append(Evidence(name=name, value=round(float(value), 6), unit=unit, rule=rule))

    add("utilization_gpu", w.util, "ratio", f"utilized at >= {BUSY_UTIL:g}")
    add("sm_activity", w.sm, "ratio", f"launch bound below {LAUNCH_SM_MAX:g} when utilized")
    add("tensor_activity", w.tensor, "ratio")
    add("busy_share", w.share("busy"), "ratio")
    add("starved_share", w.share("starved"), "ratio", f"input starved at >= {STARVED_MIN:g}")
    add("held_idle_share", w.share("held_idle"), "ratio", f"held idle at >= {HELD_IDLE_MIN:g}")
    add("job_cpu", w.job_cpu_cores, "cores", f"job working at >= {JOB_CPU_BUSY_CORES:g} cores")
    add("max_process_cpu", w.max_process_cpu_cores, "cores")
    add("host_cpu_busy", w.host_cpu_busy_ratio, "ratio")
    add(
        "pcie_rx",
        w.pcie_rx,
        "bytes_per_second",
        f"copy bound at >= {H2D_RX_BYTES_PER_SECOND / 2**30:g} GiB/s with SMs < {H2D_SM_MAX:g}",
    )
    add("nvlink_rx", w.nvlink_rx, "bytes_per_second")
    add("memory_used", w.memory_used_bytes, "bytes")
    add("memory_used_ratio", w.memory_used_ratio, "ratio", f"nearly full above {MEMORY_FULL_RATIO:g}")
    add("sm_clock_of_max", w.sm_clock_ratio, "ratio", f"throttled below {THROTTLE_CLOCK_RATIO:g}")
    add("throttle_share", w.throttle_fraction, "ratio", f"throttled at >= {THROTTLE_MIN_FRACTION:g}")
    add("power", w.power_watts, "watts")
    add("power_limit", w.power_limit_watts, "watts")
    add("window", w.seconds, "seconds")
    return ev


def _utilized(w: GpuWindow) -> bool:
    return w.util is not None and w.util >= BUSY_UTIL


def _throttled(w: GpuWindow) -> bool:
    return (
        w.throttle_fraction >= THROTTLE_MIN_FRACTION
        and w.sm_clock_ratio is not None
        and w.sm_clock_ratio < THROTTLE_CLOCK_RATIO
    )


def _straggler(w: GpuWindow, peers: Sequence[GpuWindow]) -> GpuWindow | None:
    """Return the slowest peer whose util.gpu is at most PEER_LAG x this GPU's, or None."""
    if w.util is None:
        return None
    lagging = [p for p in peers if p.util is not None and p.util <= PEER_LAG * w.util]
    return min(lagging, key=lambda p: (p.util, p.index)) if lagging else None


def diagnose(w: GpuWindow, peers: Sequence[GpuWindow] = ()) -> Diagnosis | None:
    """Return the verdict on GPU ``w`` given the other GPUs of its job (``peers``); None before MIN_SECONDS.

    Rules and their order are in the module docstring; thresholds are the module constants.
    """
    if w.seconds < MIN_SECONDS:
        return None
    verdict, summary = _verdict(w, peers)
    findings = [verdict]
    if verdict != "throttled" and verdict != "free" and _utilized(w) and _throttled(w):
        findings.append("throttled")
    ratio = w.memory_used_ratio
    if ratio is not None and ratio > MEMORY_FULL_RATIO:
        findings.append("memory_nearly_full")
    extra = []
    if "throttled" in findings[1:]:
        extra.append(
            f"Clocks at {_pct(w.sm_clock_ratio)} of max ({', '.join(w.throttle_reasons) or 'unknown reason'})."
        )
    if "memory_nearly_full" in findings:
        extra.append(f"Memory {_pct(ratio)} full.")
    remedies: list[str] = []
    for f in findings:
        remedies.extend(REMEDIES[f])
    levels = [SEVERITY[f] for f in findings]
    if "throttled" in findings and w.severe_throttle_fraction < THROTTLE_MIN_FRACTION:
        levels[findings.index("throttled")] = "info"  # a power cap at full load is expected, not a fault
    severity = max(levels, key=("ok", "info", "warning").index)
    return Diagnosis(
        gpu=w.index,
        uuid=w.uuid,
        verdict=verdict,
        severity=severity,
        summary=" ".join([summary, *extra]),
        findings=findings,
        evidence=_evidence(w),
        remedies=remedies,
        window_seconds=round(w.seconds, 3),
        job=w.job,
        job_kind=w.job_kind,
    )


def _verdict(w: GpuWindow, peers: Sequence[GpuWindow]) -> tuple[str, str]:
    if not w.held:
        return "free", "No process holds this GPU."
    cpu = "n/a" if w.job_cpu_cores is None else f"{w.job_cpu_cores:.2f} cores"
    if w.pcie_rx is not None and w.sm is not None and w.pcie_rx >= H2D_RX_BYTES_PER_SECOND and w.sm < H2D_SM_MAX:
        return "h2d_copy_bound", (
            f"PCIe receive {w.pcie_rx / 1e9:.1f} GB/s while SMs are {_pct(w.sm)} active: "
            f"the job waits on host-to-device copies (job CPU {cpu})."
        )
    both_idle = (
        w.util is not None
        and w.util < WORK_SAMPLE_RATIO
        and w.job_cpu_cores is not None
        and w.job_cpu_cores < JOB_CPU_BUSY_CORES
    )
    if w.share("held_idle") >= HELD_IDLE_MIN or both_idle:
        mem = "" if w.memory_used_bytes is None else f"{w.memory_used_bytes / 1e9:.1f} GB held; "
        return "held_idle", (
            f"{mem}kernels ran {_pct(w.util)} of the time and the job's GPU processes use {cpu} of CPU: "
            f"nobody is using this GPU (held idle {_pct(w.share('held_idle'))} of the window)."
        )
    if _utilized(w) and _throttled(w) and w.severe_throttle_fraction >= THROTTLE_MIN_FRACTION:
        return "throttled", (
            f"SM clock at {_pct(w.sm_clock_ratio)} of max for {_pct(w.severe_throttle_fraction)} of the time: "
            f"{', '.join(w.throttle_reasons)}."
        )
    if _utilized(w) and w.sm is not None and w.util is not None and w.sm < SPIN_SM_PER_UTIL * w.util:
        lag = _straggler(w, peers)
        if lag is not None:
            return "waiting_on_peers", (
                f"util.gpu {_pct(w.util)} but SMs only {_pct(w.sm)} active: spinning in a collective while "
                f"GPU {lag.index} of the same job runs kernels {_pct(lag.util)} of the time (the straggler)."
            )
    if _utilized(w) and w.sm is not None and w.sm < LAUNCH_SM_MAX:
        return "launch_bound", (
            f"util.gpu {_pct(w.util)} (a kernel is running) but SMs only {_pct(w.sm)} active: kernels too small "
            "or launch overhead."
        )
    if w.share("starved") >= STARVED_MIN:
        text = (
            f"GPU idle {_pct(w.share('starved'))} of the time while its job works (job CPU {cpu}): waiting for input."
        )
        if w.job_cpu_cores is not None and w.job_cpu_cores < JOB_CPU_BUSY_CORES:
            text += " Its GPU processes use little CPU: waiting on I/O or on helper processes (DataLoader workers)?"
        elif w.max_process_cpu_cores is not None and w.max_process_cpu_cores >= 0.8:
            text += f" One process uses {w.max_process_cpu_cores:.2f} cores: a single-threaded input pipeline?"
        waiting = [p for p in peers if p.util is not None and w.util is not None and w.util <= PEER_LAG * p.util]
        if waiting:
            text += f" Straggler of its job: GPU {', '.join(str(p.index) for p in waiting)} wait(s) on it."
        return "input_starved", text
    if _utilized(w):
        return "compute_bound", (
            f"Busy: a kernel runs {_pct(w.util)} of the time, SMs {_pct(w.sm)} active, tensor cores {_pct(w.tensor)}."
        )
    return "underutilized", (
        f"Busy {_pct(w.share('busy'))}, starved {_pct(w.share('starved'))}, held idle {_pct(w.share('held_idle'))}, "
        f"unknown {_pct(w.share('unknown'))}: no single cause dominates."
    )
