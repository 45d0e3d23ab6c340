"""The verdicts, each declared once as a row of ``RULES``: what it requires of a GPU's window (``*_when``), the
sentence that says why (``*_summary``), both reading ``Facts``, the rule in words for docs/scores.md, its severity
and remedies; the rows' order is the order the rules are tried. The thresholds are in
gpuwarden.insight.vocabulary.thresholds; gpuwarden.insight.reasons adds the findings and picks the verdict.

Predicates and summaries are module-private: ``RULES`` is their one entry point.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

from gpuwarden.insight.gpu_window import GpuWindow, named, pct
from gpuwarden.insight.launches import (
    LAUNCH_CPU_CORES,
    LAUNCH_GAPS_MIN,
    LAUNCH_HELPERS_MAX,
    LAUNCH_MID_SM_PER_UTIL,
    LAUNCH_SM_PER_UTIL,
    LAUNCH_UTIL_MIN,
    launch_limited,
)
from gpuwarden.insight.peers import straggler, utilized, waits_on
from gpuwarden.insight.startup import STARTUP_KERNEL_SECONDS, STARTUP_MAX_SECONDS, STARTUP_RECUR_SECONDS
from gpuwarden.insight.vocabulary.states import (
    IO_READ_BYTES_PER_SECOND,
    IO_WRITE_BYTES_PER_SECOND,
    JOB_CPU_BUSY_CORES,
    WAITS_PER_SECOND,
    WORK_SAMPLE_RATIO,
    writes_more_than_reads,
)
from gpuwarden.insight.vocabulary.thresholds import (
    BUSY_UTIL,
    D2H_AMBIGUOUS_BYTES_PER_SECOND,
    D2H_TX_BYTES_PER_SECOND,
    D2H_TX_PER_OFF_BYTES_PER_SECOND,
    D2H_TX_PER_RX,
    H2D_IDLE_RX_BYTES_PER_SECOND,
    H2D_RX_BYTES_PER_SECOND,
    H2D_SM_MAX,
    HELD_IDLE_MIN,
    HOST_TX_MIN_BYTES_PER_SECOND,
    HOST_TX_PER_RX,
    MEMORY_BOUND_DRAM,
    PAUSED_MIN,
    PEER_LAG,
    SPIN_SM_PER_UTIL,
    STARVED_MIN,
    THROTTLE_CLOCK_RATIO,
    THROTTLE_MIN_FRACTION,
)

_T = TypeVar("_T")


class _once(Generic[_T]):  # noqa: N801 - named as the decorator it is
    """A property computed on its first read and kept in the instance's ``__dict__`` (which later reads find first):
    functools.cached_property without the lock it takes on every first read before Python 3.12: each Facts value is
    read for the first time once per Facts, and the margins judge each window up to 39 times (the window and its
    moves)."""

    def __init__(self, func: Callable[[Any], _T]) -> None:
        self.func, self.name, self.__doc__ = func, func.__name__, func.__doc__

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> _once[_T]: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> _T | _once[_T]:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.func(obj)
        return value


def throttled(w: GpuWindow) -> bool:
    """Whether slowing clock-event reasons held >= THROTTLE_MIN_FRACTION of the time with the SM clock below
    THROTTLE_CLOCK_RATIO of its max."""
    return (
        w.throttle_fraction >= THROTTLE_MIN_FRACTION
        and w.sm_clock_ratio is not None
        and w.sm_clock_ratio < THROTTLE_CLOCK_RATIO
    )


class Facts:
    """What the verdict rules read about one GPU's window ``w`` given its job's other GPUs ``peers``: the window and
    the values several rules share, each computed once when first read (module constants are the thresholds)."""

    def __init__(self, w: GpuWindow, peers: Sequence[GpuWindow]) -> None:
        self.w, self.peers = w, peers

    @_once
    def cpu(self) -> str:
        """The job's CPU in words: ``n/a`` or ``1.23 cores``."""
        return "n/a" if self.w.job_cpu_cores is None else f"{self.w.job_cpu_cores:.2f} cores"

    @_once
    def writing(self) -> bool:
        """The job writes storage at >= IO_WRITE_BYTES_PER_SECOND, more than it reads (storage and sockets)."""
        w = self.w
        read = (w.io_read_bytes_per_second or 0.0) + (w.io_other_read_bytes_per_second or 0.0)
        return writes_more_than_reads(w.io_write_bytes_per_second, read)

    @_once
    def remote(self) -> bool:
        """The job reads >= IO_READ_BYTES_PER_SECOND other than from storage (rchar beyond read_bytes: sockets)."""
        return (self.w.io_other_read_bytes_per_second or 0.0) >= IO_READ_BYTES_PER_SECOND

    @_once
    def reading(self) -> bool:
        """The job reads storage or sockets (>= IO_READ_BYTES_PER_SECOND) or has processes in I/O wait while it does
        not write a checkpoint (an fsync waits in state D too)."""
        w = self.w
        if (w.io_read_bytes_per_second or 0.0) >= IO_READ_BYTES_PER_SECOND or self.remote:
            return True
        return (w.io_blocked_processes or 0) > 0 and not self.writing

    @_once
    def both_idle(self) -> bool:
        """Kernels ran below WORK_SAMPLE_RATIO of the time (util.gpu, and GPM SM activity where read: work util.gpu's
        samples missed still shows there) and the job's CPU is below JOB_CPU_BUSY_CORES, no reads and no frequent
        waits."""
        w = self.w
        if w.util is None or w.job_cpu_cores is None or self.sm_only:
            return False
        quiet = w.job_cpu_cores < JOB_CPU_BUSY_CORES and not self.reading and not self.waits
        return w.util < WORK_SAMPLE_RATIO and quiet

    @_once
    def sm_only(self) -> bool:
        """GPM SM activity shows work (>= WORK_SAMPLE_RATIO) where util.gpu read none: kernels ran that util.gpu's
        samples did not see (GPM's SM utilization integrates hardware counters over its whole interval)."""
        w = self.w
        return w.util is not None and w.util < WORK_SAMPLE_RATIO and (w.sm or 0.0) >= WORK_SAMPLE_RATIO

    @_once
    def idle(self) -> float:
        """The window's paused + starved share."""
        return self.w.share("paused") + self.w.share("starved")

    @_once
    def quiet(self) -> bool:
        """The job's CPU beyond what its GPU-busy time explains (a core per busy second at most) is below
        JOB_CPU_BUSY_CORES per idle second, it reads and writes nothing and does not wait often (``waits``): the job
        does not work while its GPU idles. Per
        poll, util.gpu is a short sample and misplaces the edges of pauses; the window's means do not."""
        w = self.w
        if self.reading or self.writing or self.waits or w.job_cpu_cores is None:
            return False
        return w.job_cpu_cores - w.share("busy") < JOB_CPU_BUSY_CORES * self.idle

    @_once
    def waits(self) -> bool:
        """The job's main threads wait at >= WAITS_PER_SECOND voluntary context switches per idle second."""
        switches = self.w.voluntary_switches_per_second
        return switches is not None and self.idle > 0 and switches >= WAITS_PER_SECOND * self.idle

    @_once
    def lag(self) -> tuple[GpuWindow, str] | None:
        """The peer this GPU waits on in a collective and how it lags (``_straggler``), or None."""
        return straggler(self.w, self.peers) if waits_on(self.w, self.peers) is not None else None


