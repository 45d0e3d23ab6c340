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
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from gpuwarden.catalog import CLOCK_EVENT_REASONS
from gpuwarden.insight.analysis import build_core
from gpuwarden.insight.attribution import JobRef, attribute, pod_of, slurm_job_number
from gpuwarden.insight.evidence import pack_means
from gpuwarden.insight.gpu_window import Health
from gpuwarden.insight.launches import launch_limited
from gpuwarden.insight.margins import VerdictMemory
from gpuwarden.insight.peers import peer_wait_share
from gpuwarden.insight.rules import copies_data
from gpuwarden.insight.startup import StartUp, begins, startup_causes
from gpuwarden.insight.vocabulary import states as st
from gpuwarden.insight.vocabulary.result import DeferredInsight, InsightResult, ProcessJob, StateRun, insight_result
from gpuwarden.insight.vocabulary.thresholds import POWER_REASONS, SEVERE_REASONS
from gpuwarden.insight.windows import GpuCapture, Interval, Packed, Running, finite, mergeable, merged, pack, terms
from gpuwarden.model import GpuReading, GpuStatic, HostReading, NodeStatic, PollResult, ProcessReading

__all__ = ["DeferredInsight", "InsightAnalyzer", "InsightResult", "insight_result"]

#: A process first seen between these ages (seconds since it started) gets its mean CPU since start as the CPU
#: of its first interval; otherwise that interval's CPU is unknown.
FIRST_SIGHT_MIN_AGE = 1.0
FIRST_SIGHT_MAX_AGE = 60.0

_POWER_BITS = sum(b for b, n in CLOCK_EVENT_REASONS.items() if n in POWER_REASONS)
_SEVERE_BITS = sum(b for b, n in CLOCK_EVENT_REASONS.items() if n in SEVERE_REASONS)
_IDLE_CPU_MODES = ("idle", "iowait")


#: Job kinds whose cgroup is the job itself: its CPU is the cgroup's (cgroup v2 cpu.stat, v1 cpuacct). Other
#: cgroups (a systemd unit, a session, a runner's shared cgroup) may hold unrelated processes.
CGROUP_JOBS = frozenset({"kubernetes", "slurm", "container"})


@dataclass(frozen=True, slots=True)
class ProcessSeen:
    """A GPU process's counters at the poll it was last seen (from ProcessReading): start time (Unix s), its CPU
    seconds, the poll's time, its tree's CPU seconds, bytes read from storage, its cgroup's CPU seconds, its tree's
    bytes read through any read call (rchar), bytes written to storage and voluntary context switches (None:
    unknown)."""

    create_time: float | None
    cpu_seconds: float
    timestamp: float
    tree_cpu_seconds: float
    tree_read_bytes: int | None
    cgroup_cpu_seconds: float | None
    tree_read_chars: int | None = None
    tree_write_bytes: int | None = None
    tree_switches: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessRates:
    """A GPU process's rates since the previous poll: CPU cores of the process, of the process with its
    descendants (DataLoader workers, where recorded), bytes per second its tree read from storage, CPU cores of its
    cgroup, bytes per second its tree read other than from storage (rchar beyond read_bytes: sockets, pipes, the
    page cache), wrote to storage, and its voluntary context switches per second (None where unknown)."""

    cpu_cores: float
    tree_cpu_cores: float
    read_bytes_per_second: float | None = None
    cgroup_cpu_cores: float | None = None
    other_read_bytes_per_second: float | None = None
    write_bytes_per_second: float | None = None
    switches_per_second: float | None = None


