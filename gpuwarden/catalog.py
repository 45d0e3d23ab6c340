"""The catalogue: every scalar NVML reading, every metric family and every collector, each declared once.

What derives from it:

- the NVML layer (``gpuwarden.nvml.device``) reads each declared ``Reading`` - calling each NVML function once
  per poll even where several readings share it, batching the field values - and scales it to base units;
- the collectors (``gpuwarden.collectors``) export each ``Family`` that names its reading without code of
  their own, and build the hand-written families (``reading`` is None) from the same declaration, so a family's
  name, type, help and labels exist in one place;
- the configuration checks collector names against ``COLLECTORS`` without importing a collector;
- ``docs/metrics.md`` and the field list of ``docs/trace-format.md`` are generated from it
  (``python3 -m gpuwarden.docs``); the test fake of NVML answers every declared reading from a recorded trace.

This module imports nothing from NVML: NVML's functions, constants and field ids are named as strings and
resolved by the NVML layer, the only importer of ``pynvml``. Irregular readings stay hand-written in the NVML
layer where a table would make them worse: memory (v2 with a v1 fallback), the util.gpu sample buffer, GPM,
MIG, processes, remapped rows, static facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Cadence = Literal["poll", "slow"]
FamilyType = Literal["gauge", "counter", "info"]

#: Labels every per-GPU series carries: the NVML index and the UUID.
GPU_LABELS = ("gpu", "uuid")


@dataclass(frozen=True, slots=True)
class Reading:
    """One scalar reading of a GPU: where NVML has it and how it becomes a ``GpuReading`` field.

    ``field``: the ``GpuReading`` attribute; ``key``: the key within it when the field is a dict (one reading
    per clock domain, per ECC counter, ...). ``call``: the pynvml function called with the device handle and
    then ``args`` (names of pynvml constants), or the name of an ``NVML_FI_*`` field id (read in one
    nvmlDeviceGetFieldValues batch per cadence). ``pick``: the attribute (str) or item (int) of the result that
    holds the value. ``scale``: factor to base units (mW -> W is 0.001). ``cadence``: every poll, or every
    ``slow_interval_seconds`` (carried between reads). ``integer``: kept as int. ``only_if``: a ``GpuStatic``
    attribute that must be true for the reading to be asked at all. ``source`` names the NVML definition.
    """

    field: str
    call: str
    key: str | None = None
    args: tuple[str, ...] = ()
    pick: str | int | None = None
    scale: float = 1.0
    cadence: Cadence = "poll"
    integer: bool = False
    only_if: str | None = None

    @property
    def is_field_value(self) -> bool:
        """True when ``call`` names an NVML field id (nvmlDeviceGetFieldValues) rather than a function."""
        return self.call.startswith("NVML_FI_")

    @property
    def call_name(self) -> str:
        """The name under which failures are counted (``gpuwarden_nvml_errors_total{call}``)."""
        return f"{self.call}({self.key})" if self.key is not None and not self.is_field_value else self.call


_NS = 1e-9
_PERCENT = 0.01
_MILLI = 0.001

#: Clock domains: key of GpuReading.clock_hertz / GpuStatic.clock_max_hertz -> NVML clock type.
CLOCK_DOMAINS: dict[str, str] = {
    "graphics": "NVML_CLOCK_GRAPHICS",
    "sm": "NVML_CLOCK_SM",
    "memory": "NVML_CLOCK_MEM",
    "video": "NVML_CLOCK_VIDEO",
}

#: Temperature thresholds: key of GpuStatic.temperature_thresholds_celsius -> nvmlTemperatureThresholds_t.
TEMPERATURE_THRESHOLDS: dict[str, str] = {
    "shutdown": "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN",
    "slowdown": "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN",
    "memory_max": "NVML_TEMPERATURE_THRESHOLD_MEM_MAX",
    "gpu_max": "NVML_TEMPERATURE_THRESHOLD_GPU_MAX",
}

#: Clock event (throttle) reasons: bit of nvmlDeviceGetCurrentClocksEventReasons -> snake_case of NVML's
#: nvmlClocksEventReason* name.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

#: Clock event reasons by what holds the clocks down (NVML's clocks event reasons): a power cap the GPU runs into,
#: heat, or a hardware signal (slowdown, power brake). ``gpu_idle`` and the clock settings hold nothing down.
CLOCK_EVENT_GROUPS: dict[str, tuple[str, ...]] = {
    "power": ("sw_power_cap",),
    "thermal": ("sw_thermal_slowdown", "hw_thermal_slowdown"),
    "hardware": ("hw_slowdown", "hw_power_brake_slowdown"),
}


def clock_event_reasons(*groups: str) -> tuple[str, ...]:
    """Return the reasons of ``groups`` (keys of CLOCK_EVENT_GROUPS) in bit order; raises KeyError for an unknown
    group. The dashboards' and alerts' ``reason=~`` regexes are these names joined by ``|``."""
    names = {n for g in groups for n in CLOCK_EVENT_GROUPS[g]}
    return tuple(n for _, n in sorted(CLOCK_EVENT_REASONS.items()) if n in names)


#: Reasons that hold the clocks down: NVML's "throttle" reasons.
THROTTLE_REASONS = clock_event_reasons("power", "thermal", "hardware")
#: Reasons that hold the clocks down for the GPU's own condition (heat, a hardware slowdown or power brake signal),
#: not the workload's power cap: a compute-bound job's GPUs run at their cap (sw_power_cap most of the time), and GPUs
#: of one model draw different power for the same work, so one GPU capped more than its peers is its silicon.
CONDITION_REASONS = clock_event_reasons("thermal", "hardware")


#: ECC counters: key of GpuReading.ecc_errors_total ("<type>_<counter>") -> (error type, counter type).
ECC_COUNTERS: dict[str, tuple[str, str]] = {
    "corrected_volatile": ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"),
    "uncorrected_volatile": ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
    "corrected_aggregate": ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC"),
    "uncorrected_aggregate": ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC"),
}

#: Keys of GpuReading.remapped_rows (nvmlDeviceGetRemappedRows): row counts, then 0/1 flags.
REMAPPED_ROWS = ("corrected", "uncorrected", "pending", "failure")


@dataclass(frozen=True)
class Cumulative:
    """A reading that only grows (a counter) in record ``record`` (``gpu``: GpuReading, ``process``:
    ProcessReading, ``host``: HostReading): a number, or a dict of numbers when ``keys`` (None: every key; a
    tuple: only those, the others being flags). ``integer``: a count, kept an int. ``accrues``: it grows at every
    read (energy), so a replay's growth per pass is its rate between its first and last reads (not polls). A replay
    continues each across its loops (gpuwarden.replay), and tests/test_catalog.py checks every ``*_total`` field of
    those models is here.
    """

    record: str
    field: str
    integer: bool = False
    keyed: bool = False
    keys: tuple[str, ...] | None = None
    accrues: bool = False


CUMULATIVE: tuple[Cumulative, ...] = (
    # accrues: grows all the time (a powered GPU draws energy), read at the slow cadence, so a trace's last read
    # lies up to slow_interval_seconds before its last poll: a replay takes its rate between reads
    Cumulative("gpu", "energy_joules_total", accrues=True),
    Cumulative("gpu", "pcie_replay_total", integer=True),
    Cumulative("gpu", "clock_event_seconds_total", keyed=True),
    Cumulative("gpu", "ecc_errors_total", integer=True, keyed=True),
    Cumulative("gpu", "nvlink_errors_total", integer=True, keyed=True),
    Cumulative("gpu", "nvlink_link_errors_total", integer=True, keyed=True),
    Cumulative("gpu", "remapped_rows", integer=True, keyed=True, keys=REMAPPED_ROWS[:2]),
    Cumulative("process", "cpu_seconds_total"),
    Cumulative("process", "cgroup_cpu_seconds_total"),
    Cumulative("process", "tree_cpu_seconds_total"),
    Cumulative("process", "tree_read_bytes_total", integer=True),
    Cumulative("process", "tree_read_chars_total", integer=True),
    Cumulative("process", "tree_write_bytes_total", integer=True),
    Cumulative("process", "tree_voluntary_switches_total", integer=True),
    Cumulative("host", "cpu_seconds_total", keyed=True),
    Cumulative("host", "pressure_seconds_total", keyed=True),
)

_MIB = 1048576.0
#: GPM metrics: key of GpuReading.gpm -> (nvmlGpmMetricId_t name, scale to base units). Activities become ratios
#: in [0, 1] (NVML: percent); rates bytes per second (NVML: MiB/s).
GPM_METRICS: dict[str, tuple[str, float]] = {
    "graphics_activity": ("NVML_GPM_METRIC_GRAPHICS_UTIL", _PERCENT),
    "sm_activity": ("NVML_GPM_METRIC_SM_UTIL", _PERCENT),  # DCGM: SM activity
    "sm_occupancy": ("NVML_GPM_METRIC_SM_OCCUPANCY", _PERCENT),  # DCGM: SM occupancy
    "tensor_activity": ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", _PERCENT),
    "dram_activity": ("NVML_GPM_METRIC_DRAM_BW_UTIL", _PERCENT),
    "fp64_activity": ("NVML_GPM_METRIC_FP64_UTIL", _PERCENT),
    "fp32_activity": ("NVML_GPM_METRIC_FP32_UTIL", _PERCENT),
    "fp16_activity": ("NVML_GPM_METRIC_FP16_UTIL", _PERCENT),
    "integer_activity": ("NVML_GPM_METRIC_INTEGER_UTIL", _PERCENT),
    "pcie_rx_bytes_per_second": ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", _MIB),
    "pcie_tx_bytes_per_second": ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", _MIB),
    "nvlink_rx_bytes_per_second": ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", _MIB),
    "nvlink_tx_bytes_per_second": ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", _MIB),
}

#: Every scalar reading, in the order the NVML layer reads them.
READINGS: tuple[Reading, ...] = (
    Reading("utilization_gpu_ratio", "nvmlDeviceGetUtilizationRates", pick="gpu", scale=_PERCENT),
    Reading("utilization_memory_ratio", "nvmlDeviceGetUtilizationRates", pick="memory", scale=_PERCENT),
    Reading("encoder_utilization_ratio", "nvmlDeviceGetEncoderUtilization", pick=0, scale=_PERCENT),
    Reading("temperature_gpu_celsius", "nvmlDeviceGetTemperature", args=("NVML_TEMPERATURE_GPU",)),
    Reading("power_usage_watts", "nvmlDeviceGetPowerUsage", scale=_MILLI),
    Reading("power_limit_watts", "nvmlDeviceGetEnforcedPowerLimit", scale=_MILLI),
    Reading("fan_speed_ratio", "nvmlDeviceGetFanSpeed", scale=_PERCENT),
    *(  # the SM clock (the diagnosis's FLOP utilization, fail-slow evidence) and the memory clock, not the graphics
        # clock (the SM clock on data-center GPUs) or the video clock
        Reading("clock_hertz", "nvmlDeviceGetClockInfo", key=domain, args=(CLOCK_DOMAINS[domain],), scale=1e6)
        for domain in ("sm", "memory")
    ),
    Reading("clock_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons", integer=True),
    Reading("performance_state", "nvmlDeviceGetPerformanceState", integer=True),
    Reading("pcie_generation", "nvmlDeviceGetCurrPcieLinkGeneration", integer=True),
    # field values (nanosecond duration counters become seconds)
    Reading("temperature_memory_celsius", "NVML_FI_DEV_MEMORY_TEMP"),
    Reading("clock_event_seconds_total", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP", key="sw_power_cap", scale=_NS),
    Reading("clock_event_seconds_total", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST", key="sync_boost", scale=_NS),
    Reading(
        "clock_event_seconds_total",
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
        key="sw_thermal_slowdown",
        scale=_NS,
    ),
    # the slow cadence: expensive reads (docs/performance.md) and counters that alerts read over minutes
    Reading("pcie_replay_total", "NVML_FI_DEV_PCIE_REPLAY_COUNTER", cadence="slow", integer=True),
    Reading(
        "clock_event_seconds_total",
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
        key="hw_thermal_slowdown",
        scale=_NS,
        cadence="slow",
    ),
    Reading(
        "clock_event_seconds_total",
        "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
        key="hw_power_brake_slowdown",
        scale=_NS,
        cadence="slow",
    ),
    Reading("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", cadence="slow", integer=True),
    Reading("recovery_action", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", cadence="slow", integer=True),
    Reading(
        "nvlink_errors_total",
        "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        key="crc_flit",
        cadence="slow",
        integer=True,
        only_if="nvlink_link_count",
    ),
    Reading(
        "nvlink_errors_total",
        "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        key="crc_data",
        cadence="slow",
        integer=True,
        only_if="nvlink_link_count",
    ),
    Reading("energy_joules_total", "nvmlDeviceGetTotalEnergyConsumption", scale=_MILLI, cadence="slow"),
    *(
        Reading(
            "ecc_errors_total",
            "nvmlDeviceGetTotalEccErrors",
            key=key,
            args=types,
            cadence="slow",
            integer=True,
            only_if="ecc_enabled",
        )
        for key, types in ECC_COUNTERS.items()
    ),
)


@dataclass(frozen=True, slots=True)
class Family:
    """One metric family as exposed: ``name`` (counters end in ``_total``, info families in ``_info``), ``type``,
    ``help``, the ``collector`` that yields it and its ``labels`` beyond ``gpu`` and ``uuid`` (``per_gpu``: it has
    those two).

    A family that shows one field needs no code: ``reading`` names a ``GpuReading`` field (one sample per GPU
    that is up and has it), or ``static`` a ``GpuStatic`` field (one per GPU). ``key`` picks one entry of a
    dict-valued field; where the whole dict is shown, ``labels[0]`` takes its keys. ``only_if`` names a
    ``GpuStatic`` attribute that must be true for a GPU's sample. ``keys`` keeps only those keys of a dict-valued
    field (None: every key). Families with neither ``reading`` nor
    ``static`` are built by their collector's own code from this declaration; ``shows`` names the ``GpuReading``
    field such a family is made from, where it is one.
    """

    name: str
    type: FamilyType
    help: str
    collector: str
    reading: str | None = None
    static: str | None = None
    key: str | None = None
    labels: tuple[str, ...] = ()
    per_gpu: bool = True
    only_if: str | None = None
    shows: str | None = None
    keys: tuple[str, ...] | None = None

    @property
    def base_name(self) -> str:
        """The name prometheus_client's metric families take: without ``_total`` / ``_info``."""
        if self.type == "counter":
            return self.name.removesuffix("_total")
        if self.type == "info":
            return self.name.removesuffix("_info")
        return self.name

    @property
    def all_labels(self) -> tuple[str, ...]:
        """Every label of the family's series, GPU labels first."""
        return (GPU_LABELS if self.per_gpu else ()) + self.labels


