"""The configuration's model: every key ``gpuwarden serve`` reads, its default, its bounds and what it means
(gpuwarden.config.load fills it from a file, the environment and the flags)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

DEFAULT_PORT = 10400

#: Seconds between reads of the slow readings (energy, ECC, remapped rows, PCIe link width and replays, hardware
#: slowdown durations): counters and states that alerts read over minutes (dcgm-exporter reads everything every
#: 30 s by default). NVML's energy counter is cumulative, so reading it less often loses no energy, only time
#: resolution; power draw itself is read every poll. The cost of each read: docs/performance.md.
SLOW_INTERVAL = 30.0

#: Seconds GPM metrics average over, computed once per interval (nvmlGpmMetricsGet's cost: docs/performance.md);
#: dcgm-exporter's default is 30 s. The insight verdicts use windows of 60 s and more.
GPM_INTERVAL = 10.0


class ConfigError(Exception):
    """The configuration is unreadable or invalid; ``str()`` is one line naming the key."""


class ProcessesConfig(BaseModel):
    """Per-process readings: on/off, and how many processes per GPU get their own series."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(default=True, description="read the GPU processes (pids, memory, job and pod)")
    max_per_gpu: int = Field(default=16, ge=0, le=1024, description="processes per GPU with series of their own")
    server_requests: bool = Field(
        default=True,
        description="ask a GPU job's server for its requests running and waiting (its /metrics on its listening port, "
        "127.0.0.1 only, at most every 15 s: vLLM, SGLang, TGI, Triton); off: a server is never serving_idle",
    )


class CollectorsConfig(BaseModel):
    """Collectors to turn on beyond the defaults, and to turn off (names as in ``gpuwarden collectors``)."""

    model_config = ConfigDict(extra="forbid")
    enable: list[str] = Field(default_factory=list, description="collectors to turn on beyond the defaults")
    disable: list[str] = Field(default_factory=list, description="collectors to turn off")
    disable_defaults: bool = Field(
        default=False, description="turn off every collector on by default (but exporter); enable adds some back"
    )


