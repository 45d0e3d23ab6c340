"""The insight analyzer: keeps a rolling window per GPU and derives states, scores, jobs and verdicts.

``InsightAnalyzer(window_seconds=300).prepare`` is the daemon's ``gpuwarden.poller.Analyzer``: the poller calls it
with every poll (in the poll thread), which accounts the poll in the running windows and captures them, and
stores the returned ``DeferredInsight`` in ``NodeSnapshot.analyses["insight"]``; the ``InsightResult`` (scores,
jobs, diagnosis) is built from that capture when a scrape or an API call first reads it (``insight_result``),
so a daemon polled every second and scraped every 15 s builds one in 15. The result is a frozen pydantic model,
so scrapes and API calls can read it from other threads while the analyzer accounts the next poll. Calling the
analyzer itself returns the result at once. Definitions are in docs/scores.md.
"""

from __future__ import annotations

import functools
import math
import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from gpuwarden.catalog import CLOCK_EVENT_REASONS
from gpuwarden.insight import states as st
from gpuwarden.insight.attribution import JobRef, attribute
from gpuwarden.insight.diagnosis import POWER_REASONS, SEVERE_REASONS, Diagnosis, GpuWindow, Health, diagnose
from gpuwarden.insight.scores import imbalance, shortfalls, starved_ratio
from gpuwarden.model import GpuReading, GpuStatic, HostReading, NodeStatic, PollResult, ProcessReading

#: At most this many jobs are reported (the ones holding most GPU memory): bounds ``gpu_job_*`` series.
MAX_JOBS = 64

#: A process first seen between these ages (seconds since it started) gets its mean CPU since start as the CPU
#: of its first interval; otherwise that interval's CPU is unknown.
FIRST_SIGHT_MIN_AGE = 1.0
FIRST_SIGHT_MAX_AGE = 60.0

_POWER_BITS = sum(b for b, n in CLOCK_EVENT_REASONS.items() if n in POWER_REASONS)
_SEVERE_BITS = sum(b for b, n in CLOCK_EVENT_REASONS.items() if n in SEVERE_REASONS)
_IDLE_CPU_MODES = ("idle", "iowait")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class GpuInsight(_Frozen):
    """One GPU's time accounting, scores and verdict.

    ``state_seconds_total``: seconds per state since the analyzer started (counters). ``window_state_seconds``:
    the same over the last ``window_seconds``. ``starved_ratio``: starved / accounted seconds in the window.
    ``activity_ratio``: mean GPM SM activity over the window (``activity_source`` "sm_activity"), else mean
    util.gpu ("utilization_gpu"). ``diagnosis``: None until MIN_SECONDS of history or while the GPU is down.
    """

    gpu: int
    uuid: str
    state_seconds_total: dict[str, float]
    idle_seconds_total: dict[str, float] = Field(
        default_factory=dict,
        description="seconds the GPU idled since the analyzer started, by cause (gpuwarden.insight.states."
        "IDLE_CAUSES); with state busy they add up to the accounted wall time",
    )
    window_state_seconds: dict[str, float]
    starved_ratio: float | None = None
    activity_ratio: float | None = None
    activity_source: str | None = None
    shortfall_ratio: float | None = Field(
        default=None, description="1 - activity / the busiest activity among the GPUs of its job (None: 1 GPU)"
    )
    diagnosis: Diagnosis | None = None


class ProcessJob(_Frozen):
    """One GPU process and its job (gpuwarden.insight.attribution)."""

    gpu: int
    uuid: str
    pid: int
    job: str
    job_kind: str
    container_id: str = ""
    user: str = ""
    command: str = Field(default="", description="process name (not the command line)")
    gpu_memory_bytes: int | None = None
    cpu_cores: float | None = Field(default=None, description="CPU seconds per second over the last poll interval")


class JobInsight(_Frozen):
    """A job on this node: the GPUs where it holds the most memory, and its imbalance over them.

    ``imbalance_ratio`` is None for a job on one GPU (see gpuwarden.insight.scores.imbalance).
    """

    job: str
    job_kind: str
    gpus: list[int]
    pids: list[int]
    imbalance_ratio: float | None = None
    activity_source: str | None = None