def _free_when(f: Facts) -> bool:
    return not f.w.held


def _free_summary(f: Facts) -> str:
    return "No process holds this GPU."


def _allocated_idle_when(f: Facts) -> bool:
    return f.w.share("allocated_idle") >= HELD_IDLE_MIN


def _allocated_idle_summary(f: Facts) -> str:
    return (
        "A scheduler allocated this GPU to a job and no process has opened it: allocated idle "
        f"{pct(f.w.share('allocated_idle'))} of the window (the job is on gpu_job_info)."
    )


def _starting_when(f: Facts) -> bool:
    return f.w.starting_seconds is not None


def _starting_summary(f: Facts) -> str:
    w = f.w
    return (
        f"Starting: the job started {w.starting_seconds or 0.0:.0f} s ago and has not run sustained kernels yet "
        f"(kernels {pct(w.util)} of the time, job CPU {f.cpu}): imports, CUDA context, model build or compilation. "
        "The steady-state verdict follows its first steps."
    )


def _idle_share(w: GpuWindow) -> float:
    """The share of the window the GPU idled while its job ran (starved and paused)."""
    return w.share("starved") + w.share("paused")


def _copies_beside_compute(w: GpuWindow) -> bool:
    """Copies fill the GPU's idle time whatever it computes between them: idle STARVED_MIN of the window or more,
    and PCIe RX per idle second at H2D_IDLE_RX_BYTES_PER_SECOND or more."""
    idle = _idle_share(w)
    return idle >= STARVED_MIN and (w.pcie_rx or 0.0) >= H2D_IDLE_RX_BYTES_PER_SECOND * idle


def _h2d_copy_bound_when(f: Facts) -> bool:
    w = f.w
    if w.pcie_rx is None or w.sm is None or w.pcie_rx < H2D_RX_BYTES_PER_SECOND:
        return False
    if w.sm >= H2D_SM_MAX and not _copies_beside_compute(w):
        return False
    # copies into the GPU, not a round trip around work on the host (host_compute_bound: TX at least RX)
    return w.pcie_tx is None or w.pcie_tx < HOST_TX_PER_RX * w.pcie_rx or not _input_starved_when(f)


def _h2d_copy_bound_summary(f: Facts) -> str:
    w = f.w
    rx = (w.pcie_rx or 0.0) / 1e9
    if (w.sm or 0.0) < H2D_SM_MAX:
        return (
            f"PCIe receive {rx:.1f} GB/s while SMs are {pct(w.sm)} active: the job waits on host-to-device copies "
            f"(job CPU {f.cpu})."
        )
    idle = _idle_share(w)
    return (
        f"GPU idle {pct(idle)} of the time between its kernels (SMs {pct(w.sm)} active) while the job receives "
        f"{rx:.1f} GB/s over PCIe, {rx / idle:.1f} GB/s through each idle second: host-to-device copies fill the "
        f"idle time, not input preparation (job CPU {f.cpu})."
    )


def _d2h_copy_bound_when(f: Facts) -> bool:
    w = f.w
    if w.pcie_tx is None or w.sm is None or w.pcie_tx < D2H_TX_BYTES_PER_SECOND or f.writing:
        return False  # a checkpoint copies out to write it: checkpoint_bound
    if w.pcie_tx < D2H_TX_PER_RX * (w.pcie_rx or 0.0):
        return False  # a round trip (an optimizer stepped on the CPU): host_compute_bound
    off = 1.0 - w.sm
    return off >= STARVED_MIN and w.pcie_tx >= D2H_TX_PER_OFF_BYTES_PER_SECOND * off


