"""Running windows of a GPU's poll intervals: each interval's states and readings, summed exactly as intervals enter
and leave a window, and the window's statistics (``GpuWindow``) computed from the sums at any later time.

An ``Interval`` is one poll interval of one GPU as the analyzer accounted it; ``Running`` keeps the intervals of
the last ``seconds`` (optionally only those of the current holder) and their sums; ``Captured`` is a copy of the
sums after one poll, from which ``window()`` gives the ``GpuWindow`` the diagnosis reads.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, fields
from typing import Any

from gpuwarden.insight.attribution import JobRef
from gpuwarden.insight.evidence import MEANS
from gpuwarden.insight.gpu_window import GpuWindow, Health, window_of
from gpuwarden.insight.vocabulary import states as st
from gpuwarden.insight.vocabulary.result import StateRun


@dataclass(slots=True)
class Interval:
    """One poll interval of one GPU as the analyzer accounted it: its end (Unix s) and length, seconds per state,
    who held the GPU, and the readings averaged over windows (None: unknown). Not changed once made."""

    end: float
    seconds: float
    states: dict[str, float]
    util_seconds: float
    holder: str
    pids: frozenset[int]
    means: tuple[float | None, ...]  # one per gpuwarden.insight.evidence.MEANS (pack_means)
    clock_ratio: float | None
    throttle: bool
    severe: bool
    reasons: frozenset[str]
    power_limit: float | None
    mem_used: int | None
    mem_total: int | None
    health: Health
    startup: float | None = None  # in the job's start-up: its age at the interval's end (s); None: steady


#: An interval as a window holds it: a plain tuple of numbers, strings and tuples of them (see ``pack``). The
#: garbage collector stops tracking such a tuple at the first collection that meets it, so a window of hundreds of
#: intervals per GPU adds nothing to the objects every full collection walks (an ``Interval`` with its frozensets
#: and ``Health`` stays tracked: four objects per GPU per second, tens of thousands at 64 GPUs).
Packed = tuple[Any, ...]

(_P_END, _P_SECONDS, _P_UTIL, _P_HOLDER, _P_PIDS, _P_MEANS, _P_CLOCK, _P_THROTTLE, _P_SEVERE, _P_REASONS,
 _P_POWER_LIMIT, _P_MEM_USED, _P_MEM_TOTAL, _P_HEALTH, _P_STARTUP, _P_STATES) = range(16)  # fmt: skip
_HEALTH_FIELDS = tuple(f.name for f in fields(Health))


def pack(iv: Interval) -> Packed:
    """Return ``iv`` as a window holds it: a flat tuple (PIDs and reasons sorted, the health's fields in order, the
    state seconds in ``states.STATES`` order with None for a state the interval does not name); ``unpack`` gives
    back an equal Interval."""
    h = iv.health
    return (
        iv.end, iv.seconds, iv.util_seconds, iv.holder, tuple(sorted(iv.pids)), tuple(iv.means), iv.clock_ratio,
        iv.throttle, iv.severe, tuple(sorted(iv.reasons)), iv.power_limit, iv.mem_used, iv.mem_total,
        tuple(getattr(h, n) for n in _HEALTH_FIELDS), iv.startup, tuple(iv.states.get(k) for k in st.STATES),
    )  # fmt: skip


def unpack(p: Packed) -> Interval:
    """Return the Interval that ``pack`` made ``p`` from (equal to it, field by field)."""
    return Interval(
        end=p[_P_END],
        seconds=p[_P_SECONDS],
        states={k: v for k, v in zip(st.STATES, p[_P_STATES], strict=True) if v is not None},
        util_seconds=p[_P_UTIL],
        holder=p[_P_HOLDER],
        pids=frozenset(p[_P_PIDS]),
        means=p[_P_MEANS],
        clock_ratio=p[_P_CLOCK],
        throttle=p[_P_THROTTLE],
        severe=p[_P_SEVERE],
        reasons=frozenset(p[_P_REASONS]),
        power_limit=p[_P_POWER_LIMIT],
        mem_used=p[_P_MEM_USED],
        mem_total=p[_P_MEM_TOTAL],
        health=Health(*p[_P_HEALTH]),
        startup=p[_P_STARTUP],
    )


# Slots of a window's sums: seconds per state, then the other sums, then a (value x seconds, seconds) pair per
# mean field.
_STATE_SLOT = {name: i for i, name in enumerate(st.STATES)}
_UTIL_SECONDS, _SECONDS, _THROTTLED, _SEVERE, _CLOCK_NUM, _CLOCK_DEN = range(len(st.STATES), len(st.STATES) + 6)
_MEAN_SLOT = [_CLOCK_DEN + 1 + 2 * i for i in range(len(MEANS))]
_SLOTS = _CLOCK_DEN + 1 + 2 * len(MEANS)
_SM_SLOT = _MEAN_SLOT[[m.name for m in MEANS].index("sm")]
_MEAN_NAMES = tuple(zip([m.name for m in MEANS], _MEAN_SLOT, strict=True))

#: Every finite double is an integer multiple of 2**-1074, so a sum held as an integer count of 2**-1074 is
#: exact: adding an interval and later removing it restores the sum bit for bit (no drift, no rebuild, and a
#: window holding only zeros reads exactly 0).
_SHIFT = 1074


def _exact(x: float) -> int:
    """Return ``x`` (a finite float) as an integer count of 2**-1074, exactly."""
    num, den = x.as_integer_ratio()  # den is a power of two, at most 2**1074
    return num << (_SHIFT + 1 - den.bit_length())


#: Polls faster than this are accounted in the windows at this granularity: an interval shorter than it takes the
#: next one in (``merged``) until it is this long, so that a window holds at most about window / GRANULARITY
#: intervals at any poll interval (300 s at a 0.1 s poll: 300 intervals per window, not 3,000). The state
#: counters are added up at every poll, exactly.
GRANULARITY_SECONDS = 1.0


def _weighted(a: float | None, wa: float, b: float | None, wb: float) -> float | None:
    """The time-weighted mean of two readings (an unknown one left out)."""
    if a is None:
        return b
    if b is None:
        return a
    return (a * wa + b * wb) / (wa + wb)


def mergeable(last: Interval, iv: Interval) -> bool:
    """True when ``iv`` can be taken into ``last``: contiguous, the same holder and processes, and together still
    at most GRANULARITY_SECONDS long."""
    return (
        abs(iv.end - iv.seconds - last.end) < 1e-6
        and last.holder == iv.holder
        and last.pids == iv.pids
        and (last.startup is None) == (iv.startup is None)
        and last.seconds + iv.seconds <= GRANULARITY_SECONDS + 1e-9
    )


def merged(a: Interval, b: Interval) -> Interval:
    """``a`` followed by ``b`` as one interval: seconds and states added, readings time-weighted, the clocks' flags
    those of the longer throttled or not share, the last poll's holder, memory and health."""
    wa, wb = a.seconds, b.seconds
    throttled = (wa if a.throttle else 0.0) + (wb if b.throttle else 0.0)
    severe = (wa if a.severe else 0.0) + (wb if b.severe else 0.0)
    clock = _weighted(a.clock_ratio if a.throttle else None, wa, b.clock_ratio if b.throttle else None, wb)
    return Interval(
        end=b.end,
        seconds=wa + wb,
        states={k: a.states.get(k, 0.0) + b.states.get(k, 0.0) for k in a.states.keys() | b.states.keys()},
        util_seconds=a.util_seconds + b.util_seconds,
        holder=b.holder,
        pids=b.pids,
        means=tuple(_weighted(x, wa, y, wb) for x, y in zip(a.means, b.means, strict=True)),
        clock_ratio=clock if clock is not None else b.clock_ratio,
        throttle=throttled * 2 >= wa + wb,
        severe=severe * 2 >= wa + wb,
        reasons=(a.reasons if a.throttle else frozenset()) | (b.reasons if b.throttle else frozenset()),
        power_limit=b.power_limit,
        mem_used=b.mem_used,
        mem_total=b.mem_total,
        health=b.health,
        startup=b.startup,
    )