class CodeEvidenceConfig(BaseModel):
    """Code-level evidence (gpuwarden.insight.code_evidence): py-spy samples of a starved or launch-bound GPU's job."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = Field(
        default=False, description="sample the job's Python stacks with py-spy (needs root or CAP_SYS_PTRACE)"
    )
    seconds: float = Field(default=5.0, ge=1, le=30, description="how long each sampling run lasts")
    rate_hertz: int = Field(default=50, ge=1, le=200, description="samples a second")
    every_seconds: float = Field(default=600.0, ge=60, le=86400, description="at most one run per GPU this often")
    py_spy: str = Field(default="py-spy", min_length=1, description="the py-spy executable (a name on PATH or a path)")


class InsightConfig(BaseModel):
    """Scores and diagnosis: the window of gpu_starved_ratio and the imbalance scores; code evidence."""

    model_config = ConfigDict(extra="forbid")
    window_seconds: float = Field(
        default=300.0, gt=0, le=86400, description="the window of gpu_starved_ratio and the imbalance scores"
    )
    code_evidence: CodeEvidenceConfig = Field(default_factory=CodeEvidenceConfig)
    serving_idle_seconds: float = Field(
        default=300.0,
        ge=15,
        le=86400,
        description="a server whose own /metrics said no request running or waiting for this long is serving_idle",
    )


class Config(BaseModel):
    """Everything ``gpuwarden serve`` can be told; see README's configuration reference. Built from the file, the
    environment and the flags by ``load_config`` (gpuwarden.config.load, through pydantic-settings); ``Config()`` is
    the defaults."""

    model_config = ConfigDict(extra="forbid")

    listen_address: str = Field(default=f"0.0.0.0:{DEFAULT_PORT}", description="HOST:PORT to serve on")
    telemetry_path: str = Field(
        default="/metrics",
        pattern=r"^/[A-Za-z0-9._~-]+(/[A-Za-z0-9._~-]+)*$",
        description="path of the Prometheus exposition",
    )
    web_config_file: Path | None = Field(default=None, description="exporter-toolkit web config (TLS, basic auth)")
    max_connections: int = Field(
        default=1000,
        ge=1,
        le=65536,
        description="open HTTP connections at most; past it the one waiting longest for a request head is closed",
    )
    keep_alive_timeout_seconds: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="an idle keep-alive connection is closed after this many seconds: longer than the scrape interval "
        "(Prometheus's default is 1 m), so each scrape reuses its connection instead of reconnecting",
    )
    request_head_timeout_seconds: float = Field(
        default=10.0, gt=0, le=300, description="a request line and headers must arrive within this many seconds"
    )
    max_request_head_bytes: int = Field(
        default=65536, ge=1024, le=2**24, description="request line and headers larger than this get 431"
    )
    max_unsent_bytes: int = Field(
        default=8 * 2**20,
        ge=2**20,
        le=2**30,
        description="bytes of answers waiting for clients that do not take them, on all connections together; past "
        "it the connection waiting longest is closed",
    )
    send_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="a connection whose answer has waited this many seconds for its client to take it is closed",
    )
    poll_interval_seconds: float = Field(default=1.0, ge=0.05, le=300, description="seconds between polls")
    slow_interval_seconds: float = Field(
        default=SLOW_INTERVAL, ge=1, le=3600, description="energy, ECC, row remap, PCIe width and replay reads"
    )
    gpm_interval_seconds: float = Field(
        default=GPM_INTERVAL,
        ge=0.1,
        le=300,
        description="GPM metrics are averages over this many seconds (at least a poll)",
    )
    stale_after_seconds: float | None = Field(
        default=None, gt=0, description="readiness fails when the last poll is older (default 3 polls, at least 5 s)"
    )
    gpus: list[int] | None = Field(
        default=None, description="NVML indices to watch, a list or comma-separated (default: all)"
    )
    xid_events: bool = Field(default=True, description="count XID errors (NVML events) per GPU")
    processes: ProcessesConfig = Field(default_factory=ProcessesConfig)
    collectors: CollectorsConfig = Field(default_factory=CollectorsConfig)
    insight: InsightConfig = Field(default_factory=InsightConfig)
    replay: Path | None = Field(default=None, description="serve a recorded trace instead of live NVML")
    demo: Literal["workloads", "faults"] | None = Field(
        default=None,
        description="serve a trace shipped in the package instead of live NVML: workloads (six causes of low "
        "utilization in turn on an H100) or faults (ECC errors and XIDs on two H100s that the shipped rules page and "
        "ticket within minutes); true means workloads",
    )
    wait_for_nvml: bool = Field(
        default=False,
        description="when NVML is missing at start, serve gpuwarden_source_up 0 and retry instead of exiting 1",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="log level")
    log_format: Literal["logfmt", "json"] = Field(default="logfmt", description="log line format")
    price_per_gpu_hour: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="what one GPU-hour of this node costs (rent or amortized price), for a model gpu_hour_prices "
        "does not list: exported as gpuwarden_gpu_hour_price, it turns lost GPU-hours into money on the fleet "
        "dashboard, in top and in report",
    )
    gpu_hour_prices: dict[Annotated[str, StringConstraints(min_length=1, max_length=96)],
                          Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(
        default_factory=dict,
        description="what one GPU-hour costs by GPU model, NVML's product name as gpu_info's name shows it "
        "({'NVIDIA H200': 4.5, 'Tesla T4': 0.35}): a GPU of a model listed is priced at its model's, any other at "
        "price_per_gpu_hour (none: not priced); exported as gpuwarden_gpu_hour_price{model}",
    )  # fmt: skip
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$",
                          description="ISO 4217 code of price_per_gpu_hour and gpu_hour_prices")  # fmt: skip
    kubelet_socket: Path | None = Field(
        default=None,
        description="the kubelet's pod-resources socket (/var/lib/kubelet/pod-resources/kubelet.sock): names the "
        "pods, namespaces and containers holding each GPU; none: not asked",
    )
    dra_resource_slices: bool = Field(
        default=False,
        description="with kubelet_socket, map DRA devices (NVIDIA's DRA driver, gpu.nvidia.com) to GPUs by the UUID "
        "this node's ResourceSlices give them, read from the Kubernetes API with the pod's service account (needs "
        "list on resourceslices: the dra component of deploy/kubernetes/components); off: by the driver's gpu-N "
        "names, N the NVML index",
    )
    job_mapping_dir: Path | None = Field(
        default=None,
        description="an HPC job mapping directory (dcgm-exporter's format: a file a GPU, named by its index, holding "
        "the ids of the jobs allocated it, one a line; a Slurm prolog writes it: deploy/slurm): a GPU allocated to a "
        "job and opened by no process counts allocated_idle, not free; none: not read",
    )
    node_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="this node's name, the nodename label of gpu_devices that GpuMissing keys on (it must survive a "
        "restart: in Kubernetes the downward API's spec.nodeName); none: the host name",
    )

    @field_validator("demo", mode="before")
    @classmethod
    def _demo_flag(cls, v: Any) -> Any:
        """Accept ``true``/``false`` (the key's older meaning, and an environment variable's ``1``/``0``) as the
        workloads demo or none."""
        if v is True or (isinstance(v, str) and v.lower() in ("true", "1", "yes", "on")):
            return "workloads"
        if v is False or (isinstance(v, str) and v.lower() in ("false", "0", "no", "off", "")):
            return None
        return v

    @field_validator("gpus", mode="before")
    @classmethod
    def _split_gpus(cls, v: Any) -> Any:
        """Accept ``0,1`` (an environment variable, as ``--gpus 0,1``) as well as a list."""
        if isinstance(v, str):
            parts = [p.strip() for p in v.split(",") if p.strip()]
            if not all(p.isdigit() for p in parts):
                raise ValueError("expects comma-separated GPU indices")
            return [int(p) for p in parts]
        return v

    @field_validator("gpus")
    @classmethod
    def _check_gpus(cls, v: list[int] | None) -> list[int] | None:
        """Refuse a negative index, whatever it was given as (``-1``, ``"-1"``, ``-1.0``: checked once coerced)."""
        if v is not None and any(i < 0 for i in v):
            raise ValueError("GPU indices are 0 or more")
        return v

    @field_validator("listen_address")
    @classmethod
    def _check_address(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError("must be HOST:PORT with a port in 0-65535")
        return v

    @property
    def host(self) -> str:
        """The host part of listen_address (brackets of an IPv6 literal removed)."""
        return self.listen_address.rpartition(":")[0].strip("[]") or "0.0.0.0"

    @property
    def port(self) -> int:
        """The port part of listen_address."""
        return int(self.listen_address.rpartition(":")[2])

    @property
    def stale_after(self) -> float:
        """Seconds after which the last poll is stale: stale_after_seconds, else max(3 polls, 5 s)."""
        return self.stale_after_seconds or max(3 * self.poll_interval_seconds, 5.0)