def _d2h_copy_bound_summary(f: Facts) -> str:
    w = f.w
    tx, off = (w.pcie_tx or 0.0) / 1e9, 1.0 - (w.sm or 0.0)
    counted = (
        f"; util.gpu reads {pct(w.util)} because NVML counts the copy engine's time as busy"
        if (w.util or 0.0) - (w.sm or 0.0) >= STARVED_MIN
        else ""
    )
    return (
        f"PCIe transmit {tx:.1f} GB/s out of the GPU against {(w.pcie_rx or 0.0) / 1e9:.2f} GB/s in, while SMs are "
        f"active only {pct(w.sm)} of the time: the job waits on device-to-host copies of its results, "
        f"{tx / off:.1f} GB/s through each second the SMs idle{counted} (job CPU {f.cpu})."
    )


#: A held-idle GPU's processes stopped at least this many on average over the window (/proc state T or t): its
#: summary says the job is stopped rather than that nobody uses the GPU.
STOPPED_MIN = 0.5
#: ... at least this many: any other summary names the share of the window the job was stopped (a job suspended in
#: cycles pauses, and its GPU idles, because it is stopped: Ctrl-Z, a debugger, a scheduler's suspend).
STOPPED_NOTE_MIN = 0.1


def _stopped_note(w: GpuWindow) -> str:
    """' The job's process was stopped ... N% of the window.' where its processes were stopped STOPPED_NOTE_MIN or
    more on average over the window (ProcessReading.stopped); '' otherwise."""
    stopped = w.stopped_processes or 0.0
    if stopped < STOPPED_NOTE_MIN:
        return ""
    return (
        f" The job's process was stopped (SIGSTOP: Ctrl-Z, a debugger, a scheduler's suspend) {pct(min(stopped, 1.0))} "
        "of the window: that is where its GPU idled; continue it (SIGCONT, fg) or end it."
    )


#: A server: a server of the job listened (ProcessReading.listen_ports, gpuwarden.procinfo.server_ports) this many on
#: average over the window, while the GPU worked at most SERVING_BUSY_MAX of it.
LISTENING_MIN = 0.5
#: ... the share of the window a kernel ran, at most: above it the server is busy, and what limits its kernels
#: (compute, memory, launches) is the verdict.
SERVING_BUSY_MAX = 0.5


def _serving_when(f: Facts) -> bool:
    w = f.w
    if (w.listening_processes or 0.0) < LISTENING_MIN or (w.stopped_processes or 0.0) >= STOPPED_MIN:
        return False
    return w.seconds > 0 and w.share("busy") <= SERVING_BUSY_MAX


def _serving_idle_when(f: Facts) -> bool:
    # a server's idle time is held idle only once it says it has had no request (gpuwarden.insight.vocabulary.states)
    w = f.w
    if (w.listening_processes or 0.0) < LISTENING_MIN or (w.stopped_processes or 0.0) >= STOPPED_MIN:
        return False
    return w.share("serving_idle") >= HELD_IDLE_MIN


def _serving_idle_summary(f: Facts) -> str:
    w = f.w
    mem = "" if w.memory_used_bytes is None else f", {w.memory_used_bytes / 1e9:.1f} GB of GPU memory held"
    return (
        "An idle server: its own metrics say no request has been running or waiting for a while "
        f"(insight.serving_idle_seconds){mem}, kernels {pct(w.share('busy'))} of the window (serving idle "
        f"{pct(w.share('serving_idle'))}). It is live and answers, but nobody asks: capacity to scale down or share."
    )


def _serving_summary(f: Facts) -> str:
    w = f.w
    mem = "" if w.memory_used_bytes is None else f", {w.memory_used_bytes / 1e9:.1f} GB of its memory held"
    return (
        f"A server waiting for requests: a process of the job listens for clients and the GPU ran kernels "
        f"{pct(w.share('busy'))} of the time{mem} (job CPU {f.cpu}). Its idle time is waiting for clients, not a "
        "training job's input or pauses: size it to its load."
    )


def _held_idle_when(f: Facts) -> bool:
    # a job stopped most of the window holds its GPU for nothing, whatever it did while it ran
    return f.w.share("held_idle") >= HELD_IDLE_MIN or f.both_idle or (f.w.stopped_processes or 0.0) >= STOPPED_MIN


def _held_idle_summary(f: Facts) -> str:
    w = f.w
    mem = "" if w.memory_used_bytes is None else f"{w.memory_used_bytes / 1e9:.1f} GB held; "
    if (w.stopped_processes or 0.0) >= STOPPED_MIN:
        return (
            f"{mem}the job's process was stopped (SIGSTOP: Ctrl-Z, a debugger, a scheduler's suspend) "
            f"{pct(min(w.stopped_processes or 0.0, 1.0))} of the window and holds the GPU while it is, until it is "
            f"continued (SIGCONT, fg) or ended (held idle {pct(w.share('held_idle'))}, busy {pct(w.share('busy'))})."
        )
    if f.sm_only:
        return (
            f"{mem}util.gpu read {pct(w.util)} but GPM SM activity {pct(w.sm)}: kernels ran that util.gpu's samples "
            f"missed, so the GPU is in use, though rarely; the job's processes use {f.cpu} of CPU (held idle "
            f"{pct(w.share('held_idle'))} of the window by util.gpu)."
        )
    return (
        f"{mem}kernels ran {pct(w.util)} of the time and the job's processes use {f.cpu} of CPU: "
        f"nobody is using this GPU (held idle {pct(w.share('held_idle'))} of the window)."
    )


def _throttled_when(f: Facts) -> bool:
    return utilized(f.w) and throttled(f.w) and f.w.severe_throttle_fraction >= THROTTLE_MIN_FRACTION


