"""Diagnosis: one verdict per GPU, with the numbers behind it and what to do (rules in docs/scores.md).

``diagnose(window, peers)`` is a pure function of a GPU's window statistics (``GpuWindow``, built by the
analyzer) and those of the other GPUs of the same job. The rules are checked in this order and the first
that holds is the verdict; ``throttled``, ``memory_nearly_full``, ``tensor_cores_idle``, ``straggler`` and the
health findings (``hot``, ``uncorrectable_ecc``, ``xid_errors``, ``row_remap_pending``, ``row_remap_failed``) are
also reported as findings next to any verdict.

1. ``free``              no process holds the GPU.
2. ``h2d_copy_bound``    PCIe receive >= H2D_RX_BYTES_PER_SECOND and SM activity < H2D_SM_MAX, unless as much
                         goes back out while the job works on the CPU (then host_compute_bound).
3. ``held_idle``         held_idle time >= HELD_IDLE_MIN of the window, or both sides idle over the window:
                         util.gpu < WORK_SAMPLE_RATIO, job CPU < JOB_CPU_BUSY_CORES and no storage reads.
4. ``throttled``         utilized (util.gpu >= BUSY_UTIL), thermal / hardware slowdown / power brake in
                         >= THROTTLE_MIN_FRACTION of the time and SM clock < THROTTLE_CLOCK_RATIO of max.
5. ``waiting_on_peers``  utilized, and a GPU of the same job is the straggler: this GPU spins (SM activity <
                         SPIN_SM_PER_UTIL x util.gpu: a kernel resident, SMs waiting in a collective) and the peer's
                         util.gpu is at most PEER_LAG x this GPU's (a CPU-side straggler); or the peer's SM activity is
                         at least this GPU's / PEER_LAG (a GPU-side straggler, given more GPU work).
6. ``host_compute_bound`` the rule of ``input_starved`` holds (and not ``job_paused``'s), and the job sends the
                         host at least HOST_TX_PER_RX x what it receives (GPM PCIe TX >= HOST_TX_MIN_BYTES_PER_SECOND):
                         the host works on the GPU's output (an optimizer or metrics on the CPU), not on its input.
7. ``checkpoint_bound``  idle >= STARVED_MIN of the window while the job writes storage at >=
                         IO_WRITE_BYTES_PER_SECOND (/proc/PID/io write_bytes), more than it reads.
8. ``launch_bound``      kernels run (util.gpu >= LAUNCH_UTIL_MIN) but fill few SMs (SM activity < LAUNCH_SM_PER_UTIL
                         x util.gpu; or < LAUNCH_MID_SM_PER_UTIL x util.gpu with the GPU idle in gaps shorter than a
                         sample period and no helper process), while the job's busiest process keeps a core busy (>=
                         LAUNCH_CPU_CORES): the host thread issuing kernels one at a time is the limit.
9. ``job_paused``        idle (paused + starved) >= PAUSED_MIN of the window while the job's CPU beyond its GPU-busy
                         share is below JOB_CPU_BUSY_CORES per idle second, it reads and writes nothing and waits
                         seldom (WAITS_PER_SECOND), or paused time exceeds starved time: the job itself stops.
10. ``input_starved``    starved time >= STARVED_MIN of the window (GPU idle while its job works on the CPU, reads
                         storage or sockets, or waits often); the summary says which.
11. ``memory_bound``     utilized and DRAM activity >= MEMORY_BOUND_DRAM (most of HBM's peak bandwidth in use).
12. ``compute_bound``    utilized (and SM activity >= LAUNCH_SM_PER_UTIL x util.gpu where GPM exists).
13. ``underutilized``    none of the above: the time is split with no dominant cause.

A GPU that cannot be read at all (lost, off the bus) gets ``gpu_lost`` (``lost``), critical.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from gpuwarden.catalog import clock_event_reasons
from gpuwarden.insight.launches import (
    LAUNCH_CPU_CORES,
    LAUNCH_SM_PER_UTIL,
    launch_limited,
)
from gpuwarden.insight.states import (
    IO_READ_BYTES_PER_SECOND,
    IO_WRITE_BYTES_PER_SECOND,
    JOB_CPU_BUSY_CORES,
    WAITS_PER_SECOND,
    WORK_SAMPLE_RATIO,
    writes_more_than_reads,
)

#: Every reason ``gpu_diagnosis{reason}`` may carry (bounded label set), in exposition order.

#: util.gpu at or above this is "utilized" (a kernel ran at least half the time).
BUSY_UTIL = 0.5
#: Launch bound: LAUNCH_UTIL_MIN, LAUNCH_SM_PER_UTIL, LAUNCH_CPU_CORES, LAUNCH_MID_SM_PER_UTIL and the rest of the test
#: are in gpuwarden.insight.launches (the accounting's ``launch`` cause uses the same test per poll interval).
#: Share of the window the job itself paused (GPU and job CPU idle right after GPU work) that makes the verdict.
PAUSED_MIN = 0.25
#: DRAM activity (GPM DRAM bandwidth utilization: achieved over peak HBM bandwidth) at or above this: memory bound.
#: On the roofline a kernel whose bytes per flop put it left of the ridge point runs at the bandwidth roof: it
#: sustains most of the peak bandwidth while its arithmetic pipes wait. GEMMs stay far below (compute bound).
MEMORY_BOUND_DRAM = 0.6
#: Tensor cores idle while the FP32 pipe does the work: tensor activity below this ...
TENSOR_IDLE_MAX = 0.05
#: ... and FP32 pipe activity at or above this (FP32 matrix math that TF32 or bf16 would put on tensor cores).
FP32_BUSY_MIN = 0.3
#: Hot: the GPU within this many degrees Celsius of its own slowdown threshold (or HBM of its memory_max).
HOT_MARGIN_CELSIUS = 5.0
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
#: Starved (idle while the job works on input) this share of the window or more: input bound. At a quarter of the
#: time idle, a faster input pipeline gains a third more throughput, more than any compute-side remedy typically
#: does, so "nothing blocks the GPU" would be wrong advice; a loader that keeps up leaves the GPU idle only
#: between steps (1% in the compute-bound recording).
STARVED_MIN = 0.25
#: Throttled: clock-event reasons present this share of the time, SM clock below this share of its maximum.
THROTTLE_MIN_FRACTION = 0.5
THROTTLE_CLOCK_RATIO = 0.9
#: Used / total GPU memory above this: memory nearly full.
MEMORY_FULL_RATIO = 0.9
#: Host compute bound: the GPU idles while its job works on the CPU (as for input_starved), and the job moves at least
#: this many bytes device-to-host per byte host-to-device (GPM PCIe TX / RX). Input prepared on the host flows to the
#: GPU (RX far above TX); work that consumes the GPU's output on the host - an optimizer stepped on the CPU, as
#: CPU-offloaded optimizers do (ZeRO-Offload: Ren et al., USENIX ATC 2021: gradients out, parameters back, TX about
#: RX), metrics computed on the host - sends at least as much back.
HOST_TX_PER_RX = 1.0
#: ... and at least this much device-to-host traffic (bytes/s): below it, the direction of a trickle says nothing.
HOST_TX_MIN_BYTES_PER_SECOND = 100e6
#: Fewer accounted seconds than this in the window: no verdict yet.
MIN_SECONDS = 2.0

#: Clock-event reasons that slow the clocks (NVML nvmlClocksEventReason*): "power" ones are expected at full
#: load; the others mean cooling, power delivery or a hardware fault.
POWER_REASONS = clock_event_reasons("power")
SEVERE_REASONS = clock_event_reasons("thermal", "hardware")


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

    def value(self, name: str) -> float | None:
        """Return the value of the evidence called ``name`` (its unit as in ``Evidence.unit``), None when absent."""
        return next((e.value for e in self.evidence if e.name == name), None)

    def activity(self) -> float | None:
        """Return the GPU's activity over the diagnosis window as a ratio 0-1: SM activity (GPM) where measured,
        else ``utilization.gpu`` (the share of time a kernel ran); None when neither is in the evidence."""
        sm = self.value("sm_activity")
        return sm if sm is not None else self.value("utilization_gpu")


@dataclass(frozen=True)
class Health:
    """A GPU's health at the last poll of the window: temperatures against the card's own thresholds, memory
    errors and XIDs. None: not reported (the card lacks the sensor or counter)."""

    temperature_celsius: float | None = None
    slowdown_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    memory_max_celsius: float | None = None
    uncorrected_ecc: int | None = None
    remap_pending: bool = False
    remap_failed: bool = False
    xids: tuple[int, ...] = ()


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
    pcie_tx: float | None = None
    nvlink_rx: float | None = None
    job_cpu_cores: float | None = None
    max_process_cpu_cores: float | None = None
    dram: float | None = None
    fp32: float | None = None
    io_read_bytes_per_second: float | None = None
    io_other_read_bytes_per_second: float | None = None
    io_write_bytes_per_second: float | None = None
    voluntary_switches_per_second: float | None = None
    whole_idle_ratio: float | None = None
    io_blocked_processes: float | None = None
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
    health: Health = field(default_factory=Health)

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


@dataclass(frozen=True)
class Mean:
    """A reading averaged over a window, weighted by each interval's seconds (None: unknown, left out): declared once
    here, it is a slot of every Interval (``Interval.means``, in MEANS order, filled by the analyzer by ``name``),
    a pair of exact window sums (gpuwarden.insight.windows), the GpuWindow attribute ``name``, and the Evidence
    ``evidence`` in ``unit`` with ``rule``: the threshold a verdict rule compares it with, in words."""

    name: str
    evidence: str
    unit: str
    rule: str | None = None

    def get(self, w: GpuWindow) -> float | None:
        """Its value on window ``w``."""
        value: float | None = getattr(w, self.name)
        return value


@dataclass(frozen=True)
class Derived:
    """Evidence that is not a windowed mean: ``get`` reads it from the window (a state's share, the last poll's
    memory, the card's health, the window's length)."""

    evidence: str
    unit: str
    get: Callable[[GpuWindow], float | None]
    rule: str | None = None


#: The evidence of every verdict, in the order it is shown: the windowed means and the values derived from a window.
EVIDENCE: tuple[Mean | Derived, ...] = (
    Derived("utilization_gpu", "ratio", lambda w: w.util, f"utilized at >= {BUSY_UTIL:.0%}"),
    Mean("sm", "sm_activity", "ratio", f"launch bound below {LAUNCH_SM_PER_UTIL:g} x utilization_gpu"),
    Mean("tensor", "tensor_activity", "ratio", f"tensor cores idle below {TENSOR_IDLE_MAX:.0%}"),
    Mean("dram", "dram_activity", "ratio", f"memory bound at >= {MEMORY_BOUND_DRAM:.0%}"),
    Mean("fp32", "fp32_activity", "ratio", f"FP32 pipes busy at >= {FP32_BUSY_MIN:.0%}"),
    Derived("busy_share", "ratio", lambda w: w.share("busy")),
    Derived("starved_share", "ratio", lambda w: w.share("starved"), f"input starved at >= {STARVED_MIN:.0%}"),
    Derived("paused_share", "ratio", lambda w: w.share("paused"), f"job paused at >= {PAUSED_MIN:.0%}"),
    Derived("held_idle_share", "ratio", lambda w: w.share("held_idle"), f"held idle at >= {HELD_IDLE_MIN:.0%}"),
    Mean("job_cpu_cores", "job_cpu", "cores", f"job working at >= {JOB_CPU_BUSY_CORES:g} cores"),
    Mean("max_process_cpu_cores", "max_process_cpu", "cores", f"a launching thread at >= {LAUNCH_CPU_CORES:g} cores"),
    Mean("io_read_bytes_per_second", "job_read_rate", "bytes_per_second"),
    Mean(
        "io_other_read_bytes_per_second",
        "job_other_read_rate",
        "bytes_per_second",
        f"remote input at >= {IO_READ_BYTES_PER_SECOND / 2**20:g} MiB/s (sockets, pipes, page cache)",
    ),
    Mean(
        "io_write_bytes_per_second",
        "job_write_rate",
        "bytes_per_second",
        f"writing a checkpoint at >= {IO_WRITE_BYTES_PER_SECOND / 2**20:g} MiB/s",
    ),
    Mean(
        "voluntary_switches_per_second",
        "job_waits_per_second",
        "per_second",
        f"many short waits at >= {WAITS_PER_SECOND:g} per idle second",
    ),
    Mean("whole_idle_ratio", "idle_in_whole_samples", "ratio", "launch gaps: idle within sample periods"),
    Mean("io_blocked_processes", "job_processes_in_io_wait", "processes"),
    Mean("host_cpu_busy_ratio", "host_cpu_busy", "ratio"),
    Mean(
        "pcie_rx",
        "pcie_rx",
        "bytes_per_second",
        f"copy bound at >= {H2D_RX_BYTES_PER_SECOND / 1e9:.2f} GB/s with SM activity < {H2D_SM_MAX:.0%}",
    ),
    Mean("pcie_tx", "pcie_tx", "bytes_per_second", f"host compute at >= {HOST_TX_PER_RX:g} x pcie_rx"),
    Mean("nvlink_rx", "nvlink_rx", "bytes_per_second"),
    Derived("memory_used", "bytes", lambda w: w.memory_used_bytes),
    Derived("memory_used_ratio", "ratio", lambda w: w.memory_used_ratio, f"nearly full above {MEMORY_FULL_RATIO:.0%}"),
    Derived("sm_clock_of_max", "ratio", lambda w: w.sm_clock_ratio, f"throttled below {THROTTLE_CLOCK_RATIO:.0%}"),
    Derived("throttle_share", "ratio", lambda w: w.throttle_fraction, f"throttled at >= {THROTTLE_MIN_FRACTION:.0%}"),
    Derived("temperature", "celsius", lambda w: w.health.temperature_celsius),
    Derived(
        "slowdown_threshold",
        "celsius",
        lambda w: w.health.slowdown_celsius,
        f"hot within {HOT_MARGIN_CELSIUS:g} °C of it",
    ),
    Derived("memory_temperature", "celsius", lambda w: w.health.memory_temperature_celsius),
    Derived("uncorrected_ecc_errors", "errors", lambda w: w.health.uncorrected_ecc),
    Mean("power_watts", "power", "watts"),
    Derived("power_limit", "watts", lambda w: w.power_limit_watts),
    Derived("window", "seconds", lambda w: w.seconds),
)

#: The windowed means, in EVIDENCE order: the slots of ``Interval.means``.
MEANS: tuple[Mean, ...] = tuple(e for e in EVIDENCE if isinstance(e, Mean))


def pack_means(**values: float | None) -> tuple[float | None, ...]:
    """Return ``values`` (one per MEANS name) as an Interval's ``means``. Raises KeyError naming a missing or an
    undeclared mean."""
    extra = set(values) - {m.name for m in MEANS}
    if extra:
        raise KeyError(f"not declared in MEANS: {sorted(extra)}")
    return tuple(values[m.name] for m in MEANS)


def _evidence(w: GpuWindow) -> list[Evidence]:
    """The numbers behind a verdict on ``w``: every EVIDENCE row with a value, in the table's order."""
    out = []
    for row in EVIDENCE:
        value = row.get(w)
        if value is not None:
            out.append(Evidence(name=row.evidence, value=round(float(value), 6), unit=row.unit, rule=row.rule))
    return out