@dataclass(frozen=True, slots=True)
class JobInputs:
    """What a GPU's processes did over one interval, from their ProcessRates: the jobs' CPU cores (``_job_cpu``),
    the busiest process's cores, bytes per second read from storage, processes in uninterruptible sleep, bytes per
    second read other than from storage (sockets: remote storage), written to storage, voluntary context switches
    per second; whether the job waits on I/O (reads or writes >= IO_READ_BYTES_PER_SECOND, any process in I/O
    wait, or waits at WAITS_PER_SECOND) and whether it writes (IO_WRITE_BYTES_PER_SECOND, more than it reads: a
    checkpoint); how many of its processes are stopped (SIGSTOP, a debugger), and how many listen on a TCP port of
    their own (a server). None: not known."""

    job_cpu: float | None = None
    max_proc_cpu: float | None = None
    io_read: float | None = None
    blocked: float | None = None
    io_waiting: bool = False
    other_read: float | None = None
    io_write: float | None = None
    switches: float | None = None
    writing: bool = False
    stopped: float | None = None  # how many of the GPU's processes are stopped (SIGSTOP, a debugger); None: not read
    listening: float | None = None  # how many listen on a port of their own (ProcessReading.listen_ports)
    requests: float | None = None  # requests running and waiting their servers say they have; None: none says


@dataclass(frozen=True, slots=True)
class Step:
    """One GPU's poll interval as the test of waiting on peers reads it (gpuwarden.insight.peers.Activity): its
    index, util.gpu and SM activity over the interval (ratios; None: unknown), the seconds with a utilization reading,
    and the power above the GPU's idle floor (W; None: no power reading)."""

    index: int
    util: float | None
    sm: float | None
    seconds: float
    watts_above_floor: float | None


@dataclass(slots=True)
class _GpuState:
    index: int
    node: Running
    job: Running
    diag: Running
    last_ts: float | None = None
    last_work: float | None = None
    last_pids: frozenset[int] = frozenset()
    xids: tuple[int, ...] = ()
    gpm_seen: dict[str, float] | None = None  # the GPM values of the last poll
    gpm_changes: int = 0  # new GPM computations since the current job appeared
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(st.STATES, 0.0))
    idle: dict[str, float] = field(default_factory=lambda: dict.fromkeys(st.IDLE_CAUSES, 0.0))
    runs: deque[StateRun] = field(default_factory=deque)  # the node window's intervals, by main state
    idle_floor_watts: float | None = None  # the lowest power seen: the GPU's own idle baseline
    idle_joules: dict[str, float] = field(default_factory=lambda: dict.fromkeys(st.IDLE_CAUSES, 0.0))  # by cause
    step: Step | None = None  # this poll's interval, for the test of waiting on peers (None: not accounted)
    peer_wait_seconds: float = 0.0  # kernel seconds spent waiting in a collective on a peer of the job
    peer_wait_joules: float = 0.0  # the energy above the idle floor of those seconds
    last_iv: Interval | None = None  # the newest interval in the windows (polls faster than a second merge into it)
    last_packed: Packed | None = None  # it as the windows hold it (windows.pack)
    last_terms: list[tuple[int, int]] = field(default_factory=list)  # its terms (windows.terms)
    startup: StartUp | None = None  # the job's start-up while it lasts (gpuwarden.insight.startup)
    idle_since: float | None = None  # the start of the run of idle intervals it is in (st.IDLE_STATES); None: none
    requests_seen: float | None = None  # the last poll its server said it had a request (or first said none)
    serving_idle: bool = False  # its latest interval: a server that said it had no request for serving_idle_seconds


def _holder_rank(p: ProcessReading) -> tuple[bool, bool, int, int]:
    """How strongly process ``p`` stands for its GPU's job, largest first: known to /proc (its start time read),
    running kernels (NVML's per-process SM utilization above 0), GPU memory held, then the lower PID."""
    running = p.sm_utilization_ratio is not None and p.sm_utilization_ratio > 0
    return (p.create_time is not None, running, p.gpu_memory_bytes or 0, -p.pid)


