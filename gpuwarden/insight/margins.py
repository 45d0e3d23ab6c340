"""Verdicts near a threshold: which other verdicts the same window gives when its numbers move by a margin, and a
memory that keeps a GPU's verdict while the evidence stays within that margin (hysteresis).

A window's means are estimates: util.gpu is sampled over periods of about 1/6 s (NVML), GPM metrics average over
their own interval, a job's CPU is read per poll, and two runs of one job differ by the phase of its steps within the
window. A rule that compares such a mean with a threshold flips when the mean sits on it: one run ``launch_bound``,
the next ``input_starved``. So each window is also judged with each measured value moved by MARGIN (relative, one
at a time, both ways): the verdicts that gives besides its own are the ones it cannot be told from (``alternatives``
of the Diagnosis, said in its summary), and a GPU keeps the verdict it was given while that verdict stays among them
(``VerdictMemory``): it changes only when the evidence has moved past the margin.

MARGIN is 15%. Two recordings of one workload on the same H100 (tests/data/traces, ``-b`` the second run): a
compute-bound bf16 loop differs run to run by 0.1-2.4% in every mean; a job fed by four DataLoader workers by 20-32%
in its rates and CPU (its step time follows the host), while the ratio the launch test compares (SM activity per
util.gpu) differs by 0.6% and its starved share by 0.08. So the margin covers the spread of the ratios and shares
the rules compare, and about half that of absolute rates: a verdict decided by a rate near its threshold
(``h2d_copy_bound``'s PCIe rate, ``checkpoint_bound``'s write rate) can differ between runs beyond it.
"""

from __future__ import annotations

import functools
import math
import operator
import threading
from collections.abc import Iterator, Sequence

from gpuwarden.insight.gpu_window import GpuWindow, replaced
from gpuwarden.insight.reasons import verdict_of_facts
from gpuwarden.insight.rules import Facts

#: Relative margin around every measured value.
MARGIN = 0.15
#: The GpuWindow values the verdict rules compare with thresholds (util.gpu, GPM activities and PCIe rates, the job's
#: CPU and I/O, clocks), moved one at a time.
MEASURED = (
    "util",
    "sm",
    "dram",
    "pcie_rx",
    "pcie_tx",
    "job_cpu_cores",
    "max_process_cpu_cores",
    "io_read_bytes_per_second",
    "io_other_read_bytes_per_second",
    "io_write_bytes_per_second",
    "voluntary_switches_per_second",
    "whole_idle_ratio",
    "sm_clock_ratio",
    "throttle_fraction",
    "severe_throttle_fraction",
)
#: The GpuWindow numbers the verdict rules read that are not moved: counts of processes compared with zero (blocked on
#: I/O, stopped, listening: a margin never moves a count across zero), the window's length and the start-up phase's
#: age (facts of the window, not estimates). tests/test_insight_core.py runs every rule on windows whose reads are
#: recorded: a number a rule reads that is in neither list fails it.
NOT_MOVED = frozenset(
    {"io_blocked_processes", "stopped_processes", "listening_processes", "seconds", "starting_seconds"}
)
#: Values that are ratios: kept within [0, 1] when moved.
_RATIOS = frozenset({"util", "sm", "dram", "whole_idle_ratio", "sm_clock_ratio", "throttle_fraction"})
#: The states whose share of the window the rules compare with thresholds, moved one at a time.
SHARES = ("busy", "starved", "paused", "held_idle")
#: Verdicts that no measured value decides (who holds the GPU, or was allocated it, whether its job is starting):
#: never alternatives.
_DECIDED = frozenset({"free", "allocated_idle", "starting"})


def _moved(w: GpuWindow) -> Iterator[tuple[str, GpuWindow]]:
    """``w`` with each measured value and state share moved up and down by MARGIN, one at a time, with the name of
    the field moved (values that are unknown or zero are left out: a margin of nothing moves nothing)."""
    for name in MEASURED:
        value = getattr(w, name)
        if not value:
            continue
        for factor in (1.0 - MARGIN, 1.0 + MARGIN):
            x = value * factor
            yield name, replaced(w, name, min(1.0, x) if name in _RATIOS else x)
    for state in SHARES:
        seconds = w.states.get(state, 0.0)
        if seconds <= 0:
            continue
        for factor in (1.0 - MARGIN, 1.0 + MARGIN):
            yield "states", replaced(w, "states", {**w.states, state: seconds * factor})


#: The fields of a window that ``Facts.lag`` (the peer test: gpuwarden.insight.peers.waits_on and straggler) reads of
#: it; a window moved in another field has the lag of the window it was moved from.
_LAG_READS = frozenset({"util", "sm"})