def _throttled_summary(f: Facts) -> str:
    w = f.w
    return (
        f"SM clock at {pct(w.sm_clock_ratio)} of max for {pct(w.severe_throttle_fraction)} of the time: "
        f"{', '.join(w.throttle_reasons)}."
    )


def _waiting_on_peers_when(f: Facts) -> bool:
    return f.lag is not None


def _waiting_on_peers_summary(f: Facts) -> str:
    assert f.lag is not None  # the rule held
    peer, side = f.lag
    return (
        f"util.gpu {pct(f.w.util)} but SMs only {pct(f.w.sm)} active: spinning in a collective while "
        f"{named(peer)} of the same job (the {side} straggler) runs kernels {pct(peer.util)} of the "
        f"time with SMs {pct(peer.sm)} active."
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
        f"Kernels run {pct(w.util)} of the time but fill few SMs ({pct(w.sm)} active) while one process "
        f"keeps {w.max_process_cpu_cores or 0.0:.2f} cores busy: small kernels launched one at a time; the host "
        "thread launching them is the limit."
    )
    if ratio >= LAUNCH_SM_PER_UTIL:
        text = (
            f"Kernels run {pct(w.util)} of the time and cover about {ratio:.0%} of the SMs while they run; the GPU "
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
        f"GPU idle {pct(w.share('paused'))} of the time right after GPU work while the job's CPU idles too: "
        f"the job itself pauses (busy {pct(w.share('busy'))}, job CPU {f.cpu})"
    )
    if f.waits:
        read = ((w.io_read_bytes_per_second or 0.0) + (w.io_other_read_bytes_per_second or 0.0)) / 1e6
        return (
            text
            + (
                f", or it waits on something outside the node: its processes wait "
                f"{w.voluntary_switches_per_second or 0.0:.0f} times a second (many short waits, as a loader fetching "
                f"from remote storage or a client of a service makes; one pause is one wait) and read {read:.1f} MB/s. "
                "gpuwarden cannot tell these apart: check the job's input source and its latency."
            )
            + _stopped_note(w)
        )
    return text + "." + _stopped_note(w)


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
    tx, rx = w.pcie_tx or 0.0, w.pcie_rx or 0.0
    text = (
        f"GPU idle {pct(f.idle)} of the time while its job works on the CPU (job CPU {f.cpu}), sending the host "
        f"{tx / 1e9:.2f} GB/s against {rx / 1e9:.2f} GB/s received: the host works on "
        "the GPU's output (an optimizer or metrics on the CPU), not on its input"
    )
    if tx >= D2H_TX_PER_RX * rx and f.idle > 0 and tx / f.idle >= D2H_AMBIGUOUS_BYTES_PER_SECOND:
        return text + (
            f", or it copies that output: {tx / f.idle / 1e9:.1f} GB/s out through each idle second is a "
            "device-to-host copy staged by a CPU core into pageable memory as well as work on a large output; "
            "gpuwarden cannot tell them apart (a profile of the host thread can: cudaMemcpy or the job's own code)."
        )
    return text + "."


def _checkpoint_bound_when(f: Facts) -> bool:
    return f.writing and f.idle >= STARVED_MIN


def _checkpoint_bound_summary(f: Facts) -> str:
    w = f.w
    return (
        f"GPU idle {pct(f.idle)} of the time while its job writes {(w.io_write_bytes_per_second or 0.0) / 1e6:.0f} "
        f"MB/s to storage and reads {(w.io_read_bytes_per_second or 0.0) / 1e6:.0f} MB/s (device-to-host "
        f"{(w.pcie_tx or 0.0) / 1e9:.2f} GB/s): the job stops the GPU to write checkpoints."
    )


def _input_starved_when(f: Facts) -> bool:
    working = f.w.job_cpu_cores is not None and not f.quiet  # the job works while its GPU idles (window means)
    return f.w.share("starved") >= STARVED_MIN or (working and f.idle >= STARVED_MIN)


def input_source(f: Facts) -> str:
    """Where a starved job's input comes from, by its evidence, in the order ``_input_starved_summary`` names it:
    ``remote`` (reads through sockets), ``storage`` (local reads or I/O wait), ``helpers`` (the job's CPU in other
    processes than its GPU process: loader workers), ``process`` (the training process itself, one core), ``waits``
    (many short waits: remote storage with its reads in no counter, or a slow pipeline), else ``""``."""
    w = f.w
    if f.remote:
        return "remote"
    if f.reading:
        return "storage"
    job, proc = w.job_cpu_cores, w.max_process_cpu_cores
    if job is not None and proc is not None and job >= 1.5 * max(proc, 0.1) and not (f.waits and job < 1.0):
        return "helpers"
    if proc is not None and proc >= 0.8:
        return "process"
    return "waits" if f.waits else ""