class InsightAnalyzer:
    """Stateful analyzer: ``analyzer(poll, static) -> InsightResult``.

    ``window_seconds`` (default 300) is the window of ``gpu_starved_ratio`` and the imbalance scores;
    ``serving_idle_seconds`` (default 300) how long a server must say it has no request running or waiting
    (ProcessReading.server_requests_*) before its idle time is ``serving_idle``;
    ``diagnosis_seconds`` (default 60, at most the window) that of the verdicts, further limited to the
    time since the GPU's current set of processes appeared (so a verdict describes the job holding it now).
    Not thread-safe: one poll thread calls it; its results are immutable.
    """

    def __init__(
        self, window_seconds: float = 300.0, diagnosis_seconds: float = 60.0, serving_idle_seconds: float = 300.0
    ) -> None:
        if window_seconds <= 0 or diagnosis_seconds <= 0:
            raise ValueError("window_seconds and diagnosis_seconds must be positive")
        self.serving_idle_seconds = float(serving_idle_seconds)
        self.window_seconds = float(window_seconds)
        self.diagnosis_seconds = float(min(diagnosis_seconds, window_seconds))
        self._gpus: dict[str, _GpuState] = {}
        self._proc_cpu: dict[int, ProcessSeen] = {}
        self._host: HostReading | None = None
        self._busy: float | None = None
        self._jobs: dict[tuple[int, float | None, str | None], JobRef] = {}
        self._verdicts = VerdictMemory()

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

    def _process_rates(self, gpus: list[GpuReading]) -> dict[int, ProcessRates]:
        """Per GPU process (by pid) its rates since the previous poll. First sight: see FIRST_SIGHT_MAX_AGE."""
        rates: dict[int, ProcessRates] = {}
        seen: dict[int, ProcessSeen] = {}
        for g in gpus:
            for p in g.processes or ():
                if p.cpu_seconds_total is None or p.pid in seen:
                    continue
                now = seen[p.pid] = ProcessSeen(
                    p.create_time,
                    p.cpu_seconds_total,
                    g.timestamp,
                    p.tree_cpu_seconds_total if p.tree_cpu_seconds_total is not None else p.cpu_seconds_total,
                    p.tree_read_bytes_total,
                    p.cgroup_cpu_seconds_total,
                    p.tree_read_chars_total,
                    p.tree_write_bytes_total,
                    p.tree_voluntary_switches_total,
                )
                rate = _rates(now, self._proc_cpu.get(p.pid))
                if rate is not None:
                    rates[p.pid] = rate
        self._proc_cpu = seen
        return rates

    def _job_cpu(self, procs: Sequence[ProcessReading], rates: dict[int, ProcessRates]) -> float:
        """CPU cores of the GPU's jobs: a job that is its cgroup (Kubernetes pod, Slurm job, container) counts its
        cgroup's CPU once; any other process counts itself and its descendants."""
        groups: dict[str, float] = {}
        total = 0.0
        for p in procs:
            r = rates.get(p.pid)
            if r is None:
                continue
            if r.cgroup_cpu_cores is not None and p.cgroup and self._job(p).kind in CGROUP_JOBS:
                groups[p.cgroup] = r.cgroup_cpu_cores
            else:
                total += r.tree_cpu_cores
        return total + sum(groups.values())

    def _job(self, p: ProcessReading) -> JobRef:
        key = (p.pid, p.create_time, p.cgroup)
        ref = self._jobs.get(key)
        if ref is None:
            ref = self._jobs[key] = attribute(p)
        return ref

    def _process_jobs(
        self, gpus: list[GpuReading], rates: dict[int, ProcessRates]
    ) -> tuple[list[ProcessJob], dict[str, JobRef]]:
        """Each GPU process with its job (gpuwarden.insight.attribution) and pod, and each GPU's job: that of its
        first process by ``_holder_rank`` - one /proc knows before one it does not (NVML goes on listing a process
        that exited while a child it forked keeps the device open: its memory is no working job's), one running
        kernels before one that is not, then the most memory (GPUs up only; a lost GPU's processes are those still
        running that held it when it was lost, so its job keeps holding it). Forgets the jobs of processes gone."""
        live_jobs: dict[tuple[int, float | None, str | None], JobRef] = {}
        processes: list[ProcessJob] = []
        primary: dict[str, JobRef] = {}
        for g in gpus:
            best: tuple[bool, bool, int, int] | None = None
            for p in g.processes or ():
                ref = self._job(p)
                live_jobs[(p.pid, p.create_time, p.cgroup)] = ref
                names = pod_of(ref, p, g.pods)
                processes.append(
                    ProcessJob(
                        gpu=g.index,
                        uuid=g.uuid,
                        pid=p.pid,
                        job=ref.job,
                        job_kind=ref.kind,
                        container_id=ref.container_id,
                        user=p.username or "",
                        command=p.name or "",
                        namespace=names.namespace if names else "",
                        pod=names.pod if names else "",
                        container=names.container if names else "",
                        slurm_job_id=slurm_job_number(ref, p),
                        gpu_memory_bytes=p.gpu_memory_bytes,
                        cpu_cores=rates[p.pid].cpu_cores if p.pid in rates else None,
                        kept_by=p.kept_by,
                        rank=p.rank,
                        local_rank=p.local_rank,
                    )
                )
                rank = _holder_rank(p)
                if g.up and (best is None or rank > best):
                    best, primary[g.uuid] = rank, ref
        self._jobs = live_jobs
        return processes, primary

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
        processes, primary = self._process_jobs(poll.gpus, rates)
        for g in up:
            self._account(g, statics.get(g.index), rates, host_busy, primary.get(g.uuid))
        for g in poll.gpus:
            if not g.up:
                self._account_lost(g)
        self._account_peer_waits(primary)
        up_uuids = {g.uuid for g in up}
        gpus = [
            GpuCapture(
                index=state.index,
                uuid=uuid,
                node=state.node.capture(),
                job=state.job.capture() if uuid in up_uuids else None,
                diag=state.diag.capture() if uuid in up_uuids else None,
                totals=dict(state.totals),
                idle=dict(state.idle),
                runs=tuple(state.runs),
                held_idle_joules=None if state.idle_floor_watts is None else state.idle_joules["held_idle"],
                idle_joules=None if state.idle_floor_watts is None else dict(state.idle_joules),
                peer_wait_seconds=state.peer_wait_seconds,
                peer_wait_joules=None if state.idle_floor_watts is None else state.peer_wait_joules,
                idle_since=state.idle_since,
            )
            for uuid, state in sorted(self._gpus.items(), key=lambda kv: kv[1].index)
        ]
        return DeferredInsight(
            functools.partial(
                build_core,
                poll.timestamp,
                self.window_seconds,
                self.diagnosis_seconds,
                gpus,
                [g.uuid for g in up],
                processes,
                primary,
                {g.uuid: g.error or "unknown" for g in poll.gpus if not g.up},
                self._verdicts,
            )
        )

    def _state(self, g: GpuReading) -> _GpuState:
        """The running state of GPU ``g`` (by UUID), made at its first poll."""
        state = self._gpus.get(g.uuid)
        if state is None:
            state = self._gpus[g.uuid] = _GpuState(
                index=g.index,
                node=Running(self.window_seconds, same_holder=False),
                job=Running(self.window_seconds, same_holder=True),
                diag=Running(self.diagnosis_seconds, same_holder=True),
            )
        state.index = g.index
        return state

    def _account_lost(self, g: GpuReading) -> None:
        """Account poll ``g`` of a GPU that could not be read: the time since its previous poll (up or down, at most
        MAX_INTERVAL_SECONDS) is ``lost``, and this poll becomes the start of its next interval, so the first poll
        after it comes back accounts only its own interval. A GPU down from the daemon's start counts from its
        second poll."""
        state = self._state(g)
        state.step = None  # a GPU down waits on nobody, and nobody waits on it
        start, state.last_ts = state.last_ts, g.timestamp
        state.last_iv = state.last_packed = None  # the windows' newest interval no longer ends where the next starts
        if start is None or not 0 < g.timestamp - start <= st.MAX_INTERVAL_SECONDS:
            return
        secs = {"lost": g.timestamp - start}
        state.totals["lost"] += secs["lost"]
        state.idle["lost"] += secs["lost"]
        _extend_runs(state.runs, secs, start, g.timestamp, self.window_seconds)
        state.idle_since = None  # a GPU that could not be read is not known to be idle

    def _account_peer_waits(self, primary: dict[str, JobRef]) -> None:
        """Add to each GPU accounted this poll the kernel seconds it spent waiting in a collective on another GPU of
        its job (``primary``: each GPU's job) in this poll interval, and their energy above its idle floor
        (gpuwarden.insight.peers.peer_wait_share on the interval's util.gpu and SM activity)."""
        jobs: dict[JobRef, list[tuple[_GpuState, Step]]] = {}
        for uuid, ref in primary.items():
            state = self._gpus.get(uuid)
            if state is not None and state.step is not None:
                jobs.setdefault(ref, []).append((state, state.step))
        for members in jobs.values():
            steps = [step for _, step in members]
            if len(steps) < 2:
                continue
            for state, step in members:
                seconds = peer_wait_share(step, [p for p in steps if p is not step]) * step.seconds
                if seconds > 0:
                    state.peer_wait_seconds += seconds
                    if step.watts_above_floor is not None:
                        state.peer_wait_joules += seconds * step.watts_above_floor

    def _server_idle(self, state: _GpuState, now: float, requests: float | None) -> bool:
        """Whether the GPU's server has said, for serving_idle_seconds, that it has no request running or waiting
        (``requests``: this poll's count, None when no server of the GPU says). A server that stops saying (its
        metrics unreadable) is not idle: unknown means active."""
        if requests is None:
            state.requests_seen = None
            return False
        if requests > 0 or state.requests_seen is None:
            state.requests_seen = now
        return now - state.requests_seen >= self.serving_idle_seconds

    def _job_inputs(self, procs: Sequence[ProcessReading], rates: dict[int, ProcessRates]) -> JobInputs:
        """What the GPU's processes ``procs`` did over the interval (JobInputs), from their ``rates``."""
        known = [rates[p.pid] for p in procs if p.pid in rates]
        io_read = _total(k.read_bytes_per_second for k in known)
        other = _total(k.other_read_bytes_per_second for k in known)
        written = _total(k.write_bytes_per_second for k in known)
        blocked, stopped, listening = _process_counts(procs)
        reads = (io_read or 0.0) + (other or 0.0)
        writing = st.writes_more_than_reads(written, reads)
        switches = _total(k.switches_per_second for k in known)
        waits = [reads >= st.IO_READ_BYTES_PER_SECOND, (blocked or 0.0) > 0, writing]
        return JobInputs(
            stopped=stopped,
            listening=listening,
            requests=_requests_said(procs),
            job_cpu=self._job_cpu(procs, rates) if known else None,
            max_proc_cpu=max(k.cpu_cores for k in known) if known else None,
            io_read=io_read,
            blocked=blocked,
            io_waiting=any(waits) or (switches or 0.0) >= st.WAITS_PER_SECOND,
            other_read=other,
            io_write=written,
            switches=switches,
            writing=writing,
        )

    def _account(
        self,
        g: GpuReading,
        s: GpuStatic | None,
        rates: dict[int, ProcessRates],
        host_busy: float | None,
        job: JobRef | None,
    ) -> None:
        """Account poll ``g`` of one GPU: its states since its previous poll, idle causes, energy held idle, and
        one Interval pushed into the node, job and diagnosis windows."""
        state = self._state(g)
        state.step = None
        procs = g.processes
        pids = frozenset(p.pid for p in procs or ())
        start = _track(state, g, pids)
        if start is None or not 0 < g.timestamp - start <= st.MAX_INTERVAL_SECONDS:
            return
        inputs = self._job_inputs(procs or (), rates)
        holder = st.holder_of(
            procs is not None,
            len(procs or ()),
            g.memory_used_bytes,
            g.memory_reserved_bytes is not None,
            allocated=bool(g.pods or g.allocated_jobs),
        )
        segs = st.segments(start, g.timestamp, g.utilization_samples, g.utilization_gpu_ratio)
        util_seconds = sum(x.seconds for x in segs if x.util is not None)
        serving = (inputs.listening or 0.0) > 0
        state.serving_idle = serving and self._server_idle(state, g.timestamp, inputs.requests)
        secs, state.last_work = st.account(
            segs, holder, inputs.job_cpu, state.last_work, inputs.io_waiting, serving, state.serving_idle
        )
        for k, v in secs.items():
            state.totals[k] += v
        # GPM metrics average over the time since the previous computation (every gpm_interval in serve, carried in
        # between): the first one after a job change covers time before it. Only the second on describes this job.
        gpm = g.gpm if state.gpm_changes >= 2 else {}
        whole_idle = _whole_idle(segs, util_seconds) if g.utilization_samples else None
        util = secs["busy"] / util_seconds if util_seconds > 0 else None
        sm = finite(gpm.get("sm_activity"))
        launching = launch_limited(
            util,
            sm,
            inputs.max_proc_cpu,
            inputs.job_cpu,
            whole_idle,
            inputs.io_waiting,
            copies_data(finite(gpm.get("pcie_rx_bytes_per_second")), finite(gpm.get("pcie_tx_bytes_per_second"))),
        )
        causes = st.idle_causes(
            secs,
            inputs.job_cpu,
            inputs.io_waiting,
            inputs.writing,
            st.gaps_in_periods(segs) if launching else 0.0,
            serving=serving,
        )
        starting = state.startup
        if starting is not None:
            causes = startup_causes(causes)
            starting = _startup_goes_on(state, starting, g, start, secs)
        for k, v in causes.items():
            state.idle[k] += v
        above = _idle_energy(state, g, causes)
        state.step = Step(g.index, util, sm, util_seconds, above)
        clocks = _clocks(g, s)
        iv = Interval(
            end=g.timestamp,
            seconds=g.timestamp - start,
            states=secs,
            util_seconds=util_seconds,
            holder=holder,
            pids=pids,
            means=pack_means(
                sm=finite(gpm.get("sm_activity")),
                tensor=finite(gpm.get("tensor_activity")),
                pcie_rx=finite(gpm.get("pcie_rx_bytes_per_second")),
                pcie_tx=finite(gpm.get("pcie_tx_bytes_per_second")),
                nvlink_rx=finite(gpm.get("nvlink_rx_bytes_per_second")),
                job_cpu_cores=inputs.job_cpu,
                max_process_cpu_cores=inputs.max_proc_cpu,
                dram=finite(gpm.get("dram_activity")),
                fp32=finite(gpm.get("fp32_activity")),
                io_read_bytes_per_second=inputs.io_read,
                io_other_read_bytes_per_second=inputs.other_read,
                io_write_bytes_per_second=inputs.io_write,
                voluntary_switches_per_second=inputs.switches,
                whole_idle_ratio=whole_idle,
                io_blocked_processes=inputs.blocked,
                stopped_processes=inputs.stopped,
                listening_processes=inputs.listening,
                host_cpu_busy_ratio=host_busy,
                power_watts=finite(g.power_usage_watts),
            ),
            power_limit=g.power_limit_watts,
            mem_used=g.memory_used_bytes,
            mem_total=_memory_total(g, s),
            health=_health(g, s, state.xids),
            startup=starting.age(g.timestamp) if starting is not None else None,
            clock_ratio=clocks.ratio,
            throttle=clocks.throttle,
            severe=clocks.severe,
            reasons=clocks.reasons,
        )
        _push(state, iv)
        main = _extend_runs(state.runs, secs, start, g.timestamp, self.window_seconds)
        state.idle_since = _idle_since(state.idle_since, main, start)