def _utilized(w: Activity) -> bool:
    return w.util is not None and w.util >= BUSY_UTIL


def _throttled(w: GpuWindow) -> bool:
    return (
        w.throttle_fraction >= THROTTLE_MIN_FRACTION
        and w.sm_clock_ratio is not None
        and w.sm_clock_ratio < THROTTLE_CLOCK_RATIO
    )


class Activity(Protocol):
    """What the test of a GPU waiting on a peer reads of a GPU (a GpuWindow over the diagnosis window, or one poll
    interval's figures): its index, util.gpu and SM activity (ratios; None: unknown)."""

    @property
    def index(self) -> int:
        """The GPU's index (nvmlDeviceGetIndex)."""

    @property
    def util(self) -> float | None:
        """util.gpu: the share of the time a kernel ran (nvmlDeviceGetUtilizationRates)."""

    @property
    def sm(self) -> float | None:
        """SM activity (GPM NVML_GPM_METRIC_SM_UTIL, as a ratio)."""


A = TypeVar("A", bound=Activity)


def _spinning(w: Activity) -> bool:
    """Kernels resident most of the time with the SMs mostly empty: a collective waiting (or tiny kernels)."""
    return _utilized(w) and w.sm is not None and w.util is not None and w.sm < SPIN_SM_PER_UTIL * w.util