def finite(x: float | None) -> float | None:
    """Return ``x``, or None when it is NaN or infinite: such a reading is unknown, not a value to average."""
    return x if x is None or math.isfinite(x) else None


def terms(p: Packed) -> list[tuple[int, int]]:
    """Return the (slot, exact integer) terms the interval ``p`` (``pack``) adds to a window's sums, zeros left out.

    Computed when the interval enters the windows (once for all three) and again when it leaves one: keeping
    them would cost about 4 KiB an interval held.
    """
    out = [(_STATE_SLOT[k], _exact(v)) for k, v in zip(st.STATES, p[_P_STATES], strict=True) if v]
    w = p[_P_SECONDS]
    if p[_P_UTIL]:
        out.append((_UTIL_SECONDS, _exact(p[_P_UTIL])))
    if w:
        throttle = p[_P_THROTTLE]
        ew = _exact(w)
        out.append((_SECONDS, ew))
        if w > 0:
            for slot, v in zip(_MEAN_SLOT, p[_P_MEANS], strict=True):
                if v is not None:
                    out.append((slot, _exact(v * w)))
                    out.append((slot + 1, ew))
            if throttle and p[_P_CLOCK] is not None:
                out.append((_CLOCK_NUM, _exact(p[_P_CLOCK] * w)))
                out.append((_CLOCK_DEN, ew))
        if throttle:
            out.append((_THROTTLED, ew))
        if p[_P_SEVERE]:
            out.append((_SEVERE, ew))
    return out