def alternatives(w: GpuWindow, peers: Sequence[GpuWindow], verdict: str) -> list[str]:
    """Return the verdicts other than ``verdict`` that window ``w`` (with ``peers``, the other GPUs of its job) gets
    with one of its measured values moved by MARGIN, in the order of the first window that gives each; [] when the
    verdict holds throughout the margin or no value decides it (``free``, ``starting``). Raises nothing."""
    if verdict in _DECIDED:
        return []
    out: list[str] = []
    lag = Facts(w, peers).lag  # the peer test over every peer: once, not once per moved window
    for field, moved in _moved(w):
        facts = Facts(moved, peers)
        if field not in _LAG_READS:
            facts.__dict__["lag"] = lag  # what Facts.lag keeps once read (gpuwarden.insight.rules._once)
        name = verdict_of_facts(facts)
        if name != verdict and name not in out and name not in _DECIDED:
            out.append(name)
    return out


#: A window whose every measured value, state share and peer activity is within this share of those the
#: alternatives were last found for (and with the same verdict, job and peers) reuses them: a 60 s window moves
#: about 2% a poll, and a sixth of the margin moves the line less than the estimates' own spread.
REUSE = MARGIN / 6
#: ... or within this much in absolute terms (ratios near 0).
REUSE_FLOOR = 1e-3


#: A value not known (None) in a signature: ``math.isclose`` holds it close to itself only (window values are
#: finite: a NaN or infinite reading is unknown, gpuwarden.insight.windows.finite).
_UNKNOWN = -math.inf


def _signature(w: GpuWindow, peers: Sequence[GpuWindow]) -> tuple[tuple[object, ...], list[float]]:
    """What the alternatives of ``w`` depend on: its job, holder and peers (compared for equality) and its measured
    values, state shares and the peers' activities (compared within REUSE; unknown values as _UNKNOWN)."""
    fixed = (w.processes, w.held, w.starting_seconds is None, tuple(p.uuid for p in peers))
    values: list[float | None] = list(_measured(w))
    seconds, states = w.seconds, w.states
    values += [states.get(s, 0.0) / seconds if seconds > 0 else 0.0 for s in SHARES]  # GpuWindow.share
    for p in peers:
        values += (p.util, p.sm)
    return fixed, [_UNKNOWN if v is None else v for v in values]


_measured = operator.attrgetter(*MEASURED)
#: ``|x - y| <= max(REUSE * max(|x|, |y|), REUSE_FLOOR)``, in C.
_within = functools.partial(math.isclose, rel_tol=REUSE, abs_tol=REUSE_FLOOR)


def _close(a: list[float], b: list[float]) -> bool:
    """Whether two value lists of one signature are within REUSE of each other, value by value (``math.isclose``
    with REUSE and REUSE_FLOOR; both unknown is close, one unknown is not)."""
    return len(a) == len(b) and all(map(_within, a, b))


class VerdictMemory:
    """The verdict last given to each GPU (by UUID) for the job holding it (its processes), kept so that a verdict
    stays while the evidence is within the margin (one entry per GPU the analyzer has seen); and the alternatives
    last found for each GPU, reused while its window stays within REUSE of them. Thread-safe: results are built by
    scrape threads, in any order; a verdict older than the one remembered is not remembered."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, tuple[tuple[int, ...], str, float]] = {}
        self._near: dict[str, tuple[tuple[object, ...], list[float], str, list[str]]] = {}

    def alternatives(self, w: GpuWindow, peers: Sequence[GpuWindow], verdict: str) -> list[str]:
        """``alternatives(w, peers, verdict)``, reused from the last time for this GPU when its window is within
        REUSE of that one's (same verdict, job and peers). Raises nothing."""
        fixed, values = _signature(w, peers)
        with self._lock:
            last = self._near.get(w.uuid)
        if last is not None and last[0] == fixed and last[2] == verdict and _close(last[1], values):
            return list(last[3])
        near = alternatives(w, peers, verdict)
        with self._lock:
            self._near[w.uuid] = (fixed, values, verdict, near)
        return list(near)

    def previous(self, uuid: str, processes: tuple[int, ...]) -> str | None:
        """Return the verdict last given to GPU ``uuid`` while ``processes`` held it, None when another job did."""
        with self._lock:
            last = self._last.get(uuid)
        return last[1] if last is not None and last[0] == processes else None

    def remember(self, uuid: str, processes: tuple[int, ...], verdict: str, timestamp: float) -> None:
        """Note ``verdict`` as given to GPU ``uuid`` held by ``processes`` at ``timestamp`` (Unix s) unless a later
        one is noted already."""
        with self._lock:
            last = self._last.get(uuid)
            if last is None or last[2] <= timestamp:
                self._last[uuid] = (processes, verdict, timestamp)