def _straggler(w: A, peers: Sequence[A]) -> tuple[A, str] | None:
    """Return the peer this GPU waits on and how it lags ("CPU-side": it runs kernels at most PEER_LAG x as often;
    "GPU-side": its SMs are at least 1/PEER_LAG x as active), or None."""
    if w.util is None:
        return None
    cpu_side = [p for p in peers if p.util is not None and p.util <= PEER_LAG * w.util] if _spinning(w) else []
    if cpu_side:
        return min(cpu_side, key=lambda p: (p.util or 0.0, p.index)), "CPU-side"
    if w.sm is not None:
        gpu_side = [p for p in peers if p.sm is not None and p.sm * PEER_LAG >= w.sm and not _spinning(p)]
        if gpu_side:
            return max(gpu_side, key=lambda p: (p.sm or 0.0, -p.index)), "GPU-side"
    return None


def _waiters(w: GpuWindow, peers: Sequence[GpuWindow]) -> list[GpuWindow]:
    """The peers that wait on ``w`` (``w`` is their straggler)."""
    return [p for p in peers if _waits_on(p, [w]) is w]


def _waits_on(w: A, peers: Sequence[A]) -> A | None:
    """The peer ``w`` waits on in a collective (the rule of ``waiting_on_peers``), or None."""
    if not _utilized(w) or w.sm is None:
        return None
    lag = _straggler(w, peers)
    return lag[0] if lag is not None and (_spinning(w) or lag[1] == "GPU-side") else None


