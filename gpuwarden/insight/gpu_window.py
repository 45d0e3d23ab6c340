"""What the verdict rules read of one GPU: its window statistics (``GpuWindow``) and health at the last poll."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields


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
    ``states`` are seconds per state (gpuwarden.insight.vocabulary.states.STATES); ``seconds`` their sum.
    ``throttle_fraction`` is the share of the time with any slowing clock-event reason;
    ``severe_throttle_fraction`` with a thermal / hardware one; ``throttle_reasons`` the names seen.
    ``starting_seconds``: the job's age (s) while it is in its start-up (gpuwarden.insight.startup), None once steady.
    ``rank``: the rank in its distributed job of the job's process on this GPU (RANK), None when unknown.
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
    stopped_processes: float | None = None
    listening_processes: float | None = None
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
    starting_seconds: float | None = None
    rank: int | None = None
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


_FIELDS = {f.name: f for f in fields(GpuWindow)}
#: The fields with a plain default, and those values (``health``'s factory default is made per window).
_DEFAULTS = {name: f.default for name, f in _FIELDS.items() if f.default is not MISSING}


def window_of(values: Mapping[str, object]) -> GpuWindow:
    """Return ``GpuWindow(**values)``, made as a new instance given the fields' values (GpuWindow has no slots, and its
    frozen ``__init__`` sets each of its 37 fields through ``object.__setattr__`` and checks nothing; a diagnosis
    window is made per GPU per result). Raises TypeError, as ``__init__`` would, for a name that is no field or a
    field without a default left out."""
    unknown = values.keys() - _FIELDS.keys()
    if unknown:
        raise TypeError(f"GpuWindow has no field {sorted(unknown)[0]!r}")
    attrs = {**_DEFAULTS, **values}
    if "health" not in attrs:
        attrs["health"] = Health()
    if len(attrs) != len(_FIELDS):
        missing = sorted(_FIELDS.keys() - attrs.keys())
        raise TypeError(f"GpuWindow needs field {missing[0]!r}")
    return _made(attrs)


def replaced(w: GpuWindow, name: str, value: object) -> GpuWindow:
    """Return ``dataclasses.replace(w, name=value)`` for one field ``name`` of GpuWindow, made as ``window_of``
    makes a window (the margins move each window's values up to 38 times a result). Raises nothing; ``name`` is
    the caller's field name."""
    return _made({**w.__dict__, name: value})


def _made(attrs: dict[str, object]) -> GpuWindow:
    """A GpuWindow whose attributes are ``attrs`` (every field, nothing else)."""
    w = object.__new__(GpuWindow)
    w.__dict__.update(attrs)
    return w


def named(w: GpuWindow) -> str:
    """Return ``GPU 3`` or, where its rank is known, ``GPU 3 (rank 11)``: how a GPU of a job is named in a sentence."""
    return f"GPU {w.index}" if w.rank is None else f"GPU {w.index} (rank {w.rank})"


def pct(x: float | None) -> str:
    """Return ratio ``x`` as a whole percentage (``42%``), ``n/a`` for None."""
    return "n/a" if x is None else f"{x:.0%}"