_MIG_LABELS = ("mig_uuid", "gpu_instance", "compute_instance")


def _g(name: str, help: str, collector: str, **kw: object) -> Family:
    return Family(name, "gauge", help, collector, **kw)  # type: ignore[arg-type]


def _c(name: str, help: str, collector: str, **kw: object) -> Family:
    return Family(name, "counter", help, collector, **kw)  # type: ignore[arg-type]


#: Why the HTTP server closes or refuses a connection (gpuwarden.web.server.limits.HttpLimits.counts' keys; the
#: reason label of gpuwarden_http_connections_closed_total).
HTTP_CLOSE_REASONS = (
    "evicted",
    "head_timeout",
    "head_too_large",
    "handshake_evicted",
    "handshake_failed",
    "handshake_refused",
    "send_timeout",
    "unsent_over_budget",
    "accept_failed",
)

#: Every metric family, in the order each collector yields them.
FAMILIES: tuple[Family, ...] = (
    # device
    Family(
        "gpu_info",
        "info",
        "Identity of each GPU (value 1): name, PCI bus id, serial, VBIOS, architecture, compute capability, minor "
        "number (of its /dev/nvidiaN node).",
        "device",
        labels=("name", "pci_bus_id", "serial", "vbios_version", "architecture", "compute_capability", "minor_number"),
    ),
    Family(
        "gpu_driver_info",
        "info",
        "NVIDIA driver, NVML and CUDA driver versions of the node (value 1).",
        "device",
        labels=("driver_version", "nvml_version", "cuda_driver_version"),
        per_gpu=False,
    ),
    _g("gpu_up", "1 when the GPU answered this poll, 0 when it could not be read (lost, off the bus).", "device"),
    _g(
        "gpu_reading_unsupported",
        "1 for each reading this GPU never answers (NVML: not supported, no permission, function not found; asked "
        "once, then not again): reading is the GpuReading field, or field:key (docs/trace-format.md). A "
        "health-critical one (ECC, row remapping, NVLink errors, recovery action, PCIe replays) missing is a blind "
        "spot.",
        "device",
        labels=("reading",),
    ),
    _g(
        "gpu_reading_failing",
        "1 for each reading whose last read on this GPU failed, by reading and NVML error (timeout, unknown, ...), "
        "until a read succeeds: the reading is missing, or stale where its last good value is carried.",
        "device",
        labels=("reading", "error"),
    ),
    _g(
        "gpu_devices",
        "Number of GPUs gpuwarden watches on this node; nodename: the node's name (configuration node_name, else the "
        "host name).",
        "device",
        labels=("nodename",),
        per_gpu=False,
    ),
    # utilization
    _g(
        "gpu_utilization_ratio",
        "Fraction of the time since the previous poll in which one or more kernels ran on the GPU: the mean of NVML's "
        "util.gpu samples over the interval (nvmlDeviceGetSamples), not the last sample alone.",
        "utilization",
        reading="utilization_gpu_ratio",
    ),
    _g(
        "gpu_memory_copy_utilization_ratio",
        "Fraction of the last sample period in which device memory was read or written (NVML util.memory).",
        "utilization",
        reading="utilization_memory_ratio",
    ),
    _g(
        "gpu_encoder_utilization_ratio",
        "Fraction of the last sample period in which the video encoder (NVENC) was busy.",
        "utilization",
        reading="encoder_utilization_ratio",
    ),
    # memory
    _g("gpu_memory_total_bytes", "Total device memory, in bytes.", "memory", reading="memory_total_bytes"),
    _g("gpu_memory_used_bytes", "Device memory used by allocations, in bytes.", "memory", reading="memory_used_bytes"),
    _g("gpu_memory_free_bytes", "Device memory free, in bytes.", "detail", reading="memory_free_bytes"),
    _g(
        "gpu_memory_reserved_bytes",
        "Device memory reserved by the driver and firmware, in bytes.",
        "detail",
        reading="memory_reserved_bytes",
    ),
    # thermal
    _g(
        "gpu_temperature_celsius",
        "GPU die temperature, in degrees Celsius.",
        "thermal",
        reading="temperature_gpu_celsius",
    ),
    _g(
        "gpu_memory_temperature_celsius",
        "Device memory (HBM) temperature, in degrees Celsius.",
        "thermal",
        reading="temperature_memory_celsius",
    ),
    _g(
        "gpu_fan_speed_ratio",
        "Fan speed as a fraction of its maximum (cards with a fan only).",
        "thermal",
        reading="fan_speed_ratio",
    ),
    _g(
        "gpu_temperature_threshold_celsius",
        "The card's temperature thresholds that the alerts compare with: slowdown (clocks drop) and memory_max (the "
        "memory's max operating temperature).",
        "thermal",
        static="temperature_thresholds_celsius",
        labels=("threshold",),
        keys=("memory_max", "slowdown"),
    ),
    # power
    _g("gpu_power_usage_watts", "Power draw of the board, in watts.", "power", reading="power_usage_watts"),
    _g(
        "gpu_power_limit_watts",
        "Power limit the driver enforces now, in watts.",
        "power",
        reading="power_limit_watts",
    ),
    _g(
        "gpu_power_default_limit_watts",
        "Default power limit of the board, in watts.",
        "detail",
        static="power_limit_default_watts",
    ),
    _c(
        "gpu_energy_joules_total",
        "Energy consumed since the driver loaded, in joules (read every slow interval).",
        "power",
        reading="energy_joules_total",
    ),
    # clocks
    _g(
        "gpu_clock_hertz",
        "Current clock frequency of the SMs and the memory, in hertz.",
        "clocks",
        reading="clock_hertz",
        labels=("clock",),
        keys=("memory", "sm"),
    ),
    _g(
        "gpu_clock_max_hertz",
        "Maximum clock frequency of the GPU, in hertz.",
        "detail",
        static="clock_max_hertz",
        labels=("clock",),
    ),
    _g(
        "gpu_performance_state",
        "Performance state (P-state): 0 is the highest performance, 15 the lowest.",
        "detail",
        reading="performance_state",
    ),
    # clock_events
    _g(
        "gpu_clock_event_reason_active",
        "1 when this clock event reason holds the clocks down now (nvmlDeviceGetCurrentClocksEventReasons); the "
        "reasons that do not have no series.",
        "clock_events",
        labels=("reason",),
        shows="clock_event_reasons",
    ),
    _c(
        "gpu_clock_event_reason_seconds_total",
        "Cumulative time the clocks were held down for this reason, in seconds (NVML duration counters); a reason "
        "still at 0 has no series.",
        "clock_events",
        labels=("reason",),
        shows="clock_event_seconds_total",
    ),
    # pcie
    _g("gpu_pcie_link_generation", "Current PCIe link generation.", "detail", reading="pcie_generation"),
    _g("gpu_pcie_link_width", "Current PCIe link width (lanes).", "pcie", reading="pcie_width"),
    _g(
        "gpu_pcie_receive_bytes_per_second",
        "PCIe traffic to the GPU (host to device), bytes per second over the last GPM interval.",
        "pcie",
        reading="gpm",
        key="pcie_rx_bytes_per_second",
    ),
    _g(
        "gpu_pcie_transmit_bytes_per_second",
        "PCIe traffic from the GPU (device to host), bytes per second over the last GPM interval.",
        "pcie",
        reading="gpm",
        key="pcie_tx_bytes_per_second",
    ),
    _g(
        "gpu_pcie_link_max_generation",
        "Maximum PCIe link generation of the GPU and slot.",
        "detail",
        static="pcie_max_generation",
    ),
    _g("gpu_pcie_link_max_width", "Maximum PCIe link width (lanes).", "pcie", static="pcie_max_width"),
    _c(
        "gpu_pcie_replay_errors_total",
        "PCIe replays (link-level retransmissions) since the driver loaded.",
        "pcie",
        reading="pcie_replay_total",
    ),
    _g(
        "gpu_recovery_action",
        "The recovery the driver asks for (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): 0 none, 1 GPU reset, 2 node reboot, "
        "3 drain peer-to-peer traffic, 4 drain and reset.",
        "ecc",
        reading="recovery_action",
    ),
    _c(
        "gpu_nvlink_errors_total",
        "NVLink CRC errors summed over the GPU's links, by type (crc_flit, crc_data), since the driver loaded.",
        "pcie",
        labels=("type",),
        reading="nvlink_errors_total",
        only_if="nvlink_link_count",
    ),
    # nvlink: each link and the fabric
    _g(
        "gpu_nvlink_link_up",
        "1 when the NVLink link is active (or asleep), 0 when it is inactive (nvmlDeviceGetNvLinkState), by link.",
        "nvlink",
        labels=("link",),
        reading="nvlink_link_up",
        only_if="nvlink_link_count",
    ),
    _c(
        "gpu_nvlink_link_errors_total",
        "NVLink errors of each link since the driver loaded, by type: replay, recovery, crc_flit, crc_data, ecc_data "
        "(nvmlDeviceGetNvLinkErrorCounter); on Blackwell recovery_successful, recovery_failed (link recovery events), "
        "effective_errors, symbol_errors (NVML_FI_DEV_NVLINK_COUNT_*). Read every 10 slow reads (300 s by default); a "
        "counter still at 0 has no series.",
        "nvlink",
        labels=("link", "type"),
        shows="nvlink_link_errors_total",
    ),
    _g(
        "gpu_fabric_state",
        "The GPU's NVLink fabric registration (nvmlDeviceGetGpuFabricInfoV): 1 for its state (not_started, "
        "in_progress, completed); the other states have no series, nor a GPU without a fabric.",
        "nvlink",
        labels=("state",),
        shows="fabric",
    ),
    Family(
        "gpu_fabric_info",
        "info",
        "The GPU's NVLink fabric (value 1): the registration's status (NVML's error name, success), its clique id, "
        "cluster UUID and health summary (healthy, unhealthy, limited_capacity, not_supported).",
        "nvlink",
        labels=("status", "clique_id", "cluster_uuid", "health_summary"),
        shows="fabric",
    ),
    _g(
        "gpu_fabric_health_problem",
        "1 when a check of the fabric's health mask reports a problem, 0 when it reports none, by check "
        "(degraded_bandwidth, route_recovery, route_unhealthy, access_timeout_recovery); checks the GPU does not "
        "report have no series.",
        "nvlink",
        labels=("check",),
        shows="fabric",
    ),
    # gpm
    _g(
        "gpu_graphics_engine_activity_ratio",
        "Fraction of time the graphics or compute engine was active (GPM graphics util).",
        "detail",
        reading="gpm",
        key="graphics_activity",
    ),
    _g(
        "gpu_sm_activity_ratio",
        "Fraction of time an SM had at least one warp resident, averaged over all SMs (GPM SM util; DCGM SM activity).",
        "gpm",
        reading="gpm",
        key="sm_activity",
    ),
    _g(
        "gpu_sm_occupancy_ratio",
        "Resident warps relative to the maximum, averaged over SMs (GPM SM occupancy; DCGM SM occupancy).",
        "gpm",
        reading="gpm",
        key="sm_occupancy",
    ),
    _g(
        "gpu_tensor_activity_ratio",
        "Fraction of time any tensor pipe was active (GPM any-tensor util).",
        "gpm",
        reading="gpm",
        key="tensor_activity",
    ),
    _g(
        "gpu_flop_utilization_ratio",
        "Overall FLOP Utilization (OFU), an estimate of model FLOP utilization: tensor activity x SM clock / maximum "
        "SM clock, against the dense tensor peak of the precision in use (docs/scores.md). Absent without GPM.",
        "gpm",
    ),
    _g(
        "gpu_dram_activity_ratio",
        "Device memory bandwidth used relative to the maximum (GPM DRAM bandwidth util).",
        "gpm",
        reading="gpm",
        key="dram_activity",
    ),
    _g(
        "gpu_pipe_activity_ratio",
        "Fraction of time the SMs used this non-tensor pipe (GPM).",
        "detail",
        labels=("pipe",),
    ),
    _g(
        "gpu_nvlink_receive_bytes_per_second",
        "NVLink receive rate, all links. Bytes per second (GPM).",
        "gpm",
        reading="gpm",
        key="nvlink_rx_bytes_per_second",
        only_if="nvlink_link_count",
    ),
    _g(
        "gpu_nvlink_transmit_bytes_per_second",
        "NVLink transmit rate, all links. Bytes per second (GPM).",
        "gpm",
        reading="gpm",
        key="nvlink_tx_bytes_per_second",
        only_if="nvlink_link_count",
    ),
    # ecc
    _g("gpu_ecc_enabled", "1 when ECC is enabled on the GPU.", "detail", static="ecc_enabled"),
    _c(
        "gpu_ecc_errors_total",
        "ECC errors by type (corrected, uncorrected); counter volatile counts since the driver loaded, aggregate "
        "over the GPU's life.",
        "ecc",
        labels=("type", "counter"),
        shows="ecc_errors_total",
    ),
    _c(
        "gpu_remapped_rows_total",
        "Rows remapped because of corrected or uncorrected errors.",
        "detail",
        labels=("type",),
    ),
    _g(
        "gpu_row_remap_pending",
        "1 when a row remap is pending: the GPU needs a reset to apply it.",
        "ecc",
        reading="remapped_rows",
        key="pending",
    ),
    _g(
        "gpu_row_remap_failure",
        "1 when a row remap failed: the GPU should be serviced.",
        "ecc",
        reading="remapped_rows",
        key="failure",
    ),
    # xid
    _c(
        "gpu_xid_errors_total",
        "XID errors reported by the driver since gpuwarden started, by XID code; a code has series only once it "
        "occurred.",
        "xid",
        labels=("xid",),
    ),
    _g(
        "gpu_xid_last_event_timestamp_seconds",
        "Unix time of the last XID error of this code.",
        "xid",
        labels=("xid",),
    ),
    # processes
    _g("gpu_compute_processes", "Number of compute processes holding a context on the GPU.", "processes"),
    _g(
        "gpu_process_memory_used_bytes",
        "GPU memory used by one process, in bytes (the largest processes of each GPU only).",
        "processes",
        labels=("pid", "process_name"),
    ),
    _g(
        "gpu_process_start_time_seconds",
        "Start time of one GPU process since the Unix epoch, in seconds (psutil create_time; the largest processes "
        "of each GPU only, as gpu_process_memory_used_bytes): a job's age, which the memory page uses to tell an "
        "allocator's warm-up from a leak.",
        "processes",
        labels=("pid", "process_name"),
    ),
    _g(
        "gpu_process_sm_utilization_ratio",
        "Share of the GPU's time one process ran kernels (nvmlDeviceGetProcessUtilization smUtil, mean since the "
        "last poll), scaled down where the processes of a GPU add up to more than its util.gpu, so that they never "
        "exceed the device's value (the largest processes of each GPU only).",
        "processes",
        labels=("pid", "process_name"),
    ),
    Family(
        "gpu_pod_info",
        "info",
        "A Kubernetes container the kubelet assigned this GPU (pod-resources API; several under time-slicing): "
        "namespace, pod, container, the device plugin's device id and resource.",
        "processes",
        labels=("namespace", "pod", "container", "device_id", "resource"),
    ),
    # mig
    _g("gpu_mig_mode_enabled", "1 when MIG mode is enabled on the GPU.", "detail", static="mig_enabled"),
    _g("gpu_mig_memory_used_bytes", "Memory used on the MIG device, in bytes.", "mig", labels=_MIG_LABELS),
    _g("gpu_mig_memory_total_bytes", "Memory of the MIG device, in bytes.", "mig", labels=_MIG_LABELS),
    _g("gpu_mig_sm_activity_ratio", "SM activity of the MIG device (GPM).", "mig", labels=_MIG_LABELS),
    _g("gpu_mig_sm_occupancy_ratio", "SM occupancy of the MIG device (GPM).", "mig", labels=_MIG_LABELS),
    _g("gpu_mig_tensor_activity_ratio", "Tensor pipe activity of the MIG device (GPM).", "mig", labels=_MIG_LABELS),
    _g("gpu_mig_dram_activity_ratio", "DRAM bandwidth used by the MIG device (GPM).", "mig", labels=_MIG_LABELS),
    _g(
        "gpu_mig_graphics_engine_activity_ratio",
        "Engine activity of the MIG device (GPM).",
        "mig",
        labels=_MIG_LABELS,
    ),
    # insight
    _c(
        "gpu_state_seconds_total",
        "Seconds the GPU spent in each state (see docs/scores.md); a state the GPU has not been in since gpuwarden "
        "started has no series.",
        "insight",
        labels=("state",),
    ),
    _c(
        "gpu_idle_seconds_total",
        "Seconds the GPU idled, by cause: input_cpu, input_io, input (job CPU unknown), launch (gaps between kernels "
        "launched one at a time), checkpoint, startup (from the job's start to its first sustained kernels), serving "
        "(a server waiting for requests), serving_idle (a server that says it has had no request for a while), paused, "
        "held_idle, allocated_idle (allocated to a job by a scheduler, never opened), free, unknown, lost (the GPU "
        "could not be read); with the busy seconds of gpu_state_seconds_total "
        "they add up to wall time (docs/scores.md). A cause the GPU has not idled for since gpuwarden started has no "
        "series.",
        "insight",
        labels=("cause",),
    ),
    _c(
        "gpu_held_idle_energy_joules_total",
        "Energy the GPU drew above its own idle floor (the lowest power seen since gpuwarden started) while held "
        "idle: memory held by processes, no kernel running; in joules.",
        "idle_energy",
    ),
    _c(
        "gpu_idle_energy_joules_total",
        "Energy the GPU drew above its own idle floor (the lowest power seen since gpuwarden started) while idle, by "
        "the cause of gpu_idle_seconds_total (the causes it has idled for); in joules: what each cause of idle time "
        "costs in power.",
        "idle_energy",
        labels=("cause",),
    ),
    _c(
        "gpu_peer_wait_seconds_total",
        "Seconds of the GPU's busy time (a kernel ran) spent in kernels waiting in a collective on another GPU of its "
        "job, the straggler: busy by NVML's definition, lost to the straggler; a lower bound (docs/scores.md).",
        "insight",
    ),
    _c(
        "gpu_peer_wait_energy_joules_total",
        "Energy the GPU drew above its own idle floor (as gpu_idle_energy_joules_total) while waiting in a collective "
        "on another GPU of its job (the seconds of gpu_peer_wait_seconds_total); in joules.",
        "idle_energy",
    ),
    _g(
        "gpu_starved_ratio",
        "Share of the last {window} s in which the GPU sat idle while the job holding it worked.",
        "insight",
    ),
    _g(
        "gpu_diagnosis",
        "1 for the GPU's verdict and for each extra finding; the other reasons have no series.",
        "insight",
        labels=("reason",),
    ),
    _g(
        "gpu_job_shortfall_ratio",
        "1 - this GPU's activity / that of the busiest GPU of its job: how far it lags its job (docs/scores.md).",
        "insight",
    ),
    _g(
        "gpu_node_imbalance_ratio",
        "Load imbalance over the node's GPUs, 1 - least / most active: 0 balanced, 1 a GPU idles while another "
        "works (docs/scores.md).",
        "insight",
        per_gpu=False,
    ),
    _g(
        "gpu_job_imbalance_ratio",
        "Load imbalance over the GPUs of one job, 1 - least / most active: 0 balanced, 1 a GPU idles while another "
        "works (docs/scores.md).",
        "insight",
        labels=("job_id", "job_kind"),
        per_gpu=False,
    ),
    Family(
        "gpu_process_job_info",
        "info",
        "The job of a GPU process: Kubernetes pod UID, Slurm job, container, systemd unit, cgroup or user/command; "
        "job_scope cluster: the id means the same job on every node (Kubernetes, Slurm), node: only on this node; "
        "slurm_job_id: the numeric Slurm job id (also of a job keyed by its SLUID, where its environment gave it); "
        "rank, local_rank: its rank in a distributed job and on this node (RANK and LOCAL_RANK, or the launcher's "
        "own variables, from its environment; '' when unknown).",
        "insight",
        labels=(
            "pid",
            "job_id",
            "job_kind",
            "job_scope",
            "container_id",
            "user",
            "process_name",
            "namespace",
            "pod",
            "container",
            "slurm_job_id",
            "rank",
            "local_rank",
        ),
    ),
    Family(
        "gpu_job_info",
        "info",
        "A job holding the GPU (one series per GPU and job, whatever its number of processes), by its processes or "
        "by a scheduler's allocation (the kubelet's pods, the job mapping directory): job_id, job_kind, job_scope as "
        "on gpu_process_job_info, the Kubernetes names where the kubelet gave them, and the owner: user (the Slurm "
        "prolog's, else the processes'), account (the Slurm prolog's); by which lost GPU-hours add up per owner.",
        "insight",
        labels=("job_id", "job_kind", "job_scope", "namespace", "pod", "container", "slurm_job_id", "user", "account"),
    ),
    # exporter (the daemon's own)
    Family(
        "gpuwarden_build_info",
        "info",
        "gpuwarden version and runtime (value 1).",
        "exporter",
        labels=("version", "python_version", "nvml_binding_version"),
        per_gpu=False,
    ),
    Family(
        "gpuwarden_gpu_hour_price",
        "gauge",
        "Price of one GPU-hour of a GPU model of this node (configuration gpu_hour_prices by model, else "
        "price_per_gpu_hour), in the currency of the label; model: NVML's name, as gpu_info's; absent when not "
        "configured.",
        "exporter",
        labels=("currency", "model"),
        per_gpu=False,
    ),
    Family(
        "gpuwarden_source_info",
        "info",
        "Where readings come from: nvml (live) or replay (a recorded trace).",
        "exporter",
        labels=("source", "trace"),
        per_gpu=False,
    ),
    _g("gpuwarden_source_up", "1 when the last poll of the source succeeded.", "exporter", per_gpu=False),
    _c("gpuwarden_polls_total", "Polls completed.", "exporter", per_gpu=False),
    _c("gpuwarden_poll_failures_total", "Polls that failed as a whole.", "exporter", per_gpu=False),
    _g("gpuwarden_poll_interval_seconds", "Configured time between polls.", "exporter", per_gpu=False),
    _g("gpuwarden_poll_duration_seconds", "Duration of the last poll of every GPU.", "exporter", per_gpu=False),
    _g(
        "gpuwarden_last_poll_success_timestamp_seconds",
        "Unix time of the last successful poll; alert on time() minus this.",
        "exporter",
        per_gpu=False,
    ),
    _g(
        "gpuwarden_config_last_reload_successful",
        "1 when the last configuration reload (SIGHUP) applied, 0 when it was refused (as Prometheus's own).",
        "exporter",
        per_gpu=False,
    ),
    _g(
        "gpuwarden_config_last_reload_success_timestamp_seconds",
        "Unix time the configuration last loaded, at start or on a reload.",
        "exporter",
        per_gpu=False,
    ),
    # the process itself, as every Prometheus client library exports it (prometheus_client's ProcessCollector)
    _g("process_virtual_memory_bytes", "Virtual memory size in bytes.", "exporter", per_gpu=False),
    _g("process_resident_memory_bytes", "Resident memory size in bytes.", "exporter", per_gpu=False),
    _g(
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        "exporter",
        per_gpu=False,
    ),
    _c("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", "exporter", per_gpu=False),
    _g("process_open_fds", "Number of open file descriptors.", "exporter", per_gpu=False),
    _g("process_max_fds", "Maximum number of open file descriptors.", "exporter", per_gpu=False),
    _c(
        "gpuwarden_nvml_errors_total",
        "NVML calls that failed, by call and NVML error.",
        "exporter",
        labels=("call", "error"),
        per_gpu=False,
    ),
    _c(
        "gpuwarden_http_connections_closed_total",
        "Connections the HTTP server closed to stay within its bounds, by reason: evicted (the connection waiting "
        "longest for its request or TLS ClientHello, at the connection cap), head_timeout, head_too_large, "
        "handshake_evicted (an unfinished TLS handshake: a source's own oldest past its share, "
        "else the oldest of the source holding the most, at the handshake cap), handshake_failed, handshake_refused "
        "(a ClientHello from a source starting handshakes faster than its rate), send_timeout (an answer its "
        "client did not take in time), unsent_over_budget (the "
        "answer waiting longest when all waiting answers passed their budget), accept_failed (accept found no "
        "descriptor or memory).",
        "exporter",
        labels=("reason",),
        per_gpu=False,
    ),
    # the exposition itself, per collector
    _g(
        "gpuwarden_scrape_collector_success",
        "1 when the collector rendered without error.",
        "(exposition)",
        labels=("collector",),
        per_gpu=False,
    ),
    _g(
        "gpuwarden_scrape_collector_duration_seconds",
        "Time the collector took to render, in seconds.",
        "(exposition)",
        labels=("collector",),
        per_gpu=False,
    ),
)