def _input_starved_summary(f: Facts) -> str:
    w = f.w
    text = f"GPU idle {pct(f.idle)} of the time while its job works (job CPU {f.cpu}): waiting for input"
    source = input_source(f)
    if source == "remote":
        rate = (w.io_other_read_bytes_per_second or 0.0) / 1e6
        local = (w.io_read_bytes_per_second or 0.0) / 1e6
        return text + (
            f" from remote storage or another process (the job reads {rate:.0f} MB/s through sockets or pipes, "
            f"{local:.0f} MB/s from local storage): prefetch more, read in larger requests, cache the data locally."
        )
    if source == "storage":
        rate = (w.io_read_bytes_per_second or 0.0) / 1e6
        return text + f" from storage (the job reads {rate:.0f} MB/s with processes in I/O wait)."
    job, proc = w.job_cpu_cores or 0.0, w.max_process_cpu_cores or 0.0
    if source == "helpers":
        return text + (
            f" prepared on the CPU by helper processes (the job uses {job:.1f} cores, its GPU process "
            f"{proc:.2f}): more workers or cheaper preprocessing."
        )
    if source == "process":
        return text + (
            f" prepared in the training process itself ({proc:.2f} cores, single-threaded), or work in it on the GPU's "
            "output between steps (evaluation metrics, logging): gpuwarden's counters cannot tell these apart; code "
            "evidence (insight.code_evidence) names the function."
        )
    if source == "waits":
        return text + (
            f" fetched in many short waits ({w.voluntary_switches_per_second or 0.0:.0f} a second, job CPU {f.cpu}, "
            "reads through sockets are in no per-process counter): input from remote storage (object store, network "
            "file system) or a slow pipeline between processes; for a model server, requests that come too rarely."
        )
    return text + "."


def _memory_bound_when(f: Facts) -> bool:
    return utilized(f.w) and f.w.dram is not None and f.w.dram >= MEMORY_BOUND_DRAM


def _memory_bound_summary(f: Facts) -> str:
    w = f.w
    return (
        f"Busy {pct(w.util)} with DRAM bandwidth {pct(w.dram)} of peak and tensor cores {pct(w.tensor)}: "
        "the kernels wait on HBM, not on arithmetic."
    )


def _compute_bound_when(f: Facts) -> bool:
    return utilized(f.w)


def _compute_bound_summary(f: Facts) -> str:
    w = f.w
    return f"Busy: a kernel runs {pct(w.util)} of the time, SMs {pct(w.sm)} active, tensor cores {pct(w.tensor)}."


def _underutilized_summary(f: Facts) -> str:
    w = f.w
    if w.job_cpu_cores is None:
        return (
            f"Busy {pct(w.share('busy'))}, starved {pct(w.share('starved'))}, unknown {pct(w.share('unknown'))}: "
            "the GPU's processes or their CPU are not visible to gpuwarden (another PID namespace?), so the cause "
            "cannot be told."
        )
    return (
        f"Busy {pct(w.share('busy'))}, starved {pct(w.share('starved'))}, paused {pct(w.share('paused'))}, "
        f"held idle {pct(w.share('held_idle'))}, unknown {pct(w.share('unknown'))}: no single cause dominates."
    ) + _stopped_note(w)


Predicate = Callable[[Facts], bool]
Summary = Callable[[Facts], str]


@dataclass(frozen=True)
class Rule:
    """One verdict, declared once: ``when`` it holds (None: always - the last resort), its one-line ``summary`` (both
    of the window's Facts), for the rule table of docs/scores.md the rule in words (``text``) and what grounds its
    numbers (``grounds``: a definition, a paper, or a calibration on named recordings), and as a reason of the
    diagnosis its ``severity`` (ok, info, warning, critical) and ``remedies`` (what to do, most useful first)."""

    when: Predicate | None
    summary: Summary
    text: str
    grounds: str = ""
    severity: str = field(kw_only=True)
    remedies: tuple[str, ...] = field(kw_only=True)


_GIB = H2D_RX_BYTES_PER_SECOND / 2**30