def _startup_goes_on(
    state: _GpuState, starting: StartUp, g: GpuReading, start: float, secs: dict[str, float]
) -> StartUp | None:
    """``starting``, or None when the job's start-up phase ends with this interval (gpuwarden.insight.startup);
    then the GPM averages begin again (one still running covers the start-up: the second one is the job's)."""
    kernels = bool(g.utilization_gpu_ratio) or secs["busy"] > 0
    if not starting.ends(start, g.timestamp, secs["busy"], secs["held_idle"], kernels):
        return starting
    state.startup = None
    state.gpm_changes = 0
    return None


def _memory_total(g: GpuReading, s: GpuStatic | None) -> int | None:
    """The GPU's memory in bytes: this poll's reading, else the static facts'."""
    if g.memory_total_bytes:
        return g.memory_total_bytes
    return s.memory_total_bytes if s is not None else None


def _process_counts(procs: Sequence[ProcessReading]) -> tuple[float | None, float | None, float | None]:
    """Of the GPU's processes' trees: how many processes are blocked on I/O (state D), how many GPU processes are
    stopped, how many listen on a port; each None where no process says."""
    blocked = _total(None if p.tree_blocked is None else float(p.tree_blocked) for p in procs)
    stopped = _total(None if p.stopped is None else float(p.stopped) for p in procs)
    listening = _total(None if p.listen_ports is None else float(bool(p.listen_ports)) for p in procs)
    return blocked, stopped, listening