class InsightResult(_Frozen):
    """Everything the insight analyzer derived after one poll (what ``analyses["insight"]`` holds)."""

    timestamp: float
    window_seconds: float
    diagnosis_window_seconds: float
    gpus: list[GpuInsight]
    processes: list[ProcessJob]
    jobs: list[JobInsight]
    node_imbalance_ratio: float | None = None
    node_activity_source: str | None = None


@dataclass(slots=True)
class _Interval:
    end: float
    seconds: float
    states: dict[str, float]
    util_seconds: float
    holder: str
    pids: frozenset[int]
    sm: float | None
    tensor: float | None
    pcie_rx: float | None
    nvlink_rx: float | None
    job_cpu: float | None
    max_proc_cpu: float | None
    dram: float | None
    fp32: float | None
    io_read: float | None
    blocked: float | None
    host_busy: float | None
    clock_ratio: float | None
    throttle: bool
    severe: bool
    reasons: frozenset[str]
    power: float | None
    power_limit: float | None
    mem_used: int | None
    mem_total: int | None
    health: Health


#: Job kinds whose cgroup is the job itself: its CPU is the cgroup's (cgroup v2 cpu.stat, v1 cpuacct). Other
#: cgroups (a systemd unit, a session, a runner's shared cgroup) may hold unrelated processes.
CGROUP_JOBS = frozenset({"kubernetes", "slurm", "container"})

#: _Interval fields averaged over a window, weighted by the interval's seconds (None values skipped).
_MEAN_FIELDS = (
    "sm",
    "tensor",
    "pcie_rx",
    "nvlink_rx",
    "job_cpu",
    "max_proc_cpu",
    "host_busy",
    "power",
    "dram",
    "fp32",
    "io_read",
    "blocked",
)

# Slots of a window's sums: seconds per state, then the other sums, then a (value x seconds, seconds) pair per
# mean field.
_STATE_SLOT = {name: i for i, name in enumerate(st.STATES)}
_UTIL_SECONDS, _SECONDS, _THROTTLED, _SEVERE, _CLOCK_NUM, _CLOCK_DEN = range(len(st.STATES), len(st.STATES) + 6)
_MEAN_SLOT = {name: _CLOCK_DEN + 1 + 2 * i for i, name in enumerate(_MEAN_FIELDS)}
_SLOTS = _CLOCK_DEN + 1 + 2 * len(_MEAN_FIELDS)

#: Every finite double is an integer multiple of 2**-1074, so a sum held as an integer count of 2**-1074 is
#: exact: adding an interval and later removing it restores the sum bit for bit (no drift, no rebuild, and a
#: window holding only zeros reads exactly 0).
_SHIFT = 1074


def _exact(x: float) -> int:
    """Return ``x`` (a finite float) as an integer count of 2**-1074, exactly."""
    num, den = x.as_integer_ratio()  # den is a power of two, at most 2**1074
    return num << (_SHIFT + 1 - den.bit_length())


def _finite(x: float | None) -> float | None:
    """Return ``x``, or None when it is NaN or infinite: such a reading is unknown, not a value to average."""
    return x if x is None or math.isfinite(x) else None


def _terms(iv: _Interval) -> list[tuple[int, int]]:
    """Return the (slot, exact integer) terms ``iv`` adds to a window's sums, zeros left out.

    Computed when the interval enters the windows (once for all three) and again when it leaves one: keeping
    them would cost about 4 KiB an interval held.
    """
    out = [(_STATE_SLOT[k], _exact(v)) for k, v in iv.states.items() if v]
    w = iv.seconds
    if iv.util_seconds:
        out.append((_UTIL_SECONDS, _exact(iv.util_seconds)))
    if w:
        ew = _exact(w)
        out.append((_SECONDS, ew))
        if w > 0:
            for name in _MEAN_FIELDS:
                v = getattr(iv, name)
                if v is not None:
                    slot = _MEAN_SLOT[name]
                    out.append((slot, _exact(v * w)))
                    out.append((slot + 1, ew))
            if iv.throttle and iv.clock_ratio is not None:
                out.append((_CLOCK_NUM, _exact(iv.clock_ratio * w)))
                out.append((_CLOCK_DEN, ew))
        if iv.throttle:
            out.append((_THROTTLED, ew))
        if iv.severe:
            out.append((_SEVERE, ew))
    return out