class _Agg:
    """Exact sums over a set of intervals: everything a GpuWindow needs, so adding an interval and removing one
    cost O(1) (reasons are counted, so their union survives removals)."""

    __slots__ = ("sums", "reasons")

    def __init__(self) -> None:
        self.sums = [0] * _SLOTS
        self.reasons: Counter[str] = Counter()

    def add(self, p: Packed, terms: list[tuple[int, int]]) -> None:
        """Add the interval ``p`` (``pack``), whose terms are ``terms`` (``terms(p)``), to the sums."""
        sums = self.sums
        for slot, v in terms:
            sums[slot] += v
        if p[_P_THROTTLE] and p[_P_REASONS]:
            self.reasons.update(p[_P_REASONS])

    def remove(self, p: Packed, known: list[tuple[int, int]] | None = None) -> None:
        """Remove the interval ``p``, added before, from the sums (``known``: its terms, when at hand)."""
        sums = self.sums
        for slot, v in known if known is not None else terms(p):
            sums[slot] -= v
        if p[_P_THROTTLE] and p[_P_REASONS]:
            self.reasons.subtract(p[_P_REASONS])


@dataclass(frozen=True, slots=True)
class Captured:
    """A running window as it stood after one poll: copies of its sums and reason counts, and its latest interval
    (intervals are not changed once made). What an InsightResult is computed from, at any later time."""

    sums: list[int]
    reasons: dict[str, int]
    last: Packed | None  # the latest interval (``pack``)

    def window(self, index: int, uuid: str, job: JobRef | None) -> GpuWindow:
        """The GpuWindow of the intervals summed; equals the from-scratch computation to float rounding
        (tests/test_insight_running.py)."""
        sums, last = self.sums, self.last
        one = 1 << _SHIFT
        total = sums[_SECONDS]
        held_job = job is not None and last is not None and last[_P_HOLDER] == "job"
        activity = self.activity(index)
        values = _means(sums)  # SM activity among them, as ``activity`` has it
        values.update(
            index=index,
            uuid=uuid,
            seconds=sum(sums[i] for i in _STATE_SLOT.values()) / one,
            states=activity.states,
            held=last is not None and last[_P_HOLDER] != "none",
            util=activity.util,
            sm_clock_ratio=_ratio(sums[_CLOCK_NUM], sums[_CLOCK_DEN]),
            throttle_fraction=_ratio(sums[_THROTTLED], total) or 0.0,
            severe_throttle_fraction=_ratio(sums[_SEVERE], total) or 0.0,
            throttle_reasons=tuple(sorted(r for r, n in self.reasons.items() if n > 0)),
            job=job.job if held_job else None,  # type: ignore[union-attr]
            job_kind=job.kind if held_job else None,  # type: ignore[union-attr]
            memory_used_bytes=last[_P_MEM_USED] if last else None,
            memory_total_bytes=last[_P_MEM_TOTAL] if last else None,
            power_limit_watts=last[_P_POWER_LIMIT] if last else None,
            health=Health(*last[_P_HEALTH]) if last else Health(),
            processes=last[_P_PIDS] if last else (),
            starting_seconds=last[_P_STARTUP] if last else None,
            rank=None,  # the job's rank on this GPU is the analysis's (gpuwarden.insight.analysis)
        )
        return window_of(values)  # every MEANS name is a float | None field of GpuWindow (test_insight_diagnosis)

    def activity(self, index: int) -> WindowActivity:
        """What the scores read of the intervals summed (states, util.gpu, SM activity): the same numbers as
        ``window()``'s, without the rest of a GpuWindow (the node and job windows of every GPU at every result)."""
        sums = self.sums
        one = 1 << _SHIFT
        return WindowActivity(
            index=index,
            states={k: sums[i] / one for k, i in _STATE_SLOT.items()},
            util=_ratio(sums[_STATE_SLOT["busy"]], sums[_UTIL_SECONDS]),
            sm=_ratio(sums[_SM_SLOT], sums[_SM_SLOT + 1]),
        )


@dataclass(frozen=True, slots=True)
class WindowActivity:
    """A window's state seconds (gpuwarden.insight.vocabulary.states.STATES) and mean activity (util.gpu and GPM SM
    activity, ratios; None: no interval knew it), as ``Captured.activity`` gives them: what the starved score, the
    shortfalls and the imbalances read (gpuwarden.insight.scores)."""

    index: int
    states: dict[str, float]
    util: float | None
    sm: float | None