def _requests_said(procs: Sequence[ProcessReading]) -> float | None:
    """Requests running and waiting that the servers among ``procs`` say they hold (server_requests), None when none
    says."""
    said = [(p.server_requests_running or 0.0) + (p.server_requests_waiting or 0.0) for p in procs
            if p.server_requests_running is not None or p.server_requests_waiting is not None]  # fmt: skip
    return sum(said) if said else None


def _push(state: _GpuState, iv: Interval) -> None:
    """Push ``iv`` into the GPU's node, job and diagnosis windows; at polls faster than GRANULARITY it is merged
    into the interval pushed last instead, which it replaces."""
    last, last_packed = state.last_iv, state.last_packed
    if last is not None and last_packed is not None and mergeable(last, iv):
        iv = merged(last, iv)
        packed = pack(iv)
        added = terms(packed)
        for running in (state.node, state.job, state.diag):
            if not running.replace_last(last_packed, packed, state.last_terms, added):
                running.push(packed, added)
    else:
        packed = pack(iv)
        added = terms(packed)
        for running in (state.node, state.job, state.diag):
            running.push(packed, added)
    state.last_iv, state.last_packed, state.last_terms = iv, packed, added


def _rates(now: ProcessSeen, prev: ProcessSeen | None) -> ProcessRates | None:
    """The rates of a process between ``prev`` and ``now``; None where not known. First sight of a young process
    (FIRST_SIGHT_MIN_AGE..MAX_AGE): its mean since it started estimates this interval; an older one's lifetime mean
    says little about now, so it stays unknown until the next poll."""
    if prev is None or prev.create_time != now.create_time:
        age = now.timestamp - now.create_time if now.create_time is not None else 0.0
        if FIRST_SIGHT_MIN_AGE <= age <= FIRST_SIGHT_MAX_AGE:
            return ProcessRates(now.cpu_seconds / age, now.tree_cpu_seconds / age)
        return None
    dt = now.timestamp - prev.timestamp
    dc = now.cpu_seconds - prev.cpu_seconds
    if not (dt > 0 and dc >= 0):
        return None
    read = _rate(now.tree_read_bytes, prev.tree_read_bytes, dt)
    chars = _rate(now.tree_read_chars, prev.tree_read_chars, dt)
    return ProcessRates(
        dc / dt,
        max(now.tree_cpu_seconds - prev.tree_cpu_seconds, dc) / dt,
        read,
        _rate(now.cgroup_cpu_seconds, prev.cgroup_cpu_seconds, dt),
        None if chars is None or read is None else max(0.0, chars - read),
        _rate(now.tree_write_bytes, prev.tree_write_bytes, dt),
        _rate(now.tree_switches, prev.tree_switches, dt),
    )


