"""Plain data that flows through gpuwarden: static facts, one poll's readings, a node snapshot.

Everything above the NVML layer (``gpuwarden.nvml``) and the replay layer (``gpuwarden.replay``)
works on these models only. Units are base units throughout: bytes, seconds, watts, joules,
hertz, degrees Celsius, and ratios in [0, 1]. A reading that the GPU does not support, or that
failed this poll, is ``None`` (or missing from a dict) - never 0, NaN or an NVML sentinel.

The same models are the lines of a recorded trace (``docs/trace-format.md``): they are pydantic
models, validated wherever they are built (the NVML layer's readings as a trace read from disk).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Model(BaseModel):
    # a trace line holding NaN or an infinity (JSON accepts NaN and Infinity tokens) is refused, not replayed
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class GpuStatic(_Model):
    """Facts about one GPU read once at start (identity, limits, maxima, thresholds).

    Sources: nvmlDeviceGetName/UUID/Serial/PciInfo/VbiosVersion/Architecture/CudaComputeCapability,
    nvmlDeviceGetMemoryInfo (total), nvmlDeviceGetPowerManagementDefaultLimit and LimitConstraints,
    nvmlDeviceGetMaxClockInfo, nvmlDeviceGetTemperatureThreshold, nvmlDeviceGetMaxPcieLink*,
    nvmlDeviceGetEccMode, nvmlDeviceGetMigMode, nvmlGpmQueryDeviceSupport.
    """

    index: int = Field(description="NVML device index")
    uuid: str
    name: str
    pci_bus_id: str | None = None
    serial: str | None = None
    vbios_version: str | None = None
    architecture: str | None = None
    compute_capability: str | None = None
    minor_number: int | None = None
    memory_total_bytes: int | None = None
    power_limit_default_watts: float | None = None
    power_limit_min_watts: float | None = None
    power_limit_max_watts: float | None = None
    clock_max_hertz: dict[str, float] = Field(default_factory=dict)
    temperature_thresholds_celsius: dict[str, float] = Field(default_factory=dict)
    pcie_max_generation: int | None = None
    pcie_max_width: int | None = None
    ecc_enabled: bool | None = None
    mig_enabled: bool | None = None
    gpm_supported: bool = False
    nvlink_link_count: int | None = Field(default=None, description="NVML_FI_DEV_NVLINK_LINK_COUNT; None: no NVLink")


class NodeStatic(_Model):
    """Facts about the node and its driver, read once; ``gpus`` in NVML index order.

    Sources: nvmlSystemGetDriverVersion, nvmlSystemGetNVMLVersion, nvmlSystemGetCudaDriverVersion_v2.
    """

    hostname: str
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: str | None = None
    binding_version: str | None = Field(default=None, description="nvidia-ml-py version that read it")
    gpus: list[GpuStatic] = Field(default_factory=list)


class ProcessIdentity(BaseModel):
    """What a GPU process is wherever it is shown: its PID, its memory on the GPU, the process that keeps it, its
    ranks. ProcessReading (the NVML layer's reading) and gpuwarden.insight.vocabulary.result.ProcessJob (the process
    with its job) both hold these fields, declared here once.

    ``pid`` and ``gpu_memory_bytes`` come from nvmlDeviceGetComputeRunningProcesses (host PIDs), the ranks from
    /proc/PID/environ, ``kept_by`` from the device files open in /proc/*/fd.
    """

    pid: int
    gpu_memory_bytes: int | None = None
    kept_by: int | None = Field(
        default=None,
        description="for a PID /proc does not have (a process that exited while a child it forked keeps the device "
        "open): a live process with the GPU's device file open (its user, cgroup and job stand for the PID's)",
    )
    rank: int | None = Field(
        default=None,
        description="the process's global rank in a distributed job, from /proc/PID/environ: RANK (torchrun, "
        "torch.distributed), else SLURM_PROCID (srun), else OMPI_COMM_WORLD_RANK (Open MPI)",
    )
    local_rank: int | None = Field(
        default=None,
        description="its rank on this node: LOCAL_RANK, else SLURM_LOCALID, else OMPI_COMM_WORLD_LOCAL_RANK",
    )


class ProcessReading(_Model, ProcessIdentity):
    """One process that holds a context on a GPU: its ProcessIdentity, and from /proc through psutil the rest, which
    is ``None`` where the process is not visible (another PID namespace) or has ended.
    """

    name: str | None = None
    cmdline: str | None = None
    username: str | None = None
    cpu_seconds_total: float | None = Field(default=None, description="user + system CPU time of the process")
    create_time: float | None = Field(default=None, description="process start, Unix seconds")
    cgroup: str | None = Field(default=None, description="the process's cgroup path, from /proc/PID/cgroup")
    sm_utilization_ratio: float | None = Field(
        default=None,
        description="the process's share of the GPU's SM time (0-1): the mean smUtil of its "
        "nvmlDeviceGetProcessUtilization samples since the previous poll; None without a sample",
    )
    hostname_env: str | None = Field(
        default=None,
        description="HOSTNAME from /proc/PID/environ (a container's hostname: its pod's name unless the pod sets "
        "another), which tells the pods apart when several share a GPU",
    )
    slurm_job_id: str | None = Field(
        default=None,
        description="SLURM_JOB_ID from /proc/PID/environ (readable for the process's own user, root, or "
        "CAP_SYS_PTRACE), for Slurm nodes whose cgroup paths do not name the job",
    )
    cgroup_cpu_seconds_total: float | None = Field(
        default=None,
        description="CPU seconds of the process's cgroup (v2 cpu.stat usage_usec, v1 cpuacct.usage); None for the "
        "root cgroup or where unreadable",
    )
    tree_cpu_seconds_total: float | None = Field(
        default=None,
        description="CPU seconds of the process, its live descendants (DataLoader workers) and its reaped children",
    )
    tree_processes: int | None = Field(default=None, description="the process and its live descendants")
    tree_blocked: int | None = Field(
        default=None, description="of those, how many are in uninterruptible sleep (state D: waiting on I/O)"
    )
    listen_ports: list[int] | None = Field(
        default=None,
        description="the TCP ports a server of the process's job listens on: the listening sockets of the process, "
        "its descendants and its front end (up to SERVER_ANCESTORS ancestors in its session, of its user) on the "
        "wildcard address or a port a configuration chose, less what a training job's libraries listen on (NCCL's and "
        "Gloo's bootstrap on port 0 of one interface, a notebook kernel's channels, MASTER_PORT's store, NCCL's RAS; "
        "gpuwarden.procinfo.server_ports); read through psutil (/proc/PID/fd and the namespace's /proc/net/tcp), "
        "again every LISTEN_REFRESH_SECONDS; None: not read",
    )
    server_requests_running: float | None = Field(
        default=None,
        description="requests the process's server says are running (its /metrics on a listen port: vLLM, SGLang, "
        "TGI; Triton: 1 when requests were done since the previous read), read at most every 15 s "
        "(gpuwarden.server_requests); None: not read, or the server says nothing",
    )
    server_requests_waiting: float | None = Field(
        default=None, description="requests the process's server says are waiting (queued), as server_requests_running"
    )
    stopped: bool | None = Field(
        default=None,
        description="the process is stopped (/proc/PID/stat state T: SIGSTOP, Ctrl-Z, a scheduler's suspend; or t: "
        "held by a debugger); None: not read",
    )
    tree_read_bytes_total: int | None = Field(
        default=None, description="bytes the process and its live descendants read from storage (/proc/PID/io)"
    )
    tree_read_chars_total: int | None = Field(
        default=None,
        description="bytes the process and its live descendants read through any read call (/proc/PID/io rchar: "
        "files, the page cache, sockets, pipes); above tree_read_bytes_total it is what did not come from storage",
    )
    tree_write_bytes_total: int | None = Field(
        default=None,
        description="bytes the process and its live descendants caused to be written to storage (/proc/PID/io "
        "write_bytes: checkpoints, logs)",
    )
    tree_voluntary_switches_total: int | None = Field(
        default=None,
        description="voluntary context switches of the main threads of the process and its live descendants "
        "(/proc/PID/status voluntary_ctxt_switches): each a wait (a read that blocks, a sleep, a lock)",
    )


class MigReading(_Model):
    """One MIG device (GPU instance + compute instance) of a GPU in MIG mode.

    Sources: nvmlDeviceGetMigDeviceHandleByIndex, nvmlDeviceGetGpuInstanceId,
    nvmlDeviceGetComputeInstanceId, nvmlDeviceGetMemoryInfo on the MIG handle, nvmlGpmMigSampleGet.
    """

    uuid: str
    gpu_instance_id: int
    compute_instance_id: int | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    gpm: dict[str, float] = Field(default_factory=dict)


class XidEvent(_Model):
    """One XID (critical error) event from nvmlEventSetWait: time (Unix s) and XID code."""

    timestamp: float
    xid: int


class FabricReading(_Model):
    """A GPU's NVLink fabric (nvmlDeviceGetGpuFabricInfoV, v3): its registration state (not_started, in_progress,
    completed), the registration's status (NVML's error name: success, ...), its clique and cluster, the health
    mask's checks that the GPU reports (check -> True when it reports a problem: degraded_bandwidth, route_recovery,
    route_unhealthy, access_timeout_recovery) and its summary (healthy, unhealthy, limited_capacity, not_supported).
    None on the reading where the GPU has no fabric (state not supported)."""

    state: str
    status: str
    clique_id: int = 0
    cluster_uuid: str = ""
    health: dict[str, bool] = Field(default_factory=dict)
    health_summary: str = "not_supported"


class GpuReading(_Model):
    """One poll of one GPU, in base units. ``up`` is False when the GPU could not be read at all
    (lost, fallen off the bus), in which case every reading is ``None`` and ``error`` says why, except
    ``processes``: the processes that held the GPU at its last good read and still run (from /proc, GPU memory
    unknown), a job stuck on the lost GPU.
    """

    index: int
    uuid: str
    timestamp: float = Field(description="Unix seconds when this GPU was read")
    up: bool = True
    error: str | None = None
    utilization_gpu_ratio: float | None = Field(
        default=None,
        description="the share of the time since the previous poll in which a kernel ran: the mean of "
        "utilization_samples where the poll read any (util.gpu, NVML's samples of about a sixth of a second each), "
        "else nvmlDeviceGetUtilizationRates.gpu / 100 (the last sample alone)",
    )
    utilization_memory_ratio: float | None = Field(
        default=None, description="nvmlDeviceGetUtilizationRates.memory / 100 (memory controller busy)"
    )
    encoder_utilization_ratio: float | None = Field(
        default=None, description="video encoder (NVENC) busy share of its last sample period"
    )
    utilization_samples: list[tuple[float, float]] = Field(
        default_factory=list,
        description="(Unix s, ratio) from nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES) since the last poll",
    )
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    temperature_gpu_celsius: float | None = None
    temperature_memory_celsius: float | None = None
    power_usage_watts: float | None = None
    power_limit_watts: float | None = Field(default=None, description="nvmlDeviceGetEnforcedPowerLimit")
    energy_joules_total: float | None = Field(
        default=None, description="nvmlDeviceGetTotalEnergyConsumption, read at the slow cadence"
    )
    fan_speed_ratio: float | None = None
    clock_hertz: dict[str, float] = Field(default_factory=dict)
    clock_event_reasons: int | None = Field(default=None, description="nvmlDeviceGetCurrentClocksEventReasons bitmask")
    clock_event_seconds_total: dict[str, float] = Field(
        default_factory=dict, description="reason -> cumulative seconds (NVML_FI_DEV_CLOCKS_EVENT_REASON_*)"
    )
    performance_state: int | None = None
    pcie_generation: int | None = None
    pcie_width: int | None = None
    pcie_replay_total: int | None = None
    recovery_action: int | None = Field(
        default=None,
        description="NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: 0 none, 1 GPU reset, 2 node reboot, 3 drain "
        "peer-to-peer, 4 drain and reset",
    )
    nvlink_errors_total: dict[str, int] = Field(
        default_factory=dict,
        description="NVLink CRC errors over all links: crc_flit, crc_data (NVML's totals; Hopper GPUs that lack them "
        "report per link: nvlink_link_errors_total)",
    )
    nvlink_link_up: dict[str, int] = Field(
        default_factory=dict, description="link index -> 1 active (or asleep), 0 inactive (nvmlDeviceGetNvLinkState)"
    )
    nvlink_link_errors_total: dict[str, int] = Field(
        default_factory=dict,
        description="'LINK:TYPE' -> errors since the driver loaded: replay, recovery, crc_flit, crc_data, ecc_data "
        "(nvmlDeviceGetNvLinkErrorCounter), recovery_successful, recovery_failed, effective_errors, symbol_errors "
        "(Blackwell's NVML_FI_DEV_NVLINK_COUNT_* per link); read every 10 slow reads (300 s by default)",
    )
    fabric: FabricReading | None = Field(default=None, description="the GPU's NVLink fabric; None: it has none")
    gpm: dict[str, float] = Field(default_factory=dict)
    ecc_errors_total: dict[str, int] = Field(default_factory=dict)
    remapped_rows: dict[str, int] = Field(default_factory=dict)
    processes: list[ProcessReading] | None = Field(
        default=None, description="None when process listing is off or failed; [] when no process"
    )
    mig: list[MigReading] = Field(default_factory=list)
    pods: list[PodAssignment] = Field(
        default_factory=list, description="containers assigned this GPU by the kubelet (empty without its socket)"
    )
    allocated_jobs: list[str] = Field(
        default_factory=list,
        description="ids of the jobs a scheduler allocated this GPU to, from the HPC job mapping directory (a Slurm "
        "prolog writes it: gpuwarden.allocation); empty without one",
    )
    job_owners: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="the owner of each allocated job the job mapping directory names one for, by job id: user and "
        "account (the Slurm prolog's SLURM_JOB_USER and SLURM_JOB_ACCOUNT); empty without",
    )
    unsupported: list[str] = Field(
        default_factory=list,
        description="readings this GPU never answers (NVML: not supported, no permission, function not found), by "
        "name (field, or field:key): not asked again; a health-critical one missing is a blind spot",
    )
    failing: dict[str, str] = Field(
        default_factory=dict,
        description="readings whose last read failed (NVML timeout, unknown error, ...), by name as in unsupported -> "
        "NVML's error name, until a read succeeds: missing this poll, or stale (a slow reading keeps its last value)",
    )
    xid_events: list[XidEvent] = Field(default_factory=list, description="XID events since the last poll")

    @model_validator(mode="after")
    def _utilization_over_the_interval(self) -> GpuReading:
        """util.gpu over the poll's interval: the mean of its samples where it has any. NVML's instantaneous
        reading (nvmlDeviceGetUtilizationRates) is the last sample alone, so work whose period divides the poll
        period reads 0 or 100% on every poll; the mean of the samples since the previous poll is the share of the
        interval a kernel ran. Made here, where a live poll and a replayed one (traces that recorded the
        instantaneous value beside the samples) both pass, so both read the same."""
        mean = samples_mean(self.utilization_samples)
        if mean is not None:
            self.utilization_gpu_ratio = mean
        return self


def samples_mean(samples: list[tuple[float, float]]) -> float | None:
    """The mean of util.gpu ``samples`` ((Unix s, ratio) pairs, each clamped to [0, 1]): the share of their interval a
    kernel ran, each sample standing for an equal part of it (NVML samples at a steady period); None without any."""
    if not samples:
        return None
    return sum(min(max(v, 0.0), 1.0) for _, v in samples) / len(samples)


class PodAssignment(_Model):
    """A container the kubelet assigned a device of this GPU to (pod-resources API, ``List``).

    ``device_id`` is the device plugin's id: the GPU's UUID, ``UUID::N`` for a time-slicing replica, a MIG device's
    UUID, or the GPU index (``deviceIDStrategy=index``); ``resource`` the extended resource (``nvidia.com/gpu``, ...).
    For a device allocated through Dynamic Resource Allocation, ``device_id`` is the DRA driver's device name
    (``gpu-0``) and ``resource`` ``DRIVER/CLAIM_NAMESPACE/CLAIM_NAME``.
    """

    namespace: str
    pod: str
    container: str
    device_id: str
    resource: str


class HostReading(_Model):
    """The host's CPU at one poll (psutil.cpu_times): cumulative seconds per mode, and core count."""

    timestamp: float
    cpu_count: int
    cpu_seconds_total: dict[str, float] = Field(default_factory=dict)
    pressure_seconds_total: dict[str, float] = Field(
        default_factory=dict,
        description="Linux PSI: cumulative seconds some task waited, by resource (io, cpu), from /proc/pressure/*",
    )


class PollResult(_Model):
    """One poll of every GPU of the node: what a source returns and what a trace records."""

    timestamp: float
    duration_seconds: float
    gpus: list[GpuReading]
    host: HostReading | None = None

    def shifted(self, seconds: float) -> PollResult:
        """Return this poll moved ``seconds`` later in time: its, its host's and every GPU's timestamp, utilization
        samples and XID events (counters and process start times unchanged). Raises nothing."""
        gpus = [
            g.model_copy(
                update={
                    "timestamp": g.timestamp + seconds,
                    "utilization_samples": [(t + seconds, v) for t, v in g.utilization_samples],
                    "xid_events": [e.model_copy(update={"timestamp": e.timestamp + seconds}) for e in g.xid_events],
                }
            )
            for g in self.gpus
        ]
        host = self.host.model_copy(update={"timestamp": self.host.timestamp + seconds}) if self.host else None
        return self.model_copy(update={"timestamp": self.timestamp + seconds, "gpus": gpus, "host": host})