#: Every verdict, by name, in the order the rules are tried (gpuwarden.insight.reasons.VERDICT_ORDER): the first that
#: holds for a window is its verdict. Cheap and decisive tests first (no process, a job starting, copies, a server
#: waiting, nobody working), then what limits a working GPU from outside (clocks, peers, the host, storage, launches,
#: pauses, input), then what limits it inside (HBM, arithmetic); the last always holds. A new verdict is one row here.
RULES: dict[str, Rule] = {
    "free": Rule(
        _free_when,
        _free_summary,
        "no process holds the GPU",
        severity="ok",
        remedies=("No process holds this GPU: it is available.",),
    ),
    "allocated_idle": Rule(
        _allocated_idle_when,
        _allocated_idle_summary,
        f"allocated_idle >= **{HELD_IDLE_MIN:.0%}** of the window: no process holds the GPU, and a scheduler "
        "allocated it to a job (kubelet pod-resources, a DRA claim, a Slurm job mapping file)",
        "the allocation is the scheduler's own record; NVML lists no process on the GPU",
        severity="warning",
        remedies=(
            "A scheduler gave this GPU to a job that never opened it: ask for the GPUs the job uses (Slurm "
            "--gres=gpu:N / --gpus, Kubernetes nvidia.com/gpu limits); a job that uses one of four GPUs keeps three "
            "from everyone.",
            "Check how the job picks its devices: a launcher that starts fewer ranks than GPUs (torchrun "
            "--nproc-per-node), a hard-coded cuda:0, CUDA_VISIBLE_DEVICES narrowed in the script.",
            "Schedulers: reclaim GPUs allocated and untouched (gpuwarden reclaim, allocated_idle on its ladder).",
        ),
    ),
    "starting": Rule(
        _starting_when,
        _starting_summary,
        "a job seen to arrive (absent at the GPU's previous poll) is in its start-up: from its first process's start "
        "until it has run "
        f"**{STARTUP_KERNEL_SECONDS:g} s** of kernels or kernels recur **{STARTUP_RECUR_SECONDS:g} s** apart, its "
        f"GPU is held idle, or **{STARTUP_MAX_SECONDS:g} s** have passed",
        "a start-up (imports, CUDA context, model build) idles the GPU while one core works, as input starvation "
        "does; its own kernels (weight initialisation) come in one burst of milliseconds, a loop's recur every step "
        "(section Start-up below)",
        severity="ok",
        remedies=(
            "Nothing to do while a job starts. A start-up that takes minutes costs GPU time at every start and "
            "restart: cache the model and dataset on local storage, keep compile caches (TORCHINDUCTOR_CACHE_DIR, "
            "torch.compile's mega-cache), and import and build before the GPU is allocated where the scheduler "
            "allows.",
        ),
    ),
    "h2d_copy_bound": Rule(
        _h2d_copy_bound_when,
        _h2d_copy_bound_summary,
        f"GPM PCIe RX >= **{_GIB:g} GiB/s** and either SM activity < **{H2D_SM_MAX:.2f}**, or, whatever the SMs do "
        f"between copies, the GPU idle (starved + paused) >= **{STARVED_MIN:.0%}** of the window with RX >= "
        f"**{H2D_IDLE_RX_BYTES_PER_SECOND / 2**30:g} GiB/s** per idle second (RX / the idle share: copies beside "
        "compute); unless as much goes out (TX >= RX) while the job works on the CPU: a round trip around host work, "
        "`host_compute_bound` (the CPU-stepped optimizer recordings: 2.6 GB/s in, 2.8 out)",
        "*calibration*: h2d_pageable_copy 7.7–9.6 GB/s with SM 0.000; starved_cpu_heavy 0.04–0.15 GB/s; "
        "compute_bound 0.017 GB/s; copies beside compute (copy_compute: pageable 7.0–8.0, pinned 45 GB/s an idle "
        "second) against input prepared by the job or its loaders (0.03–0.47) [H100]",
        severity="warning",
        remedies=(
            "Copy from pinned memory: pin_memory=True in the DataLoader, or tensor.pin_memory() once; then "
            ".to(device, non_blocking=True) to overlap copies with compute.",
            "Keep data on the GPU across steps; send compact dtypes (uint8 images, not float32) and convert there.",
        ),
    ),
    "d2h_copy_bound": Rule(
        _d2h_copy_bound_when,
        _d2h_copy_bound_summary,
        f"GPM PCIe TX >= **{D2H_TX_BYTES_PER_SECOND / 2**30:g} GiB/s** and >= **{D2H_TX_PER_RX:g}x** RX (out, not a "
        f"round trip), SMs not active >= **{STARVED_MIN:.0%}** of the window with TX >= "
        f"**{D2H_TX_PER_OFF_BYTES_PER_SECOND / 2**30:g} GiB/s** per second not active (TX / (1 - SM activity)); not "
        "while the job writes a checkpoint",
        "*calibration*: device-to-host copies of 1 GiB after 80 ms steps: pageable 7.5 GB/s out, 13.9 a second not "
        "active (util.gpu 0.86 with SMs 0.46: NVML counts the copy as busy), pinned 11.6 and 46 [H200]; results "
        "copied for host metrics 0.11-0.19, checkpoints 0.39-0.46, a CPU-stepped optimizer 2.5 out and 2.3 in [H100]; "
        "below 4 GiB/s a copy staged by a CPU core into fresh pageable memory and host work on a large output look "
        "alike (a core busy, bytes out, the GPU idle): `host_compute_bound`, whose summary says it cannot tell them "
        "apart",
        severity="warning",
        remedies=(
            "Keep results on the GPU: compute metrics and reductions there (torch ops, torchmetrics on CUDA tensors) "
            "and copy out one summary per step, not whole outputs; avoid .cpu()/.item()/.numpy() inside the loop.",
            "Copy into a preallocated pinned buffer with .to('cpu', non_blocking=True) on a side stream, and wait on "
            "its event only when the host needs the values (the next step overlaps the copy).",
            "Copy less: reduce before copying (argmax, top-k, a histogram), compact dtypes (bf16/uint8, not fp32).",
        ),
    ),
    "serving_idle": Rule(
        _serving_idle_when,
        _serving_idle_summary,
        f"a server of the job listens >= **{LISTENING_MIN:g}** of the window (as `serving`) and its own /metrics "
        "(vLLM, SGLang, TGI, Triton) said no request running or waiting for `insight.serving_idle_seconds` (300 s): "
        f"state `serving_idle` >= **{HELD_IDLE_MIN:.0%}** of the window",
        "the engines' own gauges of requests running and waiting (vllm:num_requests_running/waiting, "
        "sglang:num_running_reqs/num_queue_reqs, tgi_batch_current_size/tgi_queue_size, Triton's pending count and "
        "requests done); a server whose metrics cannot be read is never idle by them",
        severity="warning",
        remedies=(
            "Scale the server to zero while nobody asks (KServe/Knative min replicas 0, Ray Serve autoscaling "
            "downscale, a Kubernetes HPA or KEDA on the request rate), or stop it and free the GPU.",
            "Share the GPU with other models or servers (Triton's or vLLM's multi-model serving, MPS, a MIG slice "
            "sized to the model and its KV cache).",
        ),
    ),
    "serving": Rule(
        _serving_when,
        _serving_summary,
        f"a server of the job listens >= **{LISTENING_MIN:g}** of the window on average - the GPU's process, a child "
        "or its front end (an ancestor in its session, of its user) on the wildcard address or a port a configuration "
        f"chose, any number (gRPC's 50051 too) - and the GPU ran kernels <= **{SERVING_BUSY_MAX:.0%}** of it; not a "
        "library's socket (NCCL's and Gloo's bootstrap on port 0 of one interface, a notebook kernel's channels on "
        "127.0.0.1, a distributed rank's ephemeral ports, MASTER_PORT's "
        "store, NCCL's RAS)",
        "a server waits for clients outside its job: it binds every interface or the port its clients are told; a "
        "library's sockets bind port 0 of the interface they chose (NCCL_SOCKET_IFNAME) or loopback [NCCL docs]; an "
        "engine process runs under its front end (vLLM's V1 EngineCore, TorchServe and Triton backends), a notebook "
        "kernel in a session of its own; the inference_server recordings (HTTP and gRPC, in-process and engine in a "
        "child, 0.2 to 20 requests a second) against the notebook-like and distributed ones [H100, H200]",
        severity="warning",
        remedies=(
            "Size the server to its load: scale replicas with the request rate and to zero between bursts "
            "(KServe/Knative min replicas 0, Ray Serve autoscaling, a Kubernetes HPA on the request rate).",
            "Share the GPU: several models or servers on one GPU (Triton's or vLLM's multi-model serving, MPS), or a "
            "MIG slice sized to the model and its KV cache instead of a whole GPU.",
            "Batch the requests that arrive (dynamic or continuous batching), and preallocate no more KV cache than "
            "the traffic needs (vLLM --gpu-memory-utilization).",
        ),
    ),
    "held_idle": Rule(
        _held_idle_when,
        _held_idle_summary,
        f"held_idle >= **{HELD_IDLE_MIN:.0%}** of the window, or util.gpu < {WORK_SAMPLE_RATIO:g} and job CPU < "
        f"{JOB_CPU_BUSY_CORES:g} cores with no reads and few waits (and GPM SM activity < {WORK_SAMPLE_RATIO:g} where "
        f"read), or the job's process stopped (SIGSTOP) >= **{STOPPED_MIN:.0%}** of the window",
        "the state thresholds above; /proc state T or t",
        severity="warning",
        remedies=(
            "The GPU's memory is held but nothing runs: end the idle process (notebook kernel, stopped job) or "
            "release memory (del tensors; torch.cuda.empty_cache()).",
            "Schedulers: reclaim idle GPUs (JupyterHub culling, Slurm/Kubernetes idle-GPU policies).",
        ),
    ),
    "throttled": Rule(
        _throttled_when,
        _throttled_summary,
        f"util.gpu >= {BUSY_UTIL:g}, thermal / HW slowdown / power brake reasons >= {THROTTLE_MIN_FRACTION:.0%} of "
        f"the time, SM clock < **{THROTTLE_CLOCK_RATIO:.0%}** of max",
        "[NVML] clock-event reasons; 90% *calibration*",
        severity="warning",
        remedies=(
            "Clocks are held below their maximum: power cap (expected at full load; raise the limit with "
            "nvidia-smi -pl if allowed), thermal (check cooling, airflow, fan/chassis), hardware slowdown or "
            "power brake (check the power supply; nvidia-smi -q -d PERFORMANCE).",
        ),
    ),
    "waiting_on_peers": Rule(
        _waiting_on_peers_when,
        _waiting_on_peers_summary,
        f"util.gpu >= {BUSY_UTIL:g} and a GPU of the same job is the straggler: this GPU spins (SM activity < "
        f"**{SPIN_SM_PER_UTIL:g} ×** util.gpu) and the peer's util.gpu <= **{PEER_LAG:g} ×** this one's (CPU-side), "
        f"or the peer's SM activity >= **{1 / PEER_LAG:g} ×** this one's (GPU-side)",
        "[H200x2]: rank 0 util 0.99 / SM 0.25–0.27, rank 1 util 0.07–0.15; a rank given 4× the GPU work computes at "
        "SM ~0.95 while its peer spins at 0.24–0.39",
        severity="warning",
        remedies=(
            "This GPU spins in a collective waiting for a slower rank: fix the straggler (its own diagnosis says "
            "why), balance the input work across ranks.",
            "Check the interconnect if no rank is slow (NVLink/PCIe errors, NCCL_DEBUG=INFO).",
        ),
    ),
    "host_compute_bound": Rule(
        _host_compute_bound_when,
        _host_compute_bound_summary,
        f"the rule of `input_starved` holds and that of `job_paused` does not, and GPM PCIe TX >= **{HOST_TX_PER_RX:g} "
        f"×** RX with TX >= **{HOST_TX_MIN_BYTES_PER_SECOND / 1e6:g} MB/s**",
        "the direction of the copies: input prepared on the host flows to the GPU (RX far above TX: loader "
        "recordings), work on the GPU's output on the host sends at least as much back (a CPU-stepped optimizer "
        "moves gradients out and parameters back, TX ≈ RX: ZeRO-Offload, Ren et al., USENIX ATC 2021; host metrics "
        "copy outputs out and nothing in). Below 100 MB/s the direction of a trickle says nothing, and without GPM "
        "(pre-Hopper) it cannot be told from `input_starved`, which then stands",
        severity="warning",
        remedies=(
            "Work on the host consumes the GPU's output while the GPU waits: keep the optimizer step on the GPU "
            "(fused AdamW) where memory allows, or overlap the host step with the next forward and backward "
            "(DeepSpeed ZeRO-Offload's delayed parameter update, overlap_comm).",
            "Compute metrics on the GPU and copy scalars, not whole outputs; log every N steps.",
            "Where the host copies the output (.cpu() into fresh pageable memory): copy into a preallocated pinned "
            "buffer with non_blocking=True on a side stream, overlapped with the next step.",
        ),
    ),
    "checkpoint_bound": Rule(
        _checkpoint_bound_when,
        _checkpoint_bound_summary,
        f"idle (paused + starved) >= **{STARVED_MIN:.0%}** of the window while the job writes storage at >= "
        f"**{IO_WRITE_BYTES_PER_SECOND / 2**20:g} MiB/s** (`/proc/PID/io` write_bytes of its process tree), more "
        "than it reads",
        "a job that stops its GPU to write a checkpoint: the bytes go out, none come in (a loader reads). A process "
        "in state D while the job writes is its fsync, not a read",
        severity="warning",
        remedies=(
            "Checkpoint without stopping the GPU: asynchronous checkpointing (torch.distributed.checkpoint.async_save, "
            "a background thread writing a host copy), or checkpoint less often.",
            "Write to faster storage (local NVMe, then copy off), shard the checkpoint across ranks.",
        ),
    ),
    "launch_bound": Rule(
        _launch_bound_when,
        _launch_bound_summary,
        f"util.gpu >= **{LAUNCH_UTIL_MIN:g}** and the busiest process >= **{LAUNCH_CPU_CORES:g}** cores, and either "
        f"SM activity < **{LAUNCH_SM_PER_UTIL:g} ×** util.gpu (tiny kernels), or SM activity < "
        f"**{LAUNCH_MID_SM_PER_UTIL:g} ×** util.gpu (mid-size kernels) with the GPU idle >= {LAUNCH_GAPS_MIN:.0%} of "
        "the time mostly in gaps inside utilization sample periods, no helper process doing the work (job CPU < "
        f"{LAUNCH_HELPERS_MAX:g} × the busiest process) and no reads",
        "[NVML] util.gpu vs [DCGM] SM activity: small kernels fill few SMs (section below)",
        severity="warning",
        remedies=(
            "Capture the step in CUDA Graphs (torch.cuda.graphs, torch.compile(mode='reduce-overhead')) so one launch "
            "replays many kernels.",
            "Fuse small operations into larger kernels (torch.compile, fused optimizers foreach=True/fused=True) and "
            "use larger batches so each kernel fills the SMs.",
            "Remove host synchronisations in the loop (.item(), .cpu(), printing tensors).",
        ),
    ),
    "job_paused": Rule(
        _job_paused_when,
        _job_paused_summary,
        f"idle (paused + starved) >= **{PAUSED_MIN:.0%}** of the window while the job's CPU beyond its GPU-busy share "
        f"is below {JOB_CPU_BUSY_CORES:g} cores per idle second, it reads and writes nothing and waits seldom (fewer "
        f"than **{WAITS_PER_SECOND:g}** voluntary context switches per idle second), or paused > starved",
        "section below",
        severity="info",
        remedies=(
            "The job itself stops between bursts of GPU work (evaluation, checkpointing, logging, sleeps, waiting on "
            "a service): overlap them with training (asynchronous checkpointing such as torch.distributed.checkpoint "
            "async_save, evaluation on another GPU), or release the GPU while waiting.",
        ),
    ),
    "input_starved": Rule(
        _input_starved_when,
        _input_starved_summary,
        f"starved >= **{STARVED_MIN:.0%}** of the window",
        "a quarter of the time idle on input: a faster pipeline gains a third more throughput; the summary says which "
        "input (CPU in helper processes or the training process, local storage, remote storage through reads or "
        "many short waits)",
        severity="warning",
        remedies=(
            "Move input work off the training loop: DataLoader(num_workers=N, pin_memory=True, "
            "persistent_workers=True, prefetch_factor>=2).",
            "Do decoding and augmentation on the GPU (NVIDIA DALI, torchvision.transforms.v2 on CUDA tensors).",
            "Cache preprocessed data; check that the job was given enough CPU cores (cgroup cpu.max, Slurm "
            "--cpus-per-task, Kubernetes CPU limits).",
            "Input from remote storage: more loader workers and a deeper prefetch, larger requests, a local cache "
            "of the dataset (node-local NVMe).",
            "If the training process spends the time on the GPU's output instead (evaluation metrics, ranking, "
            "logging on the host): compute them on the GPU and copy scalars, evaluate less often or in another "
            "process.",
        ),
    ),
    "memory_bound": Rule(
        _memory_bound_when,
        _memory_bound_summary,
        f"util.gpu >= {BUSY_UTIL:g} and GPM DRAM activity >= **{MEMORY_BOUND_DRAM:g}**",
        "roofline (section below)",
        severity="ok",
        remedies=(
            "The kernels run at HBM bandwidth: cut bytes moved - fuse elementwise chains (torch.compile), keep data "
            "in bf16/fp8 instead of fp32, avoid needless copies (.contiguous(), .clone(), device-to-device copies).",
            "Raise arithmetic intensity: larger matrix tiles or batches; FlashAttention-style fused kernels.",
        ),
    ),
    "compute_bound": Rule(
        _compute_bound_when,
        _compute_bound_summary,
        f"util.gpu >= **{BUSY_UTIL:g}**: nothing above blocks the GPU",
        "0.5: [Gao24]'s line for low utilization",
        severity="ok",
        remedies=(
            "Nothing blocks the GPU. To go faster: mixed precision (bf16/fp8), larger batches, fused kernels, "
            "or more GPUs.",
        ),
    ),
    "underutilized": Rule(
        None,
        _underutilized_summary,
        "none of the above (with the job's CPU unknown: the `blind` finding says how to let gpuwarden see)",
        severity="info",
        remedies=(
            "No single cause dominates: profile a few steps (torch.profiler, Nsight Systems) to see where the "
            "step time goes.",
        ),
    ),
}