def peer_wait_share(w: Activity, peers: Sequence[Activity]) -> float:
    """The share of the time (a ratio in [0, util.gpu]) GPU ``w`` spent in kernels that wait in a collective on the
    peer of its job that it waits on (the rule of ``waiting_on_peers``: ``_waits_on``); 0 when it waits on none.

    In data-parallel work every rank runs the same kernels per step, and the straggler (the last to reach the
    collective) hardly waits in it: so the waiter's kernel time beyond the straggler's is spent waiting (util.gpu
    of ``w`` minus the peer's: a CPU-side straggler), and the waiter's SMs, if its own kernels filled them as the
    straggler's do, would be active util x the peer's SM activity per util; what it lacks of that is waiting (a
    GPU-side straggler). The larger of the two, each a lower bound: a waiting collective keeps some SMs active (NCCL
    runs a block per channel), which the second counts as work. Raises nothing."""
    peer = _waits_on(w, peers)
    if peer is None or w.util is None or peer.util is None:
        return 0.0
    by_time = w.util - peer.util
    by_fill = w.util - (w.sm or 0.0) * peer.util / peer.sm if peer.sm else 0.0
    return max(0.0, min(w.util, max(by_time, by_fill)))


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


def lost(index: int, uuid: str, error: str) -> Diagnosis:
    """Return the diagnosis of a GPU that could not be read at all this poll (``error``: NVML's, e.g. gpu_is_lost)."""
    return Diagnosis(
        gpu=index,
        uuid=uuid,
        verdict="gpu_lost",
        severity=SEVERITY["gpu_lost"],
        summary=f"The GPU could not be read ({error}): it is lost to the node until it is reset.",
        findings=["gpu_lost"],
        evidence=[],
        remedies=list(REMEDIES["gpu_lost"]),
        window_seconds=0.0,
    )


def _findings(w: GpuWindow, peers: Sequence[GpuWindow], verdict: str) -> tuple[list[str], list[str]]:
    """The findings next to ``verdict`` (throttled, memory nearly full, tensor cores idle, straggler, health, blind)
    and one sentence for each that says why (``blind`` has none: its remedy says it)."""
    findings: list[str] = []
    extra: list[str] = []
    if verdict != "throttled" and verdict != "free" and _utilized(w) and _throttled(w):
        findings.append("throttled")
        extra.append(
            f"Clocks at {_pct(w.sm_clock_ratio)} of max ({', '.join(w.throttle_reasons) or 'unknown reason'})."
        )
    ratio = w.memory_used_ratio
    if ratio is not None and ratio > MEMORY_FULL_RATIO:
        findings.append("memory_nearly_full")
        extra.append(f"Memory {_pct(ratio)} full.")
    if verdict == "compute_bound" and _tensor_cores_idle(w):
        findings.append("tensor_cores_idle")
        extra.append(f"Tensor cores {_pct(w.tensor)} active while the FP32 pipes are {_pct(w.fp32)}: no TF32/bf16.")
    waiters = _waiters(w, peers)
    if waiters and verdict != "waiting_on_peers":
        findings.append("straggler")
        extra.append(f"Straggler of its job: GPU {', '.join(str(p.index) for p in waiters)} wait(s) on it.")
    for name, text in _health(w):
        findings.append(name)
        extra.append(text)
    if verdict == "underutilized" and w.held and w.job_cpu_cores is None:
        findings.append("blind")
    return findings, extra


def _tensor_cores_idle(w: GpuWindow) -> bool:
    """Tensor cores below TENSOR_IDLE_MAX while the FP32 pipes are at least FP32_BUSY_MIN (GPM)."""
    return w.tensor is not None and w.fp32 is not None and w.tensor < TENSOR_IDLE_MAX and w.fp32 >= FP32_BUSY_MIN


