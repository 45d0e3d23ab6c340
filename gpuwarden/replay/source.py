"""A Source that plays a recorded trace back, looping, as if it were live.

Each ``poll()`` returns the next recorded poll re-stamped to the current time. Every cumulative reading the
catalogue declares (gpuwarden.catalog.CUMULATIVE: energy, clock event seconds, PCIe replays, ECC, NVLink and
remapped-row counts, process, cgroup and host CPU seconds, ...) continues across a loop instead of jumping back:
loop ``k`` adds ``k`` times the counter's growth over one pass (its growth from the first to the last poll, scaled
to the pass's length, which includes one poll interval more), and the first poll of a loop is never below the last
one played (a float sum can land a hair below it), so Prometheus sees no reset at a loop and rates over a replay stay
those of the recording. Within a pass the recorded values are played as recorded. A process's start time is
re-stamped once, as the first poll's time is: it started as long before the replay as before the recording.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from gpuwarden.catalog import CUMULATIVE, Cumulative
from gpuwarden.model import GpuReading, HostReading, NodeStatic, PollResult, ProcessReading, XidEvent
from gpuwarden.source import SourceError
from gpuwarden.trace import TraceError, TraceHeader, TracePass

#: The traces shipped in the package for ``serve --demo SCENE``, by scene (tests/data/README.md says how each was made).
DEMO_TRACES = {"workloads": "demo.jsonl.gz", "faults": "demo-faults.jsonl.gz"}


def demo_trace_path(scene: str = "workloads") -> Path:
    """Return the path of the trace shipped in the package for ``serve --demo SCENE``; raises KeyError for a scene
    not in DEMO_TRACES."""
    return Path(str(resources.files("gpuwarden.replay").joinpath("data", DEMO_TRACES[scene])))


#: The catalogue's cumulative readings, by record.
_BY_RECORD: dict[str, tuple[Cumulative, ...]] = {
    r: tuple(c for c in CUMULATIVE if c.record == r) for r in ("gpu", "process", "host")
}

#: A counter's identity in a trace: (GPU index or -1 for the host, pid or -1, field, key or "").
CounterId = tuple[int, int, str, str]


def _values(obj: Any, record: str, gpu: int, pid: int) -> dict[CounterId, float]:
    """Every cumulative value of ``obj`` (a GpuReading, ProcessReading or HostReading), by counter id."""
    out: dict[CounterId, float] = {}
    for c in _BY_RECORD[record]:
        value = getattr(obj, c.field)
        if value is None:
            continue
        if c.keyed:
            out.update({(gpu, pid, c.field, k): v for k, v in value.items() if c.keys is None or k in c.keys})
        else:
            out[(gpu, pid, c.field, "")] = value
    return out


def _poll_values(poll: PollResult) -> dict[CounterId, float]:
    out: dict[CounterId, float] = {}
    for g in poll.gpus:
        out.update(_values(g, "gpu", g.index, -1))
        for p in g.processes or ():
            out.update(_values(p, "process", g.index, p.pid))
    if poll.host is not None:
        out.update(_values(poll.host, "host", -1, -1))
    return out


class ReplaySource:
    """Plays ``path`` back. ``open()`` raises SourceError for an unreadable or malformed trace.

    ``timing="wall"`` (serve) stamps each poll with the time it is played; ``timing="recorded"`` keeps the
    recorded spacing between polls, anchored at ``open()``, so a trace can be analysed as fast as it is read.

    ``annotate`` adds what the node's scheduler says now to each played poll's GPU readings (the job mapping
    directory, the kubelet's pods), as the live source does: a recording's GPUs allocated to a job that runs here.

    ``header`` is the trace's header once opened; ``loops`` counts completed passes. The trace is read a poll at a
    time, never held: ``open()`` reads it through once (to validate it and measure each counter's growth over a
    pass), and each pass of the replay reads the file again (gpuwarden.trace.TracePass), so a replay of an hour-long
    recording holds one poll as one of a minute does. A file that can no longer be read, or reads otherwise than
    at ``open()``, makes ``poll()`` raise SourceError.
    """

    kind = "replay"

    def __init__(
        self,
        path: Path,
        *,
        loop: bool = True,
        timing: str = "wall",
        annotate: Callable[[list[GpuReading]], list[GpuReading]] | None = None,
    ) -> None:
        if timing not in ("wall", "recorded"):
            raise ValueError(f"timing must be 'wall' or 'recorded', not {timing!r}")
        self.path = path
        self._annotate = annotate
        self.loop = loop
        self.timing = timing
        self._anchor = 0.0
        self.header: TraceHeader | None = None
        self.loops = 0
        self._count = 0  # polls in one pass
        self._stream: Iterator[PollResult] | None = None  # the pass being played
        self._next = 0
        self._span: dict[CounterId, float] = {}  # each counter's growth over one pass
        self._played: dict[CounterId, float] = {}  # each counter's last value played
        self._boundary = False  # the poll in hand is the first of a loop after the first

    @property
    def up(self) -> bool:
        """Always True: a recorded trace can always be read once opened."""
        return True

    @property
    def down_reason(self) -> str | None:
        """Always None: a trace that opened reads."""
        return None

    @property
    def static(self) -> NodeStatic | None:
        """The recorded node's static facts; None before ``open()``."""
        return self.header.node if self.header is not None else None

    def open(self) -> NodeStatic:
        """Read the trace through once and return its node's static facts. Raises SourceError for an unreadable or
        malformed trace (TraceError's line); a cut-off end is logged once, here."""
        self.close()
        reader = TracePass(self.path)
        accrues = {c.field for c in CUMULATIVE if c.accrues}
        first: PollResult | None = None
        last: PollResult | None = None
        a: dict[CounterId, float] = {}
        held: dict[CounterId, float] = {}
        changed: dict[CounterId, tuple[float, float]] = {}  # an accruing counter -> (time, value) of its last change
        count = 0
        try:
            for poll in reader:
                count += 1
                if first is None:
                    first, a = poll, _poll_values(poll)
                    held = dict(a)
                else:
                    for k, v in _poll_values(poll).items():
                        if k[2] in accrues and k in held and v != held[k]:
                            changed[k] = (poll.timestamp, v)
                        held[k] = v
                last = poll
        except TraceError as exc:
            raise SourceError(str(exc)) from exc
        assert first is not None and last is not None and reader.header is not None  # TracePass raises otherwise
        reader.warn_dropped()
        self.header, self._count = reader.header, count
        self._period = last.timestamp - first.timestamp + self.header.poll_interval_seconds
        self._anchor = time.time() - first.timestamp
        recorded = last.timestamp - first.timestamp
        scale = self._period / recorded if recorded > 0 else 1.0
        self._span = {k: (v - a[k]) * scale for k, v in _poll_values(last).items() if k in a and v >= a[k]}
        self._span.update(self._read_spans(a, first.timestamp, changed))
        self._played = {}
        self._boundary = False
        self._next = 0
        return self.header.node

    def _read_spans(
        self, first: dict[CounterId, float], t0: float, changed: dict[CounterId, tuple[float, float]]
    ) -> dict[CounterId, float]:
        """The growth over one pass of each counter that accrues (energy): its rate from the first poll (``first``,
        at ``t0``) to its last change (``changed``: its time and value; read every slow_interval_seconds and carried
        between reads, it stands still after it) times the pass. From first to last poll it would miss the polls
        after the last read: 20 s of a 30-poll trace's 30 s read every 10 s, and every replayed rate of it 0.7 of
        the recorded one."""
        return {
            k: (v - first[k]) / (t - t0) * self._period for k, (t, v) in changed.items() if t > t0 and v >= first[k]
        }

    @property
    def polls_in_trace(self) -> int:
        """Number of polls in the trace (0 before ``open()``)."""
        return self._count

    @property
    def exhausted(self) -> bool:
        """True when ``loop`` is off and every poll has been played."""
        return not self.loop and self.loops > 0

    def poll(self) -> PollResult:
        """Return the next recorded poll, re-stamped to now, counters continued across loops."""
        if self.exhausted:
            raise SourceError(f"{self.path}: replay finished")
        rec = self._read_next()
        k = self.loops
        self._boundary = k > 0 and self._next == 0
        self._next += 1
        if self._next == self._count:
            self._next = 0
            self.loops += 1
            self.close()  # the next poll starts another pass
        if self.timing == "recorded":
            # the recorded spacing, anchored at open() and continued loop after loop
            shift = self._anchor + k * self._period
            now = rec.timestamp + shift
        else:
            now = time.time()
            shift = now - rec.timestamp
        # a process started as long before the replay's first poll as it did before the recording's, and runs on
        # across passes as its counters do (the insight analyzer keys a process by its start)
        gpus = [self._gpu(g, shift, k, self._anchor) for g in rec.gpus]
        if self._annotate is not None:
            gpus = self._annotate(gpus)  # the scheduler's view now, read live (the job mapping, the kubelet)
        host = None
        if rec.host is not None:
            host = HostReading(
                **{**rec.host.__dict__, "timestamp": rec.host.timestamp + shift, **self._continued(rec.host, k, "host")}
            )
        return PollResult(timestamp=now, duration_seconds=rec.duration_seconds, gpus=gpus, host=host)

    def _read_next(self) -> PollResult:
        """The next poll of the pass being played (a new pass opened at its start). Raises SourceError when the
        trace can no longer be read or has fewer polls than at ``open()``."""
        try:
            if self._stream is None:
                self._stream = iter(TracePass(self.path))
                for _ in range(self._next):  # closed in the middle of a pass: resume where it was
                    next(self._stream)
            return next(self._stream)
        except TraceError as exc:
            self.close()
            raise SourceError(str(exc)) from exc
        except StopIteration:
            self.close()
            raise SourceError(
                f"{self.path}: the trace changed since it was opened (poll {self._next + 1} of {self._count} is gone)"
            ) from None

    def _continued(self, obj: Any, k: int, record: str, gpu: int = -1, pid: int = -1) -> dict[str, Any]:
        """The cumulative fields of ``obj`` in loop ``k``: recorded value + k passes' growth, never below the value
        played before at a loop's first poll (a float sum can land a hair below it: Prometheus would read a reset)."""
        out: dict[str, Any] = {}
        for c in _BY_RECORD[record]:
            value = getattr(obj, c.field)
            if value is None:
                continue
            items = value.items() if c.keyed else (("", value),)
            new = {}
            for key, v in items:
                cid = (gpu, pid, c.field, key)
                if c.keyed and c.keys is not None and key not in c.keys:
                    new[key] = v  # a flag, not a counter
                    continue
                x = v + k * self._span.get(cid, 0.0)
                if self._boundary:
                    x = max(x, self._played.get(cid, x))
                x = int(round(x)) if c.integer else x
                self._played[cid] = x
                new[key] = x
            out[c.field] = new if c.keyed else new[""]
        return out

    def _gpu(self, g: GpuReading, shift: float, k: int, started: float) -> GpuReading:
        upd: dict[str, object] = {
            "timestamp": g.timestamp + shift,
            "utilization_samples": [(t + shift, v) for t, v in g.utilization_samples],
            "xid_events": [XidEvent(timestamp=e.timestamp + shift, xid=e.xid) for e in g.xid_events],
            **self._continued(g, k, "gpu", g.index),
        }
        if g.processes is not None:
            upd["processes"] = [
                ProcessReading(**{
                    **p.__dict__,
                    **self._continued(p, k, "process", g.index, p.pid),
                    "create_time": None if p.create_time is None else p.create_time + started,
                })
                for p in g.processes
            ]  # fmt: skip
        return g.model_copy(update=upd)

    def errors(self) -> dict[tuple[str, str], int]:
        """A replay makes no NVML calls: always {}."""
        return {}

    def close(self) -> None:
        """Close the trace file of the pass being played, if one is open (the next poll opens it again)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()  # type: ignore[attr-defined]  # a generator: closes the file it reads
