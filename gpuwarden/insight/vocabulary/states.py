"""Time accounting: how each second of a GPU's wall time splits between states (docs/scores.md).

Within a poll interval (previous poll, this poll], the NVML utilization sample buffer (one sample
every ~1/6-1/5 s on an H100, ``GpuReading.utilization_samples``, when the poll read it: see
gpuwarden.nvml.device) splits the interval into segments. A segment of ``dt`` seconds with util.gpu ``u``
(the fraction of the sample period in which a kernel ran, NVML's definition) contributes ``u * dt`` to
``busy``; its idle rest ``(1 - u) * dt`` goes to:

- ``free``      no process holds the GPU (and its used memory is below FREE_MEMORY_BYTES), and no scheduler
  allocated it to a job;
- ``allocated_idle`` no process holds the GPU, but a scheduler allocated it to a job (the kubelet's pod-resources
  assignments, a DRA claim, a Slurm job mapping file: ``GpuReading.pods``, ``allocated_jobs``): nobody else can be
  given it, and the job does not use it;
- ``starved``   a process holds it and its job is working: the GPU's processes use at least
  JOB_CPU_BUSY_CORES of CPU over the interval, or the GPU ran work (a sample >= WORK_SAMPLE_RATIO)
  within the last RECENT_WORK_SECONDS;
- ``held_idle`` a process holds it, its processes use less CPU than that, and no recent GPU work; but the idle time
  of a server (its job listens for clients: ``ProcessReading.listen_ports``) is ``paused`` however long ago its last
  request ran: a server waits for its clients, as a job that pauses does, and nobody can tell an hour without
  requests from a server abandoned without its request counts;
- ``serving_idle`` held idle, but by a server that itself says it has had no request running or waiting for a while
  (gpuwarden.server_requests): idle capacity, live, that nobody asks;
- ``unknown``   held, but the evidence is missing: process list off or not visible, or no process CPU
  time readable (another PID namespace), and no recent GPU work; or no utilization reading at all;
- ``lost``      the GPU could not be read at all (NVML: GPU is lost, fallen off the bus): the whole interval since
  its previous poll, up or down (gpuwarden.insight.analyzer), so a GPU that flaps counts its time down here and
  never as held idle.

So busy + starved + paused + held_idle + serving_idle + allocated_idle + free + unknown + lost is exactly the
accounted wall time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: The states, in exposition order (a bounded label set).
STATES = ("busy", "starved", "paused", "held_idle", "serving_idle", "allocated_idle", "free", "unknown", "lost")

#: States in which the GPU's job works (kernels run, its input is prepared, or it paused within seconds of GPU work):
#: the GPU is in use. Idle: nobody uses it (held and idle, allocated and never opened, free). Any other state
#: (unknown, lost) says nothing either way.
ACTIVE_STATES = ("busy", "starved", "paused")
IDLE_STATES = ("held_idle", "serving_idle", "allocated_idle", "free")

#: Causes of idle GPU time (``gpu_idle_seconds_total{cause}``): starved time split by what the job did meanwhile -
#: CPU work (preprocessing, or host work on the GPU's output: the verdict tells which), reads (local storage, or
#: remote: sockets), or unknown (its CPU not visible) - then the gaps between kernels that one host thread launches one
#: at a time (``launch``: gpuwarden.insight.launches), time the job spent writing (a checkpoint), its start-up
#: (``startup``: gpuwarden.insight.startup, from its start to its first sustained kernels), then the other
#: idle states, ``lost`` last (the GPU could not be read: its time is lost to whoever holds it, or to the fleet when
#: nobody does). ``serving`` is a server's idle time while its CPU idles too: waiting for requests (the paused time of
#: a job that listens for clients); ``serving_idle`` that of a server whose own metrics have said for a while that no
#: request runs or waits (idle capacity: gpuwarden.server_requests). Busy seconds plus idle seconds by cause add up
#: to the accounted wall time.
IDLE_CAUSES = (
    "input_cpu",
    "input_io",
    "input",
    "launch",
    "checkpoint",
    "startup",
    "serving",
    "serving_idle",
    "paused",
    "held_idle",
    "allocated_idle",
    "free",
    "unknown",
    "lost",
)

#: A job whose GPU processes use at least this many CPU cores (user+sys s per s) is working. Our calibration
#: from the H100 traces: held_idle 0.00-0.01 cores, every working scenario 0.78-1.03 cores.
JOB_CPU_BUSY_CORES = 0.25

#: A utilization sample at least this high means the GPU ran work in that sample period. NVML reports whole
#: percent, so this is "any kernel at all"; the H100 idle and held_idle traces read exactly 0 in every sample,
#: the least busy working scenario (starved_cpu_heavy) 0.01-0.03.
WORK_SAMPLE_RATIO = 0.01

#: GPU work within this many seconds keeps a held GPU's idle time ``starved`` rather than ``held_idle``
#: ("GPU work issued recently"). Our choice: longer than a training step's input wait in the
#: recorded scenarios (< 1 s), short enough that a notebook that stopped counts as held_idle within seconds.
RECENT_WORK_SECONDS = 5.0

#: A job whose processes read at least this many bytes a second from storage is working on input even with its
#: CPU idle (a loader blocked on reads). A local NVMe reads GB/s; 8 MiB/s is far above the background reads of
#: an idle Python process and far below any loader that feeds a GPU from files.
IO_READ_BYTES_PER_SECOND = 8 * 2**20

#: A job whose processes' main threads wait (voluntary context switches: a blocking read, a sleep, a lock) at least
#: this often a second while its CPU idles is waiting on I/O in many short waits - a loader fetching from remote
#: storage through sockets (socket reads are in no /proc/PID/io counter), a client of a service - not pausing: a sleep
#: or one long wait is one switch. Our choice between the H100 recordings: jobs that sleep or serve requests 0-20 a
#: second, loaders waiting on a socket server 70-8,600 a second.
WAITS_PER_SECOND = 50.0

#: A job whose processes write at least this many bytes a second to storage (/proc/PID/io write_bytes, counted when
#: the pages are dirtied), more than they read, while its GPU idles is writing a checkpoint: the same bound as reads.
IO_WRITE_BYTES_PER_SECOND = 8 * 2**20


def writes_more_than_reads(written: float | None, read: float | None) -> bool:
    """Whether a job writing ``written`` bytes/s and reading ``read`` bytes/s (storage and otherwise; None: unknown,
    taken as 0) is writing a checkpoint: at least IO_WRITE_BYTES_PER_SECOND, more than it reads."""
    w = written or 0.0
    return w >= IO_WRITE_BYTES_PER_SECOND and w > (read or 0.0)


#: With no process listed, a GPU with at least this much memory used is held by processes we cannot see
#: (another PID namespace) rather than free. NVML memory info v2 excludes the driver's reserved memory
#: (0 B used when idle on the H100); v1 includes it (~0.5 GB), hence the larger bound when it is unknown.
FREE_MEMORY_BYTES = 256 * 2**20
FREE_MEMORY_BYTES_V1 = 1024 * 2**20

#: A poll interval longer than this is not accounted (a hang or a restart): the gap is left out rather
#: than guessed.
MAX_INTERVAL_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of a poll interval: ends at ``end`` (Unix s), lasts ``seconds``, util.gpu ``util`` (None: unknown)."""

    end: float
    seconds: float
    util: float | None