def diagnose(w: GpuWindow, peers: Sequence[GpuWindow] = ()) -> Diagnosis | None:
    """Return the verdict on GPU ``w`` given the other GPUs of its job (``peers``); None before MIN_SECONDS.

    Rules and their order are in the module docstring and REASON_TABLE; thresholds are the module constants.
    """
    if w.seconds < MIN_SECONDS:
        return None
    verdict, summary = _verdict(w, peers)
    more, extra = _findings(w, peers, verdict)
    findings = [verdict, *more]
    remedies: list[str] = []
    order = [f for f in findings if SEVERITY[f] == "critical"] + [f for f in findings if SEVERITY[f] != "critical"]
    for f in order:
        remedies.extend(REMEDIES[f])
    levels = [SEVERITY[f] for f in findings]
    if "throttled" in findings and w.severe_throttle_fraction < THROTTLE_MIN_FRACTION:
        levels[findings.index("throttled")] = "info"  # a power cap at full load is expected, not a fault
    severity = max(levels, key=("ok", "info", "warning", "critical").index)
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


class Facts:
    """What the verdict rules read about one GPU's window ``w`` given its job's other GPUs ``peers``: the window and
    the values several rules share, each computed once when first read (module constants are the thresholds)."""

    def __init__(self, w: GpuWindow, peers: Sequence[GpuWindow]) -> None:
        self.w, self.peers = w, peers

    @functools.cached_property
    def cpu(self) -> str:
        """The job's CPU in words: ``n/a`` or ``1.23 cores``."""
        return "n/a" if self.w.job_cpu_cores is None else f"{self.w.job_cpu_cores:.2f} cores"

    @functools.cached_property
    def writing(self) -> bool:
        """The job writes storage at >= IO_WRITE_BYTES_PER_SECOND, more than it reads (storage and sockets)."""
        w = self.w
        read = (w.io_read_bytes_per_second or 0.0) + (w.io_other_read_bytes_per_second or 0.0)
        return writes_more_than_reads(w.io_write_bytes_per_second, read)

    @functools.cached_property
    def remote(self) -> bool:
        """The job reads >= IO_READ_BYTES_PER_SECOND other than from storage (rchar beyond read_bytes: sockets)."""
        return (self.w.io_other_read_bytes_per_second or 0.0) >= IO_READ_BYTES_PER_SECOND

    @functools.cached_property
    def reading(self) -> bool:
        """The job reads storage or sockets (>= IO_READ_BYTES_PER_SECOND) or has processes in I/O wait while it does
        not write a checkpoint (an fsync waits in state D too)."""
        w = self.w
        if (w.io_read_bytes_per_second or 0.0) >= IO_READ_BYTES_PER_SECOND or self.remote:
            return True
        return (w.io_blocked_processes or 0) > 0 and not self.writing

    @functools.cached_property
    def both_idle(self) -> bool:
        """Kernels ran below WORK_SAMPLE_RATIO of the time and the job's CPU is below JOB_CPU_BUSY_CORES, no reads and
        no frequent waits."""
        w = self.w
        if w.util is None or w.job_cpu_cores is None:
            return False
        quiet = w.job_cpu_cores < JOB_CPU_BUSY_CORES and not self.reading and not self.waits
        return w.util < WORK_SAMPLE_RATIO and quiet

    @functools.cached_property
    def idle(self) -> float:
        """The window's paused + starved share."""
        return self.w.share("paused") + self.w.share("starved")

    @functools.cached_property
    def quiet(self) -> bool:
        """The job's CPU beyond what its GPU-busy time explains (a core per busy second at most) is below
        JOB_CPU_BUSY_CORES per idle second, it reads and writes nothing and does not wait often (``waits``): the job
        does not work while its GPU idles. Per
        poll, util.gpu is a short sample and misplaces the edges of pauses; the window's means do not."""
        w = self.w
        if self.reading or self.writing or self.waits or w.job_cpu_cores is None:
            return False
        return w.job_cpu_cores - w.share("busy") < JOB_CPU_BUSY_CORES * self.idle

    @functools.cached_property
    def waits(self) -> bool:
        """The job's main threads wait at >= WAITS_PER_SECOND voluntary context switches per idle second."""
        switches = self.w.voluntary_switches_per_second
        return switches is not None and self.idle > 0 and switches >= WAITS_PER_SECOND * self.idle

    @functools.cached_property
    def lag(self) -> tuple[GpuWindow, str] | None:
        """The peer this GPU waits on in a collective and how it lags (``_straggler``), or None."""
        return _straggler(self.w, self.peers) if _waits_on(self.w, self.peers) is not None else None


def _free_when(f: Facts) -> bool:
    return not f.w.held


def _free_summary(f: Facts) -> str:
    return "No process holds this GPU."


def _h2d_copy_bound_when(f: Facts) -> bool:
    w = f.w
    if w.pcie_rx is None or w.sm is None or w.pcie_rx < H2D_RX_BYTES_PER_SECOND or w.sm >= H2D_SM_MAX:
        return False
    # copies into the GPU, not a round trip around work on the host (host_compute_bound: TX at least RX)
    return w.pcie_tx is None or w.pcie_tx < HOST_TX_PER_RX * w.pcie_rx or not _input_starved_when(f)


def _h2d_copy_bound_summary(f: Facts) -> str:
    return (
        f"PCIe receive {(f.w.pcie_rx or 0.0) / 1e9:.1f} GB/s while SMs are {_pct(f.w.sm)} active: "
        f"the job waits on host-to-device copies (job CPU {f.cpu})."
    )


def _held_idle_when(f: Facts) -> bool:
    return f.w.share("held_idle") >= HELD_IDLE_MIN or f.both_idle