FAMILY: dict[str, Family] = {f.name: f for f in FAMILIES}


@dataclass(frozen=True, slots=True)
class CollectorInfo:
    """A collector's name (``--collector.NAME``), whether it runs by default, and its one-line help."""

    name: str
    enabled_by_default: bool
    help: str


#: Every collector, by name. ``exporter`` (the daemon's own metrics) cannot be disabled.
COLLECTORS: dict[str, CollectorInfo] = {
    c.name: c
    for c in (
        CollectorInfo("clock_events", True, "Clock event (throttle) reasons as 0/1 per reason, and seconds per reason"),
        CollectorInfo("clocks", True, "Current SM and memory clocks"),
        CollectorInfo(
            "detail",
            False,
            "Readings beyond the default profile: maximum clocks and P-state, graphics and pipe activity (GPM), PCIe "
            "generations, memory free and reserved, default power limit, ECC and MIG mode, "
            "remapped row counts",
        ),
        CollectorInfo("device", True, "GPU identity (gpu_info), driver versions, up/down per GPU, GPU count"),
        CollectorInfo("ecc", True, "ECC error counters, row-remap pending/failure, recovery action"),
        CollectorInfo(
            "exporter", True, "gpuwarden's own metrics: build info, polls, poll duration, freshness, NVML errors"
        ),
        CollectorInfo("gpm", True, "GPM activity: SM activity/occupancy, tensor, DRAM, FLOP utilization, NVLink"),
        CollectorInfo("insight", True, "GPU state seconds, starved ratio, imbalance, job attribution and diagnosis"),
        CollectorInfo(
            "idle_energy",
            False,
            "Energy drawn above the idle floor while idle, by idle cause, held idle and waiting on peers",
        ),
        CollectorInfo("memory", True, "Device memory total and used (nvmlDeviceGetMemoryInfo v2)"),
        CollectorInfo("mig", True, "MIG mode, and memory and GPM activity per MIG device"),
        CollectorInfo("pcie", True, "PCIe link width, RX/TX bytes per second (GPM), replay errors; NVLink CRC errors"),
        CollectorInfo(
            "nvlink", True, "Each NVLink link: up or not, errors by type (replay, recovery, CRC, ...); the fabric"
        ),
        CollectorInfo("power", True, "Power draw, enforced power limit, energy counter"),
        CollectorInfo("processes", True, "Compute process count and GPU memory per process (top N per GPU)"),
        CollectorInfo(
            "thermal", True, "GPU and memory temperature, the card's slowdown and memory maximum thresholds, fan speed"
        ),
        CollectorInfo(
            "utilization", True, "GPU, memory-controller and encoder utilization (nvmlDeviceGetUtilizationRates)"
        ),
        CollectorInfo("xid", True, "XID error counters per code and last event time (NVML events)"),
    )
}


def select_collectors(
    enable: tuple[str, ...] | list[str] = (),
    disable: tuple[str, ...] | list[str] = (),
    disable_defaults: bool = False,
) -> list[str]:
    """Return the names of the collectors to run, sorted: enabled by default (none but ``exporter`` with
    ``disable_defaults``, as node_exporter's ``--collector.disable-defaults``), plus ``enable``, minus ``disable``.

    Raises ValueError naming an unknown collector, or when ``exporter`` (self-metrics) is disabled.
    """
    on, off = set(enable), set(disable)
    unknown = sorted((on | off) - set(COLLECTORS))
    if unknown:
        raise ValueError(f"unknown collector {unknown[0]!r} (known: {', '.join(sorted(COLLECTORS))})")
    if "exporter" in off:
        raise ValueError("collector 'exporter' (self-metrics) cannot be disabled")
    defaults = {"exporter"} if disable_defaults else {n for n, c in COLLECTORS.items() if c.enabled_by_default}
    return [name for name in sorted(COLLECTORS) if (name in defaults or name in on) and name not in off]