def _ratio(num: int, den: int) -> float | None:
    """``num / den``; None when ``den`` is not positive (nothing summed)."""
    return num / den if den > 0 else None


def _means(sums: list[int]) -> dict[str, object]:
    """Each MEANS reading's time-weighted mean from a window's sums (None: no interval knew it)."""
    return {name: sums[s] / sums[s + 1] if sums[s + 1] > 0 else None for name, s in _MEAN_NAMES}


def _another_run(last: Packed, p: Packed) -> bool:
    """Whether the interval ``p`` starts another run of a same-holder window after ``last`` (both ``pack``ed):
    another holder, other processes, or the first interval after the job's start-up."""
    return (
        last[_P_HOLDER] != p[_P_HOLDER]
        or last[_P_PIDS] != p[_P_PIDS]
        or (last[_P_STARTUP] is not None and p[_P_STARTUP] is None)
    )


def _start(p: Packed) -> float:
    """The start (Unix s) of the interval ``p``."""
    start: float = p[_P_END] - p[_P_SECONDS]
    return start


class Running:
    """The trailing ``seconds`` of a GPU's intervals with their exact running sums (``same_holder``: only the
    trailing run with the latest interval's holder and PIDs). A push costs the terms of the interval that enters
    (computed once by the caller) and of those that leave, whatever the window holds. The intervals are held
    ``pack``ed (``held``), one tuple shared by a GPU's three windows."""

    __slots__ = ("seconds", "same_holder", "held", "agg")

    # A window of one holder (``same_holder``) also starts anew when its job's start-up ends (gpuwarden.insight.
    # startup): the steady-state verdict and its means leave the start-up out.

    def __init__(self, seconds: float, same_holder: bool) -> None:
        self.seconds = seconds
        self.same_holder = same_holder
        self.held: deque[Packed] = deque()
        self.agg = _Agg()

    @property
    def intervals(self) -> list[Interval]:
        """The intervals held, oldest first (made anew from the packed tuples: equal to those pushed)."""
        return [unpack(p) for p in self.held]

    def push(self, p: Packed, terms: list[tuple[int, int]]) -> None:
        """Add the newest interval ``p`` (``pack``; ``terms``: ``terms(p)``), then drop those that left the window
        (or the run, when ``same_holder``)."""
        held = self.held
        if self.same_holder and held and _another_run(held[-1], p):
            held.clear()
            self.agg = _Agg()
        held.append(p)
        self.agg.add(p, terms)
        self._drop_before(p[_P_END] - self.seconds)

    def replace_last(
        self, old: Packed, new: Packed, old_terms: list[tuple[int, int]], new_terms: list[tuple[int, int]]
    ) -> bool:
        """Put ``new`` in place of the newest interval when that is ``old`` (their terms given: the sums exchanged);
        False when the window's newest interval is another (it started anew since)."""
        held = self.held
        if not held or held[-1] is not old:
            return False
        self.agg.remove(old, old_terms)
        held[-1] = new
        self.agg.add(new, new_terms)
        self._drop_before(new[_P_END] - self.seconds)
        return True

    def _drop_before(self, horizon: float) -> None:
        """Remove the intervals that start before ``horizon`` (Unix s) from the window and its sums."""
        held = self.held
        while _start(held[0]) < horizon - 1e-9:
            self.agg.remove(held.popleft())

    def capture(self) -> Captured:
        """The window as it stands now (copies: later pushes leave the capture as it is)."""
        return Captured(list(self.agg.sums), dict(self.agg.reasons), self.held[-1] if self.held else None)

    def window(self, index: int, uuid: str, job: JobRef | None) -> GpuWindow:
        """The GpuWindow of the intervals held now."""
        return self.capture().window(index, uuid, job)


@dataclass(frozen=True, slots=True)
class GpuCapture:
    """One GPU's windows and state totals as they stood after a poll (``job``, ``diag``: None when it was down)."""

    index: int
    uuid: str
    node: Captured
    job: Captured | None
    diag: Captured | None
    totals: dict[str, float]
    idle: dict[str, float]
    runs: tuple[StateRun, ...] = ()
    held_idle_joules: float | None = None  # None: no power reading yet
    idle_joules: dict[str, float] | None = None  # by idle cause; None: no power reading yet
    peer_wait_seconds: float = 0.0  # kernel seconds waiting in a collective on a peer of the job
    peer_wait_joules: float | None = None  # their energy above the idle floor; None: no power reading yet
    idle_since: float | None = None  # the start of the run of idle intervals it is in; None: in use, or not known