def _held_idle_summary(f: Facts) -> str:
    w = f.w
    mem = "" if w.memory_used_bytes is None else f"{w.memory_used_bytes / 1e9:.1f} GB held; "
    return (
        f"{mem}kernels ran {_pct(w.util)} of the time and the job's processes use {f.cpu} of CPU: "
        f"nobody is using this GPU (held idle {_pct(w.share('held_idle'))} of the window)."
    )


def _throttled_when(f: Facts) -> bool:
    return _utilized(f.w) and _throttled(f.w) and f.w.severe_throttle_fraction >= THROTTLE_MIN_FRACTION


def _throttled_summary(f: Facts) -> str:
    w = f.w
    return (
        f"SM clock at {_pct(w.sm_clock_ratio)} of max for {_pct(w.severe_throttle_fraction)} of the time: "
        f"{', '.join(w.throttle_reasons)}."
    )


def _waiting_on_peers_when(f: Facts) -> bool:
    return f.lag is not None


def _waiting_on_peers_summary(f: Facts) -> str:
    assert f.lag is not None  # the rule held
    peer, side = f.lag
    return (
        f"util.gpu {_pct(f.w.util)} but SMs only {_pct(f.w.sm)} active: spinning in a collective while "
        f"GPU {peer.index} of the same job (the {side} straggler) runs kernels {_pct(peer.util)} of the "
        f"time with SMs {_pct(peer.sm)} active."
    )


def copies_data(pcie_rx: float | None, pcie_tx: float | None) -> bool:
    """Whether a GPU's PCIe traffic (GPM PCIe RX and TX, bytes/s; None: unknown, taken as none) is copies of data: at
    least H2D_RX_BYTES_PER_SECOND into the GPU or HOST_TX_MIN_BYTES_PER_SECOND out of it."""
    return (pcie_rx or 0.0) >= H2D_RX_BYTES_PER_SECOND or (pcie_tx or 0.0) >= HOST_TX_MIN_BYTES_PER_SECOND


def _launch_bound_when(f: Facts) -> bool:
    w = f.w
    return launch_limited(
        w.util,
        w.sm,
        w.max_process_cpu_cores,
        w.job_cpu_cores,
        w.whole_idle_ratio,
        f.reading or f.writing,
        copies_data(w.pcie_rx, w.pcie_tx),
    )


def _launch_bound_summary(f: Facts) -> str:
    w = f.w
    ratio = (w.sm or 0.0) / w.util if w.util else 0.0
    text = (
        f"Kernels run {_pct(w.util)} of the time but fill few SMs ({_pct(w.sm)} active) while one process "
        f"keeps {w.max_process_cpu_cores or 0.0:.2f} cores busy: small kernels launched one at a time; the host "
        "thread launching them is the limit."
    )
    if ratio >= LAUNCH_SM_PER_UTIL:
        text = (
            f"Kernels run {_pct(w.util)} of the time and cover about {ratio:.0%} of the SMs while they run; the GPU "
            f"idles between them in gaps shorter than a sample period while one process keeps "
            f"{w.max_process_cpu_cores or 0.0:.2f} cores busy: mid-size kernels launched one at a time, the launching "
            "thread the limit. If the training process also prepares input between steps, a profiler's timeline "
            "tells them apart (gaps of microseconds between kernels: launches; one gap per step: input)."
        )
    return text


def _job_paused_when(f: Facts) -> bool:
    return f.idle >= PAUSED_MIN and (f.quiet or f.w.share("paused") > f.w.share("starved"))


def _job_paused_summary(f: Facts) -> str:
    w = f.w
    text = (
        f"GPU idle {_pct(w.share('paused'))} of the time right after GPU work while the job's CPU idles too: "
        f"the job itself pauses (busy {_pct(w.share('busy'))}, job CPU {f.cpu})"
    )
    if f.waits:
        read = ((w.io_read_bytes_per_second or 0.0) + (w.io_other_read_bytes_per_second or 0.0)) / 1e6
        return text + (
            f", or it waits on something outside the node: its processes wait "
            f"{w.voluntary_switches_per_second or 0.0:.0f} times a second (many short waits, as a loader fetching "
            f"from remote storage or a client of a service makes; one pause is one wait) and read {read:.1f} MB/s. "
            "gpuwarden cannot tell these apart: check the job's input source and its latency."
        )
    return text + "."


def _host_compute_bound_when(f: Facts) -> bool:
    w = f.w
    if w.pcie_tx is None or w.pcie_rx is None or w.pcie_tx < HOST_TX_MIN_BYTES_PER_SECOND:
        return False
    if w.pcie_tx < HOST_TX_PER_RX * w.pcie_rx:
        return False  # input flows in: a loader's (from storage too), not host work on the GPU's output
    if f.writing:
        return False  # the output goes to storage: checkpoint_bound
    return _input_starved_when(f) and not _job_paused_when(f)  # the job works on the CPU, and is not pausing


def _host_compute_bound_summary(f: Facts) -> str:
    w = f.w
    return (
        f"GPU idle {_pct(f.idle)} of the time while its job works on the CPU (job CPU {f.cpu}), sending the host "
        f"{(w.pcie_tx or 0.0) / 1e9:.2f} GB/s against {(w.pcie_rx or 0.0) / 1e9:.2f} GB/s received: the host works on "
        "the GPU's output (an optimizer or metrics on the CPU), not on its input."
    )


def _checkpoint_bound_when(f: Facts) -> bool:
    return f.writing and f.idle >= STARVED_MIN


def _checkpoint_bound_summary(f: Facts) -> str:
    w = f.w
    return (
        f"GPU idle {_pct(f.idle)} of the time while its job writes {(w.io_write_bytes_per_second or 0.0) / 1e6:.0f} "
        f"MB/s to storage and reads {(w.io_read_bytes_per_second or 0.0) / 1e6:.0f} MB/s (device-to-host "
        f"{(w.pcie_tx or 0.0) / 1e9:.2f} GB/s): the job stops the GPU to write checkpoints."
    )


