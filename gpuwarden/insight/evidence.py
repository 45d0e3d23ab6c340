"""The evidence of a verdict: every number shown with it, declared once (``EVIDENCE``) - the windowed means the
analyzer keeps per interval (``MEANS``) and the values derived from a window - with the threshold each is compared
with, in words."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuwarden.insight.gpu_window import GpuWindow
from gpuwarden.insight.launches import LAUNCH_CPU_CORES, LAUNCH_SM_PER_UTIL
from gpuwarden.insight.vocabulary.states import (
    IO_READ_BYTES_PER_SECOND,
    IO_WRITE_BYTES_PER_SECOND,
    JOB_CPU_BUSY_CORES,
    WAITS_PER_SECOND,
)
from gpuwarden.insight.vocabulary.thresholds import (
    BUSY_UTIL,
    FP32_BUSY_MIN,
    H2D_RX_BYTES_PER_SECOND,
    H2D_SM_MAX,
    HELD_IDLE_MIN,
    HOST_TX_PER_RX,
    HOT_MARGIN_CELSIUS,
    MEMORY_BOUND_DRAM,
    MEMORY_FULL_RATIO,
    PAUSED_MIN,
    STARVED_MIN,
    TENSOR_IDLE_MAX,
    THROTTLE_CLOCK_RATIO,
    THROTTLE_MIN_FRACTION,
)


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
    Mean("stopped_processes", "job_processes_stopped", "processes", "stopped: SIGSTOP, Ctrl-Z, a debugger"),
    Mean(
        "listening_processes",
        "job_processes_listening",
        "processes",
        "serving: a server of the job listens for clients (the wildcard address or a chosen port; not a library's)",
    ),
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


#: Each EVIDENCE row as (its getter, name, unit, rule), unpacked once for evidence_of.
_ROWS = tuple((row.get, row.evidence, row.unit, row.rule) for row in EVIDENCE)


def evidence_of(w: GpuWindow) -> list[dict[str, str | float | None]]:
    """The numbers behind a verdict on ``w``: every EVIDENCE row with a value, in the table's order, each value
    rounded to 6 decimals, as the fields of an ``Evidence`` (name, value, unit, rule): ``Diagnosis(evidence=...)``
    validates them into Evidence in pydantic-core, a quarter of the time of building each model in Python (26 rows
    per GPU per result: docs/performance.md)."""
    out: list[dict[str, str | float | None]] = []
    for get, name, unit, rule in _ROWS:
        value = get(w)
        if value is not None:
            out.append({"name": name, "value": round(value, 6), "unit": unit, "rule": rule})
    return out
