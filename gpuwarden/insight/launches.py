"""Launch-limited work: kernels that fill few SMs, issued one at a time by one busy host thread (docs/scores.md).

The same test serves the diagnosis (``launch_bound`` over the diagnosis window) and the accounting (the idle time
between such kernels is the ``launch`` cause of ``gpu_idle_seconds_total``, per poll interval).

util.gpu is the share of time in which any kernel runs (NVML); DCGM's SM activity averages over all SMs the time one
has a warp resident (NVML GPM SM utilization). Their ratio is the share of SMs a running kernel covers: a kernel of
a few blocks runs on a few of the GPU's SMs (132 on an H100), a GEMM or a training step fills every SM.
"""

from __future__ import annotations

#: Kernels run at least this share of the time (a stream of kernels, not an idle GPU) ...
LAUNCH_UTIL_MIN = 0.1
#: ... but SM activity is below this share of util.gpu: kernels of a few blocks (tiny kernels).
LAUNCH_SM_PER_UTIL = 0.25
#: ... while the job's busiest process keeps at least this much of a core busy (the launching host thread).
LAUNCH_CPU_CORES = 0.7
#: Mid-size kernels: SM activity below this share of util.gpu means the kernels, while they run, cover on average
#: less than half of the SMs (a grid of fewer blocks than SMs). A kernel whose grid has at least as many blocks as the
#: GPU has SMs occupies all of them: GEMMs, training steps, elementwise work over large tensors and DataLoader-fed
#: models read 0.7-1.0 on the H100 recordings. Below it, with the GPU idle at least LAUNCH_GAPS_MIN of the time in gaps
#: shorter than a utilization sample period, while one thread keeps a core busy and no helper process does the
#: work, the thread launching the kernels is the limit; input made in the training process between steps would look
#: alike (only a profiler's timeline separates them), which the diagnosis's summary says.
LAUNCH_MID_SM_PER_UTIL = 0.5
#: Mid-size kernels count as launch limited only with the GPU idle at least this share of the time (the share that
#: makes a GPU starved in the diagnosis).
LAUNCH_GAPS_MIN = 0.25
#: ... most of it (more than this share of the idle time) inside sample periods that ran a kernel: launch gaps are
#: microseconds, a wait for input between steps empties whole sample periods (about 1/6 s on an H100).
LAUNCH_GAPS_IN_PERIODS = 0.5
#: ... and the job's CPU is its launching process's: less than this many times the busiest process's (no helper
#: processes, such as DataLoader workers, doing the work).
LAUNCH_HELPERS_MAX = 1.5


def launch_limited(
    util: float | None,
    sm: float | None,
    max_process_cpu: float | None,
    job_cpu: float | None,
    whole_idle: float | None,
    io_busy: bool,
    copies: bool,
) -> bool:
    """Whether kernels running ``util`` of the time (util.gpu, a ratio) with SM activity ``sm`` (GPM, a ratio) are
    issued one at a time by a host thread that is the limit: the busiest process of the job uses ``max_process_cpu``
    cores (>= LAUNCH_CPU_CORES) and the kernels fill few SMs (sm < LAUNCH_SM_PER_UTIL x util), or mid-size kernels
    (sm < LAUNCH_MID_SM_PER_UTIL x util) with the GPU idle >= LAUNCH_GAPS_MIN, ``whole_idle`` (share of the time in
    sample periods with no kernel; None: unknown) below LAUNCH_GAPS_IN_PERIODS of that idle time, the job's CPU
    ``job_cpu`` (cores; None: unknown) under LAUNCH_HELPERS_MAX x its busiest process's, and no storage or socket
    I/O (``io_busy``). Never while the job copies to or from the GPU (``copies``: gpuwarden.insight.rules.
    copies_data): launches move little over PCIe (the H100 recordings of launch-bound loops: 0.15-0.23 GB/s in,
    0.01-0.03 GB/s out), a job stepping its optimizer on the host moves GB/s both ways, and its GPU idles on that host
    work.
    False where util, sm or the process's CPU is unknown. Raises nothing."""
    if util is None or sm is None or max_process_cpu is None or copies:
        return False
    if util < LAUNCH_UTIL_MIN or max_process_cpu < LAUNCH_CPU_CORES:
        return False
    if sm < LAUNCH_SM_PER_UTIL * util:
        return True
    if sm >= LAUNCH_MID_SM_PER_UTIL * util or io_busy:
        return False
    idle = 1.0 - util
    if idle < LAUNCH_GAPS_MIN or (whole_idle is not None and whole_idle >= LAUNCH_GAPS_IN_PERIODS * idle):
        return False
    return job_cpu is None or job_cpu < LAUNCH_HELPERS_MAX * max_process_cpu