def _input_starved_when(f: Facts) -> bool:
    working = f.w.job_cpu_cores is not None and not f.quiet  # the job works while its GPU idles (window means)
    return f.w.share("starved") >= STARVED_MIN or (working and f.idle >= STARVED_MIN)


def _input_starved_summary(f: Facts) -> str:
    w = f.w
    text = f"GPU idle {_pct(f.idle)} of the time while its job works (job CPU {f.cpu}): waiting for input"
    if f.remote:
        rate = (w.io_other_read_bytes_per_second or 0.0) / 1e6
        local = (w.io_read_bytes_per_second or 0.0) / 1e6
        return text + (
            f" from remote storage or another process (the job reads {rate:.0f} MB/s through sockets or pipes, "
            f"{local:.0f} MB/s from local storage): prefetch more, read in larger requests, cache the data locally."
        )
    if f.reading:
        rate = (w.io_read_bytes_per_second or 0.0) / 1e6
        return text + f" from storage (the job reads {rate:.0f} MB/s with processes in I/O wait)."
    job, proc = w.job_cpu_cores, w.max_process_cpu_cores
    if job is not None and proc is not None and job >= 1.5 * max(proc, 0.1) and not (f.waits and job < 1.0):
        return text + (
            f" prepared on the CPU by helper processes (the job uses {job:.1f} cores, its GPU process "
            f"{proc:.2f}): more workers or cheaper preprocessing."
        )
    if proc is not None and proc >= 0.8:
        return text + f" prepared in the training process itself ({proc:.2f} cores, single-threaded)."
    if f.waits:
        return text + (
            f" fetched in many short waits ({w.voluntary_switches_per_second or 0.0:.0f} a second, job CPU {f.cpu}, "
            "reads through sockets are in no per-process counter): input from remote storage (object store, network "
            "file system) or a slow pipeline between processes; for a model server, requests that come too rarely."
        )
    return text + "."


def _memory_bound_when(f: Facts) -> bool:
    return _utilized(f.w) and f.w.dram is not None and f.w.dram >= MEMORY_BOUND_DRAM


def _memory_bound_summary(f: Facts) -> str:
    w = f.w
    return (
        f"Busy {_pct(w.util)} with DRAM bandwidth {_pct(w.dram)} of peak and tensor cores {_pct(w.tensor)}: "
        "the kernels wait on HBM, not on arithmetic."
    )


def _compute_bound_when(f: Facts) -> bool:
    return _utilized(f.w)


def _compute_bound_summary(f: Facts) -> str:
    w = f.w
    return f"Busy: a kernel runs {_pct(w.util)} of the time, SMs {_pct(w.sm)} active, tensor cores {_pct(w.tensor)}."


def _underutilized_summary(f: Facts) -> str:
    w = f.w
    if w.job_cpu_cores is None:
        return (
            f"Busy {_pct(w.share('busy'))}, starved {_pct(w.share('starved'))}, unknown {_pct(w.share('unknown'))}: "
            "the GPU's processes or their CPU are not visible to gpuwarden (another PID namespace?), so the cause "
            "cannot be told."
        )
    return (
        f"Busy {_pct(w.share('busy'))}, starved {_pct(w.share('starved'))}, paused {_pct(w.share('paused'))}, "
        f"held idle {_pct(w.share('held_idle'))}, unknown {_pct(w.share('unknown'))}: no single cause dominates."
    )


def _verdict(w: GpuWindow, peers: Sequence[GpuWindow]) -> tuple[str, str]:
    """The first verdict rule (VERDICT_RULES, by rank) that holds for ``w``, and its summary."""
    facts = Facts(w, peers)
    rule = next(r for r in VERDICT_RULES if r.when is None or r.when(facts))
    assert rule.summary is not None  # every verdict rule has one
    return rule.name, rule.summary(facts)


Predicate = Callable[[Facts], bool]
Summary = Callable[[Facts], str]


@dataclass(frozen=True)
class Reason:
    """One reason of the diagnosis: ``name`` (a gpu_diagnosis reason label), ``severity`` (ok, info, warning,
    critical), ``remedies`` (what to do, most useful first), and for a verdict its ``rank`` among the verdict rules,
    its rule ``when`` and its one-line ``summary`` (both of the window's Facts)."""

    name: str
    severity: str
    remedies: tuple[str, ...]
    rank: int | None = None
    when: Predicate | None = None
    summary: Summary | None = None