class _Agg:
    """Exact sums over a set of intervals: everything a GpuWindow needs, so adding an interval and removing one
    cost O(1) (reasons are counted, so their union survives removals)."""

    __slots__ = ("sums", "reasons")

    def __init__(self) -> None:
        self.sums = [0] * _SLOTS
        self.reasons: Counter[str] = Counter()

    def add(self, iv: _Interval, terms: list[tuple[int, int]]) -> None:
        """Add ``iv``, whose terms are ``terms`` (``_terms(iv)``), to the sums."""
        sums = self.sums
        for slot, v in terms:
            sums[slot] += v
        if iv.throttle and iv.reasons:
            self.reasons.update(iv.reasons)

    def remove(self, iv: _Interval) -> None:
        """Remove ``iv``, added before, from the sums."""
        sums = self.sums
        for slot, v in _terms(iv):
            sums[slot] -= v
        if iv.throttle and iv.reasons:
            self.reasons.subtract(iv.reasons)


@dataclass(frozen=True, slots=True)
class _Captured:
    """A running window as it stood after one poll: copies of its sums and reason counts, and its latest interval
    (intervals are not changed once made). What an InsightResult is computed from, at any later time."""

    sums: list[int]
    reasons: dict[str, int]
    last: _Interval | None

    def window(self, index: int, uuid: str, job: JobRef | None) -> GpuWindow:
        """The GpuWindow of the intervals summed; equals the from-scratch computation to float rounding
        (tests/test_insight_running.py)."""
        sums, last = self.sums, self.last

        def mean(name: str) -> float | None:
            slot = _MEAN_SLOT[name]
            return sums[slot] / sums[slot + 1] if sums[slot + 1] > 0 else None

        one = 1 << _SHIFT
        states = {k: sums[i] / one for k, i in _STATE_SLOT.items()}
        total = sums[_SECONDS]
        util_secs = sums[_UTIL_SECONDS]
        held_job = job is not None and last is not None and last.holder == "job"
        return GpuWindow(
            index=index,
            uuid=uuid,
            seconds=sum(sums[i] for i in _STATE_SLOT.values()) / one,
            states=states,
            held=last is not None and last.holder != "none",
            util=sums[_STATE_SLOT["busy"]] / util_secs if util_secs > 0 else None,
            sm=mean("sm"),
            tensor=mean("tensor"),
            pcie_rx=mean("pcie_rx"),
            nvlink_rx=mean("nvlink_rx"),
            job_cpu_cores=mean("job_cpu"),
            max_process_cpu_cores=mean("max_proc_cpu"),
            dram=mean("dram"),
            fp32=mean("fp32"),
            io_read_bytes_per_second=mean("io_read"),
            io_blocked_processes=mean("blocked"),
            host_cpu_busy_ratio=mean("host_busy"),
            memory_used_bytes=last.mem_used if last else None,
            memory_total_bytes=last.mem_total if last else None,
            sm_clock_ratio=sums[_CLOCK_NUM] / sums[_CLOCK_DEN] if sums[_CLOCK_DEN] > 0 else None,
            throttle_fraction=sums[_THROTTLED] / total if total > 0 else 0.0,
            severe_throttle_fraction=sums[_SEVERE] / total if total > 0 else 0.0,
            throttle_reasons=tuple(sorted(r for r, n in self.reasons.items() if n > 0)),
            power_watts=mean("power"),
            power_limit_watts=last.power_limit if last else None,
            health=last.health if last else Health(),
            job=job.job if held_job else None,  # type: ignore[union-attr]
            job_kind=job.kind if held_job else None,  # type: ignore[union-attr]
            processes=tuple(sorted(last.pids)) if last else (),
        )