def _rate(now: float | None, prev: float | None, dt: float) -> float | None:
    """A counter's rate per second over ``dt`` (>0), 0 for a counter that went back (a tree member left)."""
    return None if now is None or prev is None else max(0.0, (now - prev) / dt)


def _total(values: Iterable[float | None]) -> float | None:
    """The sum of the known values; None when none is known."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _whole_idle(segs: Sequence[st.Segment], total: float) -> float:
    """The share of the segments' time with a utilization reading (``total`` seconds) in sample periods with no
    kernel at all (below WORK_SAMPLE_RATIO): idle time in gaps of a whole sample period (about 1/6 s on an H100) or
    longer, as against idle time between kernels within a period (launch gaps are microseconds)."""
    whole = sum(s.seconds for s in segs if s.util is not None and s.util < st.WORK_SAMPLE_RATIO)
    return whole / total if total > 0 else 0.0


def _track(state: _GpuState, g: GpuReading, pids: frozenset[int]) -> float | None:
    """Note the poll in ``state`` (job change, GPM computations, XIDs); return the previous poll's time or None."""
    if pids != state.last_pids and not (pids & state.last_pids):
        state.last_work = None  # another job: the previous one's GPU work says nothing about this one
        state.gpm_changes = 0
        # a job seen to arrive starts up; one already there at the GPU's first poll is past its start-up or unknown
        state.startup = begins(g.processes or (), g.timestamp) if state.last_ts is not None else None
    if g.gpm and g.gpm != state.gpm_seen:
        state.gpm_changes += 1
    state.gpm_seen = g.gpm
    start, state.last_ts, state.last_pids = state.last_ts, g.timestamp, pids
    if g.xid_events:
        state.xids = tuple(sorted(set(state.xids) | {e.xid for e in g.xid_events}))
    return start