def segments(start: float, end: float, samples: Sequence[tuple[float, float]], util: float | None) -> list[Segment]:
    """Split the interval (start, end] into one segment per utilization sample taken in it, each an equal share.

    NVML takes util.gpu samples at a steady period (about 0.2 s: five in a 1 s poll) and a sample (t, u) is the share
    of its own period before t in which a kernel ran, so the samples of an interval stand for equal parts of it: the
    interval's util.gpu is their mean (GpuReading.utilization_gpu_ratio). Cutting the interval at the sample times
    instead gives the first sample only the moments since ``start`` and the last one the rest of the interval after
    it: work whose period divides the poll's always lands in the same sample and is weighted by where the poll's
    phase fell (a server's 80 ms a second read 3% busy where its samples mean 7.5%). Each segment ends at its
    sample's time (what ``account`` takes as the time of GPU work). Samples outside (start, end] are ignored; several
    at one time count once. Without samples, one segment of the whole interval with ``util`` (the poll's util.gpu, or
    None). Returns [] when end <= start.
    """
    if end <= start:
        return []
    inside = sorted({t: u for t, u in samples if start < t <= end}.items())
    if not inside:
        return [Segment(end, end - start, util)]
    share = (end - start) / len(inside)
    return [Segment(t, share, min(max(u, 0.0), 1.0)) for t, u in inside]