class _Running:
    """The trailing ``seconds`` of a GPU's intervals with their exact running sums (``same_holder``: only the
    trailing run with the latest interval's holder and PIDs). A push costs the terms of the interval that enters
    (computed once by the caller) and of those that leave, whatever the window holds."""

    __slots__ = ("seconds", "same_holder", "intervals", "agg")

    def __init__(self, seconds: float, same_holder: bool) -> None:
        self.seconds = seconds
        self.same_holder = same_holder
        self.intervals: deque[_Interval] = deque()
        self.agg = _Agg()

    def push(self, iv: _Interval, terms: list[tuple[int, int]]) -> None:
        """Add the newest interval (``terms``: ``_terms(iv)``), then drop those that left the window (or the run,
        when ``same_holder``)."""
        ivs = self.intervals
        if self.same_holder and ivs and (ivs[-1].holder != iv.holder or ivs[-1].pids != iv.pids):
            ivs.clear()
            self.agg = _Agg()
        ivs.append(iv)
        self.agg.add(iv, terms)
        horizon = iv.end - self.seconds
        while ivs[0].end - ivs[0].seconds < horizon - 1e-9:
            self.agg.remove(ivs.popleft())

    def capture(self) -> _Captured:
        """The window as it stands now (copies: later pushes leave the capture as it is)."""
        return _Captured(list(self.agg.sums), dict(self.agg.reasons), self.intervals[-1] if self.intervals else None)

    def window(self, index: int, uuid: str, job: JobRef | None) -> GpuWindow:
        """The GpuWindow of the intervals held now."""
        return self.capture().window(index, uuid, job)


@dataclass(frozen=True, slots=True)
class _GpuCapture:
    """One GPU's windows and state totals as they stood after a poll (``job``, ``diag``: None when it was down)."""

    index: int
    uuid: str
    node: _Captured
    job: _Captured | None
    diag: _Captured | None
    totals: dict[str, float]
    idle: dict[str, float]


class DeferredInsight:
    """The InsightResult of one poll, computed on the first call and kept (thread-safe): what the daemon's poller
    stores in ``NodeSnapshot.analyses["insight"]``. A result costs more to build than the poll's accounting (windows,
    scores, the diagnosis and its models); read once per scrape, most polls never build theirs.
    """

    __slots__ = ("_compute", "_result", "_lock")

    def __init__(self, compute: Callable[[], InsightResult]) -> None:
        self._compute: Callable[[], InsightResult] | None = compute
        self._result: InsightResult | None = None
        self._lock = threading.Lock()

    def __call__(self) -> InsightResult:
        """Return the result, computing it the first time."""
        with self._lock:
            if self._result is None:
                assert self._compute is not None
                self._result, self._compute = self._compute(), None
            return self._result


def insight_result(value: object) -> InsightResult | None:
    """Return the InsightResult held in ``NodeSnapshot.analyses["insight"]`` (an InsightResult or a DeferredInsight),
    None for anything else (no analysis yet)."""
    if isinstance(value, DeferredInsight):
        return value()
    return value if isinstance(value, InsightResult) else None


@dataclass(slots=True)
class _GpuState:
    index: int
    node: _Running
    job: _Running
    diag: _Running
    last_ts: float | None = None
    last_work: float | None = None
    last_pids: frozenset[int] = frozenset()
    xids: tuple[int, ...] = ()
    gpm_seen: dict[str, float] | None = None  # the GPM values of the last poll
    gpm_changes: int = 0  # new GPM computations since the current job appeared
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(st.STATES, 0.0))
    idle: dict[str, float] = field(default_factory=lambda: dict.fromkeys(st.IDLE_CAUSES, 0.0))


