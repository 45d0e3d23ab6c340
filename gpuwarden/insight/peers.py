"""The test of a GPU waiting on a peer of its job in a collective, and the straggler it waits on.

Shared by the diagnosis (``waiting_on_peers`` over the window, the ``straggler`` finding) and the accounting (the
kernel time spent waiting on a peer per poll interval, ``peer_wait_share``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

from gpuwarden.insight.vocabulary.thresholds import BUSY_UTIL, PEER_LAG, SPIN_SM_PER_UTIL


def utilized(w: Activity) -> bool:
    """util.gpu at or above BUSY_UTIL: kernels ran at least half the time."""
    return w.util is not None and w.util >= BUSY_UTIL


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


def spinning(w: Activity) -> bool:
    """Whether kernels run most of the time with the SMs mostly empty: a collective waiting (or tiny kernels)."""
    return utilized(w) and w.sm is not None and w.util is not None and w.sm < SPIN_SM_PER_UTIL * w.util


def straggler(w: A, peers: Sequence[A]) -> tuple[A, str] | None:
    """Return the peer this GPU waits on and how it lags ("CPU-side": it runs kernels at most PEER_LAG x as often;
    "GPU-side": its SMs are at least 1/PEER_LAG x as active), or None."""
    if w.util is None:
        return None
    cpu_side = [p for p in peers if p.util is not None and p.util <= PEER_LAG * w.util] if spinning(w) else []
    if cpu_side:
        return min(cpu_side, key=lambda p: (p.util or 0.0, p.index)), "CPU-side"
    if w.sm is not None:
        gpu_side = [p for p in peers if p.sm is not None and p.sm * PEER_LAG >= w.sm and not spinning(p)]
        if gpu_side:
            return max(gpu_side, key=lambda p: (p.sm or 0.0, -p.index)), "GPU-side"
    return None


def waiters(w: A, peers: Sequence[A]) -> list[A]:
    """Return the peers that wait on ``w`` in a collective (``w`` is their straggler), in ``peers``' order: each
    ``p`` with ``waits_on(p, [w]) is w``, that test written out for one candidate (a job's GPUs pairwise at every
    result: 64 GPUs in two jobs are 2,000 pairs)."""
    w_spins = spinning(w)
    out = []
    for p in peers:
        if not utilized(p) or p.sm is None or p.util is None:
            continue
        p_spins = spinning(p)
        if p_spins and w.util is not None and w.util <= PEER_LAG * p.util:
            out.append(p)  # CPU-side: w runs kernels at most PEER_LAG x as often as p
        elif w.sm is not None and w.sm * PEER_LAG >= p.sm and not w_spins:
            out.append(p)  # GPU-side: w's SMs at least 1/PEER_LAG x as active as p's
    return out


def waits_on(w: A, peers: Sequence[A]) -> A | None:
    """Return the peer ``w`` waits on in a collective (the rule of ``waiting_on_peers``), or None."""
    if not utilized(w) or w.sm is None:
        return None
    lag = straggler(w, peers)
    return lag[0] if lag is not None and (spinning(w) or lag[1] == "GPU-side") else None


def peer_wait_share(w: Activity, peers: Sequence[Activity]) -> float:
    """The share of the time (a ratio in [0, util.gpu]) GPU ``w`` spent in kernels that wait in a collective on the
    peer of its job that it waits on (the rule of ``waiting_on_peers``: ``_waits_on``); 0 when it waits on none.

    In data-parallel work every rank runs the same kernels per step, and the straggler (the last to reach the
    collective) hardly waits in it: so the waiter's kernel time beyond the straggler's is spent waiting (util.gpu
    of ``w`` minus the peer's: a CPU-side straggler), and the waiter's SMs, if its own kernels filled them as the
    straggler's do, would be active util x the peer's SM activity per util; what it lacks of that is waiting (a
    GPU-side straggler). The larger of the two, each a lower bound: a waiting collective keeps some SMs active (NCCL
    runs a block per channel), which the second counts as work. Raises nothing."""
    peer = waits_on(w, peers)
    if peer is None or w.util is None or peer.util is None:
        return 0.0
    by_time = w.util - peer.util
    by_fill = w.util - (w.sm or 0.0) * peer.util / peer.sm if peer.sm else 0.0
    return max(0.0, min(w.util, max(by_time, by_fill)))