def holder_of(
    processes_listed: bool,
    n_processes: int,
    memory_used_bytes: int | None,
    memory_reserved_known: bool,
    allocated: bool = False,
) -> str:
    """Return who holds the GPU: "none", "allocated" (nobody, but a scheduler allocated it to a job), "job"
    (processes listed) or "invisible" (memory used, nobody listed).

    ``processes_listed`` is False when the process list is off or failed (``GpuReading.processes`` None);
    ``allocated`` that a scheduler gave the GPU to a job (``GpuReading.pods`` or ``allocated_jobs``).
    """
    if processes_listed and n_processes > 0:
        return "job"
    limit = FREE_MEMORY_BYTES if memory_reserved_known else FREE_MEMORY_BYTES_V1
    unused = memory_used_bytes is not None and memory_used_bytes < limit
    if unused or (processes_listed and memory_used_bytes is None):
        return "allocated" if allocated else "none"
    return "invisible"


def idle_causes(
    states: dict[str, float],
    job_cpu_cores: float | None,
    io_waiting: bool,
    writing: bool = False,
    launch_gaps: float = 0.0,
    serving: bool = False,
) -> dict[str, float]:
    """Return the idle seconds of one interval's ``states`` (from ``account``) by cause (IDLE_CAUSES).

    Starved and paused seconds go to ``checkpoint`` when the job wrote (``writing``: IO_WRITE_BYTES_PER_SECOND, more
    than it read). Otherwise starved seconds go to ``input_io`` when the job waited on reads (storage or sockets),
    ``input_cpu`` when its CPU is known (starved then means it worked), else ``input``; of what would be
    ``input_cpu``, up to ``launch_gaps`` seconds (the idle time inside sample periods that ran a kernel, where the
    interval's work is launch limited: gpuwarden.insight.launches) go to ``launch``. Paused seconds of a server
    (``serving``: its job listens for clients) go to ``serving``; serving_idle seconds (a server that says it has had
    no request for a while) to ``serving_idle``. Paused, held_idle,
    allocated_idle, free and unknown seconds keep their names. Busy seconds are left out.
    """
    starved = states.get("starved", 0.0)
    out = {k: states.get(k, 0.0) for k in ("paused", "held_idle", "allocated_idle", "free", "unknown", "lost")}
    out["serving_idle"] = states.get("serving_idle", 0.0)
    if serving and not writing:
        out["serving"] = out.pop("paused")
    if writing:
        out["checkpoint"] = starved + out.pop("paused")
        return out
    if io_waiting:
        cause = "input_io"
    elif job_cpu_cores is not None:
        cause = "input_cpu"  # starved with the job's CPU known: account() found it working
    else:
        cause = "input"
    if cause == "input_cpu" and launch_gaps > 0:
        out["launch"] = min(starved, launch_gaps)
        starved -= out["launch"]
    out[cause] = starved
    return out


def gaps_in_periods(segs: Sequence[Segment]) -> float:
    """The idle seconds of ``segs`` inside sample periods that ran a kernel (util >= WORK_SAMPLE_RATIO): gaps between
    kernels shorter than a sample period, as against whole periods with no kernel at all."""
    return sum((1.0 - s.util) * s.seconds for s in segs if s.util is not None and s.util >= WORK_SAMPLE_RATIO)