class InsightAnalyzer:
    """Stateful analyzer: ``analyzer(poll, static) -> InsightResult``.

    ``window_seconds`` (default 300) is the window of ``gpu_starved_ratio`` and the imbalance scores;
    ``diagnosis_seconds`` (default 60, at most the window) that of the verdicts, further limited to the
    time since the GPU's current set of processes appeared (so a verdict describes the job holding it now).
    Not thread-safe: one poll thread calls it; its results are immutable.
    """

    def __init__(self, window_seconds: float = 300.0, diagnosis_seconds: float = 60.0) -> None:
        if window_seconds <= 0 or diagnosis_seconds <= 0:
            raise ValueError("window_seconds and diagnosis_seconds must be positive")
        self.window_seconds = float(window_seconds)
        self.diagnosis_seconds = float(min(diagnosis_seconds, window_seconds))
        self._gpus: dict[str, _GpuState] = {}
        self._proc_cpu: dict[int, tuple[float | None, float, float, float, int | None, float | None]] = {}
        self._host: HostReading | None = None
        self._busy: float | None = None
        self._jobs: dict[tuple[int, float | None, str | None], JobRef] = {}

    # -- per-poll inputs -------------------------------------------------------------------------------

    def _host_busy(self, host: HostReading | None) -> float | None:
        """The host's busy CPU share between its last two readings. A poll without a host reading (the live
        source reads /proc/stat at most every 5 s, gpuwarden.nvml.source.HOST_MIN_GAP) carries the last share."""
        if host is None:
            return self._busy
        prev, self._host = self._host, host
        self._busy = None
        if prev is not None:
            total = sum(host.cpu_seconds_total.values()) - sum(prev.cpu_seconds_total.values())
            idle = sum(host.cpu_seconds_total.get(m, 0.0) - prev.cpu_seconds_total.get(m, 0.0) for m in _IDLE_CPU_MODES)
            if total > 0:
                self._busy = min(1.0, max(0.0, (total - idle) / total))
        return self._busy

    def _process_rates(self, gpus: list[GpuReading]) -> dict[int, tuple[float, float, float | None, float | None]]:
        """Per GPU process since the previous poll: (CPU cores of the process, CPU cores of the process with its
        descendants such as DataLoader workers, where recorded, bytes read per second by them, CPU cores of its
        cgroup; None where unknown). First sight: see FIRST_SIGHT_MAX_AGE."""
        rates: dict[int, tuple[float, float, float | None, float | None]] = {}
        seen: dict[int, tuple[float | None, float, float, float, int | None, float | None]] = {}
        for g in gpus:
            for p in g.processes or ():
                if p.cpu_seconds_total is None or p.pid in seen:
                    continue
                tree = p.tree_cpu_seconds_total if p.tree_cpu_seconds_total is not None else p.cpu_seconds_total
                seen[p.pid] = (
                    p.create_time,
                    p.cpu_seconds_total,
                    g.timestamp,
                    tree,
                    p.tree_read_bytes_total,
                    p.cgroup_cpu_seconds_total,
                )
                prev = self._proc_cpu.get(p.pid)
                if prev is None or prev[0] != p.create_time:
                    # first sight of a young process: its mean since it started estimates this interval;
                    # an older one's lifetime mean says little about now, so it stays unknown until next poll
                    age = g.timestamp - p.create_time if p.create_time is not None else 0.0
                    if FIRST_SIGHT_MIN_AGE <= age <= FIRST_SIGHT_MAX_AGE:
                        rates[p.pid] = (p.cpu_seconds_total / age, tree / age, None, None)
                    continue
                dt = g.timestamp - prev[2]
                dc = p.cpu_seconds_total - prev[1]
                dtree = tree - prev[3]
                if dt > 0 and dc >= 0:
                    read = None
                    if p.tree_read_bytes_total is not None and prev[4] is not None:
                        read = max(0.0, (p.tree_read_bytes_total - prev[4]) / dt)
                    group = None
                    if p.cgroup_cpu_seconds_total is not None and prev[5] is not None:
                        group = max(0.0, (p.cgroup_cpu_seconds_total - prev[5]) / dt)
                    rates[p.pid] = (dc / dt, max(dtree, dc) / dt, read, group)
        self._proc_cpu = seen
        return rates

    def _job_cpu(
        self, procs: Sequence[ProcessReading], rates: dict[int, tuple[float, float, float | None, float | None]]
    ) -> float:
        """CPU cores of the GPU's jobs: a job that is its cgroup (Kubernetes pod, Slurm job, container) counts its
        cgroup's CPU once; any other process counts itself and its descendants."""
        groups: dict[str, float] = {}
        total = 0.0
        for p in procs:
            r = rates.get(p.pid)
            if r is None:
                continue
            if r[3] is not None and p.cgroup and self._job(p).kind in CGROUP_JOBS:
                groups[p.cgroup] = r[3]
            else:
                total += r[1]
        return total + sum(groups.values())

    def _job(self, p) -> JobRef:  # noqa: ANN001 - ProcessReading
        key = (p.pid, p.create_time, p.cgroup)
        ref = self._jobs.get(key)
        if ref is None:
            ref = self._jobs[key] = attribute(p)
        return ref

    # -- the analyzer ----------------------------------------------------------------------------------

    def __call__(self, poll: PollResult, static: NodeStatic) -> InsightResult:
        """Account the poll, update the windows and return the new InsightResult (``prepare(...)()``)."""
        return self.prepare(poll, static)()

    def prepare(self, poll: PollResult, static: NodeStatic) -> DeferredInsight:
        """Account the poll and update the windows; return the InsightResult of this poll, computed when first
        asked for (the daemon's analyzer: a result is read once per scrape, and polls come more often)."""
        statics = {s.index: s for s in static.gpus}
        host_busy = self._host_busy(poll.host)
        up = [g for g in poll.gpus if g.up]
        rates = self._process_rates(up)
        live_jobs: dict[tuple[int, float | None, str | None], JobRef] = {}
        processes: list[ProcessJob] = []
        primary: dict[str, JobRef] = {}
        for g in up:
            best: tuple[int, int] | None = None
            for p in g.processes or ():
                ref = self._job(p)
                live_jobs[(p.pid, p.create_time, p.cgroup)] = ref
                processes.append(
                    ProcessJob.model_construct(
                        gpu=g.index,
                        uuid=g.uuid,
                        pid=p.pid,
                        job=ref.job,
                        job_kind=ref.kind,
                        container_id=ref.container_id,
                        user=p.username or "",
                        command=p.name or "",
                        gpu_memory_bytes=p.gpu_memory_bytes,
                        cpu_cores=rates[p.pid][0] if p.pid in rates else None,
                    )
                )
                rank = (p.gpu_memory_bytes or 0, -p.pid)
                if best is None or rank > best:
                    best, primary[g.uuid] = rank, ref
        self._jobs = live_jobs
        for g in up:
            self._account(g, statics.get(g.index), rates, host_busy, primary.get(g.uuid))
        up_uuids = {g.uuid for g in up}
        gpus = [
            _GpuCapture(
                index=state.index,
                uuid=uuid,
                node=state.node.capture(),
                job=state.job.capture() if uuid in up_uuids else None,
                diag=state.diag.capture() if uuid in up_uuids else None,
                totals=dict(state.totals),
                idle=dict(state.idle),
            )
            for uuid, state in sorted(self._gpus.items(), key=lambda kv: kv[1].index)
        ]
        return DeferredInsight(
            functools.partial(
                _result,
                poll.timestamp,
                self.window_seconds,
                self.diagnosis_seconds,
                gpus,
                [g.uuid for g in up],
                processes,
                primary,
            )
        )

    def _account(
        self,
        g: GpuReading,
        s: GpuStatic | None,
        rates: dict[int, tuple[float, float, float | None, float | None]],
        host_busy: float | None,
        job: JobRef | None,
    ) -> None:
        state = self._gpus.get(g.uuid)
        if state is None:
            state = self._gpus[g.uuid] = _GpuState(
                index=g.index,
                node=_Running(self.window_seconds, same_holder=False),
                job=_Running(self.window_seconds, same_holder=True),
                diag=_Running(self.diagnosis_seconds, same_holder=True),
            )
        state.index = g.index
        procs = g.processes
        pids = frozenset(p.pid for p in procs or ())
        if pids != state.last_pids and not (pids & state.last_pids):
            state.last_work = None  # another job: the previous one's GPU work says nothing about this one
            state.gpm_changes = 0
        if g.gpm and g.gpm != state.gpm_seen:
            state.gpm_changes += 1
        state.gpm_seen = g.gpm
        start, state.last_ts, state.last_pids = state.last_ts, g.timestamp, pids
        if g.xid_events:
            state.xids = tuple(sorted(set(state.xids) | {e.xid for e in g.xid_events}))
        if start is None or not 0 < g.timestamp - start <= st.MAX_INTERVAL_SECONDS:
            return
        known = [rates[p.pid] for p in procs or () if p.pid in rates]
        job_cpu = self._job_cpu(procs or (), rates) if known else None
        reads = [k[2] for k in known if k[2] is not None]
        io_read = sum(reads) if reads else None
        blocked_counts = [p.tree_blocked for p in procs or () if p.tree_blocked is not None]
        blocked = float(sum(blocked_counts)) if blocked_counts else None
        io_waiting = (io_read or 0.0) >= st.IO_READ_BYTES_PER_SECOND or (blocked or 0.0) > 0
        holder = st.holder_of(
            procs is not None, len(procs or ()), g.memory_used_bytes, g.memory_reserved_bytes is not None
        )
        segs = st.segments(start, g.timestamp, g.utilization_samples, g.utilization_gpu_ratio)
        secs, state.last_work = st.account(segs, holder, job_cpu, state.last_work, io_waiting)
        for k, v in secs.items():
            state.totals[k] += v
        for k, v in st.idle_causes(secs, job_cpu, io_waiting).items():
            state.idle[k] += v
        bits = g.clock_event_reasons or 0
        clock_max = s.clock_max_hertz.get("sm") if s is not None else None
        clock = g.clock_hertz.get("sm")
        # GPM metrics average over the time since the previous computation (every gpm_interval in serve, carried in
        # between): the first one after a job change covers time before it. Only the second on describes this job.
        gpm = g.gpm if state.gpm_changes >= 2 else {}
        iv = _Interval(
            end=g.timestamp,
            seconds=g.timestamp - start,
            states=secs,
            util_seconds=sum(x.seconds for x in segs if x.util is not None),
            holder=holder,
            pids=pids,
            sm=_finite(gpm.get("sm_activity")),
            tensor=_finite(gpm.get("tensor_activity")),
            pcie_rx=_finite(gpm.get("pcie_rx_bytes_per_second")),
            nvlink_rx=_finite(gpm.get("nvlink_rx_bytes_per_second")),
            job_cpu=job_cpu,
            max_proc_cpu=max(k[0] for k in known) if known else None,
            dram=_finite(gpm.get("dram_activity")),
            fp32=_finite(gpm.get("fp32_activity")),
            io_read=io_read,
            blocked=blocked,
            host_busy=host_busy,
            clock_ratio=_finite(clock / clock_max) if clock is not None and clock_max else None,
            throttle=bool(bits & (_POWER_BITS | _SEVERE_BITS)),
            severe=bool(bits & _SEVERE_BITS),
            reasons=frozenset(n for b, n in CLOCK_EVENT_REASONS.items() if bits & b and n != "gpu_idle"),
            power=_finite(g.power_usage_watts),
            power_limit=g.power_limit_watts,
            mem_used=g.memory_used_bytes,
            mem_total=g.memory_total_bytes or (s.memory_total_bytes if s is not None else None),
            health=Health(
                temperature_celsius=g.temperature_gpu_celsius,
                slowdown_celsius=s.temperature_thresholds_celsius.get("slowdown") if s is not None else None,
                memory_temperature_celsius=g.temperature_memory_celsius,
                memory_max_celsius=s.temperature_thresholds_celsius.get("memory_max") if s is not None else None,
                uncorrected_ecc=g.ecc_errors_total.get("uncorrected_volatile"),
                remap_pending=bool(g.remapped_rows.get("pending")),
                remap_failed=bool(g.remapped_rows.get("failure")),
                xids=state.xids,
            ),
        )
        terms = _terms(iv)
        for running in (state.node, state.job, state.diag):
            running.push(iv, terms)