def _idle_energy(state: _GpuState, g: GpuReading, causes: dict[str, float]) -> float | None:
    """Add the energy above the GPU's own idle floor (the lowest power seen) spent while idle, by cause
    (``causes``: the interval's idle seconds by cause; the ``held_idle`` cause is the held-idle state's seconds): the
    poll's power times the seconds. Returns the power above the floor (W), None without a power reading."""
    power = finite(g.power_usage_watts)
    if power is None:
        return None
    floor = power if state.idle_floor_watts is None else min(state.idle_floor_watts, power)
    state.idle_floor_watts = floor
    for cause, seconds in causes.items():
        state.idle_joules[cause] = state.idle_joules.get(cause, 0.0) + seconds * (power - floor)
    return power - floor


class Clocks(NamedTuple):
    """An interval's clocks: SM clock / its max (None: unknown), held down by a power or severe reason, by a severe
    one (gpuwarden.catalog.CLOCK_EVENT_GROUPS), and the active reasons but gpu_idle."""

    ratio: float | None
    throttle: bool
    severe: bool
    reasons: frozenset[str]


def _clocks(g: GpuReading, s: GpuStatic | None) -> Clocks:
    """The clocks of poll ``g`` (nvmlDeviceGetClockInfo, nvmlDeviceGetCurrentClocksEventReasons) against the max."""
    bits = g.clock_event_reasons or 0
    clock_max = s.clock_max_hertz.get("sm") if s is not None else None
    clock = g.clock_hertz.get("sm")
    return Clocks(
        finite(clock / clock_max) if clock is not None and clock_max else None,
        bool(bits & (_POWER_BITS | _SEVERE_BITS)),
        bool(bits & _SEVERE_BITS),
        frozenset(n for b, n in CLOCK_EVENT_REASONS.items() if bits & b and n != "gpu_idle"),
    )