def _cpu_working(segs: Sequence[Segment], job_cpu_cores: float) -> bool:
    """Whether the job's CPU worked while its GPU idled over the interval of ``segs``.

    While a kernel runs, the process that launched it keeps about one core busy at most (launching, or waiting in
    cudaStreamSynchronize); CPU beyond that share of the interval was spent while the GPU idled. Working: that
    excess is at least JOB_CPU_BUSY_CORES per idle second. So a job that only waits on its GPU and then sleeps (its
    CPU 0.5 cores over an interval half busy) is not working on input, while a loader in the training process (1
    core, GPU 6% busy) or in worker processes (several cores) is.
    """
    known = [s for s in segs if s.util is not None]
    total = sum(s.seconds for s in known)
    busy = sum(s.util * s.seconds for s in known if s.util is not None) / total if total > 0 else 0.0
    return job_cpu_cores - busy >= JOB_CPU_BUSY_CORES * (1.0 - busy)


#: The state of the idle time of a GPU no process holds, by its holder (``holder_of``).
_UNHELD = {"none": "free", "allocated": "allocated_idle"}


def account(
    segs: Sequence[Segment],
    holder: str,
    job_cpu_cores: float | None,
    last_work: float | None,
    io_waiting: bool = False,
    serving: bool = False,
    serving_idle: bool = False,
) -> tuple[dict[str, float], float | None]:
    """Split the segments' time into STATES; return (seconds per state, time of the last GPU work).

    ``holder`` is from ``holder_of``; ``job_cpu_cores`` the CPU cores the GPU's processes used over the
    interval (None: unknown); ``last_work`` the Unix time of the last sample >= WORK_SAMPLE_RATIO before
    these segments (None: none seen); ``io_waiting`` that the job's processes waited on storage over the interval
    (a process in state D, or reads at IO_READ_BYTES_PER_SECOND), which counts as the job working on input;
    ``serving`` that its job listens for clients (a server), whose idle time with its CPU idle is ``paused`` however
    long ago its last GPU work was, unless ``serving_idle``: the server says it has had no request for a while,
    and its idle time once its GPU work is RECENT_WORK_SECONDS old is ``serving_idle`` (its paused seconds right
    after GPU work stay paused: what a server says never idles a GPU that works).
    Every second of the segments lands in exactly one state: idle time of a held GPU is ``starved`` while the
    job works (CPU or I/O), ``paused`` when the job itself idles shortly after GPU work (sleep, evaluation,
    checkpoint, waiting on something outside the node), ``held_idle`` when it has idled longer.
    """
    out = dict.fromkeys(STATES, 0.0)
    cpu_working = None if job_cpu_cores is None else _cpu_working(segs, job_cpu_cores)
    if io_waiting:
        cpu_working = True
    for s in segs:
        if s.util is None:
            out[_UNHELD.get(holder, "unknown")] += s.seconds
            continue
        if s.util >= WORK_SAMPLE_RATIO:
            last_work = s.end
        busy = s.util * s.seconds
        idle = s.seconds - busy
        out["busy"] += busy
        if holder in _UNHELD:
            out[_UNHELD[holder]] += idle
        elif holder == "invisible":
            recent = last_work is not None and s.end - last_work <= RECENT_WORK_SECONDS
            out["starved" if recent else "unknown"] += idle
        else:
            recent = last_work is not None and s.end - last_work <= RECENT_WORK_SECONDS
            if cpu_working:
                out["starved"] += idle
            elif serving and not (serving_idle and not recent):
                out["paused"] += idle
            elif recent:
                out["paused" if cpu_working is False else "starved"] += idle
            elif serving_idle:
                out["serving_idle"] += idle
            elif cpu_working is False:
                out["held_idle"] += idle
            else:
                out["unknown"] += idle
    return out, last_work