#: Every reason a GPU can be given, in the order gpu_diagnosis{reason} lists them: its severity, what to do, and
#: for a verdict its rank (rules are tried lowest rank first; the first that holds is the verdict), its rule and its
#: summary. A reason without a rule is a finding reported next to a verdict (or ``gpu_lost``, from ``lost``).
REASON_TABLE: tuple[Reason, ...] = (
    Reason(
        "compute_bound",
        "ok",
        (
            "Nothing blocks the GPU. To go faster: mixed precision (bf16/fp8), larger batches, fused kernels, "
            "or more GPUs.",
        ),
        rank=11,
        when=_compute_bound_when,
        summary=_compute_bound_summary,
    ),
    Reason(
        "memory_bound",
        "ok",
        (
            "The kernels run at HBM bandwidth: cut bytes moved - fuse elementwise chains (torch.compile), keep data "
            "in bf16/fp8 instead of fp32, avoid needless copies (.contiguous(), .clone(), device-to-device copies).",
            "Raise arithmetic intensity: larger matrix tiles or batches; FlashAttention-style fused kernels.",
        ),
        rank=10,
        when=_memory_bound_when,
        summary=_memory_bound_summary,
    ),
    Reason(
        "input_starved",
        "warning",
        (
            "Move input work off the training loop: DataLoader(num_workers=N, pin_memory=True, "
            "persistent_workers=True, prefetch_factor>=2).",
            "Do decoding and augmentation on the GPU (NVIDIA DALI, torchvision.transforms.v2 on CUDA tensors).",
            "Cache preprocessed data; check that the job was given enough CPU cores (cgroup cpu.max, Slurm "
            "--cpus-per-task, Kubernetes CPU limits).",
            "Input from remote storage: more loader workers and a deeper prefetch, larger requests, a local cache "
            "of the dataset (node-local NVMe).",
        ),
        rank=9,
        when=_input_starved_when,
        summary=_input_starved_summary,
    ),
    Reason(
        "h2d_copy_bound",
        "warning",
        (
            "Copy from pinned memory: pin_memory=True in the DataLoader, or tensor.pin_memory() once; then "
            ".to(device, non_blocking=True) to overlap copies with compute.",
            "Keep data on the GPU across steps; send compact dtypes (uint8 images, not float32) and convert there.",
        ),
        rank=1,
        when=_h2d_copy_bound_when,
        summary=_h2d_copy_bound_summary,
    ),
    Reason(
        "held_idle",
        "warning",
        (
            "The GPU's memory is held but nothing runs: end the idle process (notebook kernel, stopped job) or "
            "release memory (del tensors; torch.cuda.empty_cache()).",
            "Schedulers: reclaim idle GPUs (JupyterHub culling, Slurm/Kubernetes idle-GPU policies).",
        ),
        rank=2,
        when=_held_idle_when,
        summary=_held_idle_summary,
    ),
    Reason(
        "job_paused",
        "info",
        (
            "The job itself stops between bursts of GPU work (evaluation, checkpointing, logging, sleeps, waiting on "
            "a service): overlap them with training (asynchronous checkpointing such as torch.distributed.checkpoint "
            "async_save, evaluation on another GPU), or release the GPU while waiting.",
        ),
        rank=8,
        when=_job_paused_when,
        summary=_job_paused_summary,
    ),
    Reason(
        "launch_bound",
        "warning",
        (
            "Capture the step in CUDA Graphs (torch.cuda.graphs, torch.compile(mode='reduce-overhead')) so one launch "
            "replays many kernels.",
            "Fuse small operations into larger kernels (torch.compile, fused optimizers foreach=True/fused=True) and "
            "use larger batches so each kernel fills the SMs.",
            "Remove host synchronisations in the loop (.item(), .cpu(), printing tensors).",
        ),
        rank=7,
        when=_launch_bound_when,
        summary=_launch_bound_summary,
    ),
    Reason(
        "waiting_on_peers",
        "warning",
        (
            "This GPU spins in a collective waiting for a slower rank: fix the straggler (its own diagnosis says "
            "why), balance the input work across ranks.",
            "Check the interconnect if no rank is slow (NVLink/PCIe errors, NCCL_DEBUG=INFO).",
        ),
        rank=4,
        when=_waiting_on_peers_when,
        summary=_waiting_on_peers_summary,
    ),
    Reason(
        "throttled",
        "warning",
        (
            "Clocks are held below their maximum: power cap (expected at full load; raise the limit with "
            "nvidia-smi -pl if allowed), thermal (check cooling, airflow, fan/chassis), hardware slowdown or "
            "power brake (check the power supply; nvidia-smi -q -d PERFORMANCE).",
        ),
        rank=3,
        when=_throttled_when,
        summary=_throttled_summary,
    ),
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
        "underutilized",
        "info",
        (
            "No single cause dominates: profile a few steps (torch.profiler, Nsight Systems) to see where the "
            "step time goes.",
        ),
        rank=12,
        when=None,
        summary=_underutilized_summary,
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
    Reason(
        "host_compute_bound",
        "warning",
        (
            "Work on the host consumes the GPU's output while the GPU waits: keep the optimizer step on the GPU "
            "(fused AdamW) where memory allows, or overlap the host step with the next forward and backward "
            "(DeepSpeed ZeRO-Offload's delayed parameter update, overlap_comm).",
            "Compute metrics on the GPU and copy scalars, not whole outputs; log every N steps.",
        ),
        rank=5,
        when=_host_compute_bound_when,
        summary=_host_compute_bound_summary,
    ),
    Reason(
        "checkpoint_bound",
        "warning",
        (
            "Checkpoint without stopping the GPU: asynchronous checkpointing (torch.distributed.checkpoint.async_save, "
            "a background thread writing a host copy), or checkpoint less often.",
            "Write to faster storage (local NVMe, then copy off), shard the checkpoint across ranks.",
        ),
        rank=6,
        when=_checkpoint_bound_when,
        summary=_checkpoint_bound_summary,
    ),
    Reason(
        "free", "ok", ("No process holds this GPU: it is available.",), rank=0, when=_free_when, summary=_free_summary
    ),
)


#: Derived from REASON_TABLE: the reason names, each one's severity and remedies, the verdict rules in their order.
REASONS = tuple(r.name for r in REASON_TABLE)
SEVERITY = {r.name: r.severity for r in REASON_TABLE}
REMEDIES: dict[str, tuple[str, ...]] = {r.name: r.remedies for r in REASON_TABLE}
VERDICT_RULES = tuple(sorted((r for r in REASON_TABLE if r.rank is not None), key=lambda r: r.rank or 0))