def _health(g: GpuReading, s: GpuStatic | None, xids: tuple[int, ...]) -> Health:
    """The card's health at this poll: temperatures against its own thresholds, memory errors, XIDs."""
    thresholds = s.temperature_thresholds_celsius if s is not None else {}
    return Health(
        temperature_celsius=g.temperature_gpu_celsius,
        slowdown_celsius=thresholds.get("slowdown"),
        memory_temperature_celsius=g.temperature_memory_celsius,
        memory_max_celsius=thresholds.get("memory_max"),
        uncorrected_ecc=g.ecc_errors_total.get("uncorrected_volatile"),
        remap_pending=bool(g.remapped_rows.get("pending")),
        remap_failed=bool(g.remapped_rows.get("failure")),
        xids=xids,
    )


def _idle_since(since: float | None, main: str, start: float) -> float | None:
    """The start of the run of idle intervals a GPU is in after an interval from ``start`` (Unix s) whose main state
    is ``main``: ``since`` while the run goes on, ``start`` where one begins, None after an interval in any other
    state (in use, or not known: unknown, lost)."""
    if main not in st.IDLE_STATES:
        return None
    return start if since is None else since


def _extend_runs(runs: deque[StateRun], secs: dict[str, float], start: float, end: float, window: float) -> str:
    """Add the interval ``start``..``end`` (Unix s) under its main state (the one with most of ``secs``) to
    ``runs``, merging it into the last run when that has the same state and ends where it starts; drop the runs
    that ended more than ``window`` seconds before ``end``. Returns the main state."""
    main = max(secs, key=secs.__getitem__)
    last = runs[-1] if runs else None
    if last is not None and last.state == main and abs(last.end - start) < 1e-6:
        runs[-1] = StateRun(state=main, start=last.start, end=end)
    else:
        runs.append(StateRun(state=main, start=start, end=end))
    while runs and runs[0].end <= end - window:
        runs.popleft()
    return main
