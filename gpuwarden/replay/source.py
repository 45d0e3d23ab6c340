"""A Source that plays a recorded trace back, looping, as if it were live.

Each ``poll()`` returns the next recorded poll re-stamped to the current time. Cumulative counters
(energy, clock event seconds, PCIe replays, ECC errors, process and host CPU seconds) continue
across a loop instead of jumping back, so rates over a replay stay true to the recording.
"""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path

from gpuwarden.model import GpuReading, HostReading, NodeStatic, PollResult, ProcessReading, XidEvent
from gpuwarden.source import SourceError
from gpuwarden.trace import TraceError, TraceHeader, read_trace

DEMO_TRACE = "demo.jsonl.gz"


def demo_trace_path() -> Path:
    """Return the path of the trace shipped in the package for ``serve --demo``."""
    return Path(str(resources.files("gpuwarden.replay").joinpath("data", DEMO_TRACE)))


def _counters(g: GpuReading) -> dict[str, float]:
    out: dict[str, float] = {}
    if g.energy_joules_total is not None:
        out["energy"] = g.energy_joules_total
    if g.pcie_replay_total is not None:
        out["pcie_replay"] = g.pcie_replay_total
    for k, v in g.clock_event_seconds_total.items():
        out[f"event:{k}"] = v
    for k, v in g.ecc_errors_total.items():
        out[f"ecc:{k}"] = v
    for p in g.processes or ():
        if p.cpu_seconds_total is not None:
            out[f"proc:{p.pid}"] = p.cpu_seconds_total
    return out


class ReplaySource:
    """Plays ``path`` back. ``open()`` raises SourceError for an unreadable or malformed trace.

    ``timing="wall"`` (serve) stamps each poll with the time it is played; ``timing="recorded"`` keeps the
    recorded spacing between polls, anchored at ``open()``, so a trace can be analysed as fast as it is read.

    ``header`` is the trace's header once opened; ``loops`` counts completed passes.
    """

    kind = "replay"

    def __init__(self, path: Path, *, loop: bool = True, timing: str = "wall") -> None:
        if timing not in ("wall", "recorded"):
            raise ValueError(f"timing must be 'wall' or 'recorded', not {timing!r}")
        self.path = path
        self.loop = loop
        self.timing = timing
        self._anchor = 0.0
        self.header: TraceHeader | None = None
        self.loops = 0
        self._polls: list[PollResult] = []
        self._next = 0
        self._gpu_span: dict[int, dict[str, float]] = {}
        self._host_span: dict[str, float] = {}

    @property
    def up(self) -> bool:
        """Always True: a recorded trace can always be read once opened."""
        return True

    @property
    def static(self) -> NodeStatic | None:
        """The recorded node's static facts; None before ``open()``."""
        return self.header.node if self.header is not None else None

    def open(self) -> NodeStatic:
        """Read the trace and return its node's static facts."""
        try:
            self.header, self._polls = read_trace(self.path)
        except TraceError as exc:
            raise SourceError(str(exc)) from exc
        first, last = self._polls[0], self._polls[-1]
        self._period = last.timestamp - first.timestamp + self.header.poll_interval_seconds
        self._anchor = time.time() - first.timestamp
        firsts = {g.index: _counters(g) for g in first.gpus}
        for g in last.gpus:
            a = firsts.get(g.index, {})
            self._gpu_span[g.index] = {k: v - a[k] for k, v in _counters(g).items() if k in a and v >= a[k]}
        if first.host is not None and last.host is not None:
            a = first.host.cpu_seconds_total
            self._host_span = {k: v - a[k] for k, v in last.host.cpu_seconds_total.items() if k in a}
        return self.header.node

    @property
    def polls_in_trace(self) -> int:
        """Number of polls in the trace."""
        return len(self._polls)

    @property
    def exhausted(self) -> bool:
        """True when ``loop`` is off and every poll has been played."""
        return not self.loop and self.loops > 0

    def poll(self) -> PollResult:
        """Return the next recorded poll, re-stamped to now, counters continued across loops."""
        if self.exhausted:
            raise SourceError(f"{self.path}: replay finished")
        rec = self._polls[self._next]
        k = self.loops
        self._next += 1
        if self._next == len(self._polls):
            self._next = 0
            self.loops += 1
        if self.timing == "recorded":
            # the recorded spacing, anchored at open() and continued loop after loop
            shift = self._anchor + k * self._period
            now = rec.timestamp + shift
        else:
            now = time.time()
            shift = now - rec.timestamp
        gpus = [self._gpu(g, shift, k) for g in rec.gpus]
        host = None
        if rec.host is not None:
            host = HostReading.model_construct(
                timestamp=rec.host.timestamp + shift,
                cpu_count=rec.host.cpu_count,
                cpu_seconds_total={
                    m: v + k * self._host_span.get(m, 0.0) for m, v in rec.host.cpu_seconds_total.items()
                },
            )
        return PollResult.model_construct(timestamp=now, duration_seconds=rec.duration_seconds, gpus=gpus, host=host)

    def _gpu(self, g: GpuReading, shift: float, k: int) -> GpuReading:
        span = self._gpu_span.get(g.index, {})
        upd: dict[str, object] = {
            "timestamp": g.timestamp + shift,
            "utilization_samples": [(t + shift, v) for t, v in g.utilization_samples],
            "xid_events": [XidEvent(timestamp=e.timestamp + shift, xid=e.xid) for e in g.xid_events],
        }
        if k:
            if g.energy_joules_total is not None:
                upd["energy_joules_total"] = g.energy_joules_total + k * span.get("energy", 0.0)
            if g.pcie_replay_total is not None:
                upd["pcie_replay_total"] = g.pcie_replay_total + int(k * span.get("pcie_replay", 0))
            upd["clock_event_seconds_total"] = {
                r: v + k * span.get(f"event:{r}", 0.0) for r, v in g.clock_event_seconds_total.items()
            }
            upd["ecc_errors_total"] = {e: v + int(k * span.get(f"ecc:{e}", 0)) for e, v in g.ecc_errors_total.items()}
            if g.processes is not None:
                upd["processes"] = [
                    p
                    if p.cpu_seconds_total is None
                    else ProcessReading.model_construct(
                        **{**p.__dict__, "cpu_seconds_total": p.cpu_seconds_total + k * span.get(f"proc:{p.pid}", 0.0)}
                    )
                    for p in g.processes
                ]
        return g.model_copy(update=upd)

    def errors(self) -> dict[tuple[str, str], int]:
        """A replay makes no NVML calls: always {}."""
        return {}

    def close(self) -> None:
        """Nothing to release."""