def _activity(windows: list[GpuWindow]) -> tuple[list[float], str] | None:
    """Per-GPU activity: SM activity when every GPU has it, else util.gpu when every GPU has it."""
    if windows and all(w.sm is not None for w in windows):
        return [w.sm for w in windows], "sm_activity"  # type: ignore[misc]
    if windows and all(w.util is not None for w in windows):
        return [w.util for w in windows], "utilization_gpu"  # type: ignore[misc]
    return None


def _result(
    timestamp: float,
    window_seconds: float,
    diagnosis_seconds: float,
    captures: list[_GpuCapture],
    up: list[str],
    processes: list[ProcessJob],
    primary: dict[str, JobRef],
) -> InsightResult:
    """The InsightResult of one poll from what the analyzer captured after it (``up``: UUIDs of the GPUs up, in the
    poll's order; ``primary``: each GPU's job, the one holding most of its memory)."""
    diag_w: dict[str, GpuWindow] = {}
    job_w: dict[str, GpuWindow] = {}
    node_w: dict[str, GpuWindow] = {}
    index = {c.uuid: c.index for c in captures}
    for c in captures:
        job = primary.get(c.uuid)
        node_w[c.uuid] = c.node.window(c.index, c.uuid, job)
        if c.diag is not None and c.job is not None:
            diag_w[c.uuid] = c.diag.window(c.index, c.uuid, job)
            job_w[c.uuid] = c.job.window(c.index, c.uuid, job)
    # jobs: the GPUs where each job holds the most memory
    by_job: dict[tuple[str, str], list[str]] = {}
    for uuid, ref in primary.items():
        by_job.setdefault((ref.kind, ref.job), []).append(uuid)
    mem: dict[tuple[str, str], int] = {}
    pids: dict[tuple[str, str], set[int]] = {}
    for p in processes:
        key = (p.job_kind, p.job)
        mem[key] = mem.get(key, 0) + (p.gpu_memory_bytes or 0)
        pids.setdefault(key, set()).add(p.pid)
    jobs: list[JobInsight] = []
    shortfall: dict[str, float] = {}
    for key in sorted(mem, key=lambda k: (-mem[k], k))[:MAX_JOBS]:
        uuids = sorted(by_job.get(key, []), key=lambda u: index[u])
        act = _activity([job_w[u] for u in uuids if u in job_w])
        falls = shortfalls(act[0]) if act else None
        if falls is not None:
            shortfall.update(zip([u for u in uuids if u in job_w], falls, strict=True))
        jobs.append(
            JobInsight(
                job=key[1],
                job_kind=key[0],
                gpus=[index[u] for u in uuids],
                pids=sorted(pids[key]),
                imbalance_ratio=imbalance(act[0]) if act else None,
                activity_source=act[1] if act else None,
            )
        )
    gpus: list[GpuInsight] = []
    for c in captures:  # in GPU index order
        uuid = c.uuid
        w = node_w[uuid]
        diagnosis = None
        if uuid in diag_w:
            job = primary.get(uuid)
            peers = [
                diag_w[u] for u, ref in primary.items() if u != uuid and job is not None and ref == job and u in diag_w
            ]
            diagnosis = diagnose(diag_w[uuid], peers)
        activity = w.sm if w.sm is not None else w.util
        source = "sm_activity" if w.sm is not None else "utilization_gpu"
        gpus.append(
            GpuInsight(
                gpu=c.index,
                uuid=uuid,
                state_seconds_total=c.totals,
                idle_seconds_total=c.idle,
                window_state_seconds=dict(w.states),
                starved_ratio=starved_ratio(w.states),
                activity_ratio=activity,
                activity_source=None if activity is None else source,
                shortfall_ratio=shortfall.get(uuid),
                diagnosis=diagnosis,
            )
        )
    node_act = _activity([node_w[u] for u in up if u in node_w])
    return InsightResult(
        timestamp=timestamp,
        window_seconds=window_seconds,
        diagnosis_window_seconds=diagnosis_seconds,
        gpus=gpus,
        processes=processes,
        jobs=jobs,
        node_imbalance_ratio=imbalance(node_act[0]) if node_act else None,
        node_activity_source=node_act[1] if node_act and len(node_act[0]) >= 2 else None,
    )
