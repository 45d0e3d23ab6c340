"""The validated configuration: a YAML file, overridden by environment variables, overridden by flags.

Precedence (highest first): command-line flags, ``GPUWARDEN_*`` environment variables (nested keys with
``__``, e.g. ``GPUWARDEN_PROCESSES__MAX_PER_GPU``), the YAML file given by ``--config.file``, the defaults.
Unknown keys and bad values are refused with one line naming the key (``ConfigError``).
"""

from __future__ import annotations

import os
import re
import stat
from contextvars import ContextVar
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

from gpuwarden.catalog import select_collectors

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


class CollectorsConfig(BaseModel):
    """Collectors to turn on beyond the defaults, and to turn off (names as in ``gpuwarden collectors``)."""

    model_config = ConfigDict(extra="forbid")
    enable: list[str] = Field(default_factory=list, description="collectors to turn on beyond the defaults")
    disable: list[str] = Field(default_factory=list, description="collectors to turn off")
    disable_defaults: bool = Field(
        default=False, description="turn off every collector on by default (but exporter); enable adds some back"
    )


class CodeEvidenceConfig(BaseModel):
    """Code-level evidence (gpuwarden.code_evidence): py-spy samples of a starved or launch-bound GPU's job."""

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


class _YamlFile(YamlConfigSettingsSource):
    """pydantic-settings' YAML source, reading the file through ``read_yaml`` (one-line errors, text keys only)."""

    @staticmethod
    def _existing_files(files: Any) -> list[Path | Traversable]:
        # every file given is read: a missing or special file is an error, never an empty configuration
        if files is None:
            return []
        return [Path(str(f)) for f in (files if isinstance(files, list | tuple) else [files])]

    def _read_file(self, file_path: Path | Traversable) -> dict[str, Any]:
        return read_yaml(Path(str(file_path)))


class Config(BaseSettings):
    """Everything ``gpuwarden serve`` can be told; see README's configuration reference."""

    model_config = SettingsConfigDict(env_prefix="GPUWARDEN_", env_nested_delimiter="__", extra="forbid")

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
    gpus: Annotated[list[int] | None, NoDecode] = Field(
        default=None, description="NVML indices to watch, a list or comma-separated (default: all)"
    )
    xid_events: bool = Field(default=True, description="count XID errors (NVML events) per GPU")
    processes: ProcessesConfig = Field(default_factory=ProcessesConfig)
    collectors: CollectorsConfig = Field(default_factory=CollectorsConfig)
    insight: InsightConfig = Field(default_factory=InsightConfig)
    replay: Path | None = Field(default=None, description="serve a recorded trace instead of live NVML")
    demo: bool = Field(default=False, description="serve the trace shipped in the package")
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
        description="what one GPU-hour of this node costs (rent or amortized price): exported as "
        "gpuwarden_gpu_hour_price, it turns lost GPU-hours into money on the fleet dashboard, in top and in report",
    )
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$", description="ISO 4217 code of price_per_gpu_hour")
    kubelet_socket: Path | None = Field(
        default=None,
        description="the kubelet's pod-resources socket (/var/lib/kubelet/pod-resources/kubelet.sock): names the "
        "pods, namespaces and containers holding each GPU; none: not asked",
    )
    dra_resource_slices: bool = Field(
        default=False,
        description="with kubelet_socket, map DRA devices (NVIDIA's DRA driver, gpu.nvidia.com) to GPUs by the UUID "
        "this node's ResourceSlices give them, read from the Kubernetes API with the pod's service account (needs "
        "list on resourceslices: deploy/kubernetes/dra-rbac.yaml); off: by the driver's gpu-N names, N the NVML index",
    )
    node_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="this node's name, the nodename label of gpu_devices that GpuMissing keys on (it must survive a "
        "restart: in Kubernetes the downward API's spec.nodeName); none: the host name",
    )

    @field_validator("gpus", mode="before")
    @classmethod
    def _split_gpus(cls, v: Any) -> Any:
        """Accept ``0,1`` (an environment variable, as ``--gpus 0,1``) as well as a list."""
        if isinstance(v, str):
            parts = [p.strip() for p in v.split(",") if p.strip()]
            if not all(p.isdigit() for p in parts):
                raise ValueError("expects comma-separated GPU indices")
            return [int(p) for p in parts]
        if isinstance(v, list) and any(isinstance(i, int) and i < 0 for i in v):
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

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Order the sources: flags (init), then environment, then the YAML file."""
        path = _CONFIG_FILE.get()
        files = (_YamlFile(settings_cls, yaml_file=path),) if path is not None else ()
        return init_settings, env_settings, *files


#: The YAML file of the Config being loaded (set by load_config for the duration of one load).
_CONFIG_FILE: ContextVar[Path | None] = ContextVar("gpuwarden_config_file", default=None)


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader refusing a mapping that names a key twice (it would keep the last one silently: a
    second ``basic_auth_users`` would replace the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: the text-key check refuses it later
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


#: A configuration or web config file larger than this is refused (they are a few hundred bytes).
MAX_CONFIG_BYTES = 1 << 20


def open_regular(path: Path | str) -> int | None:
    """Open ``path`` for reading without blocking and return its descriptor, or None (closed) when it is not a
    regular file: a FIFO would block a plain open until a writer comes, and a read for ever; a device such as
    /dev/zero never ends. Raises OSError when it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    os.close(fd)
    return None


def read_small_file(path: Path, limit: int, error: type[Exception]) -> str:
    """Return the UTF-8 text of the regular file ``path`` of at most ``limit`` bytes.

    Raises ``error`` (one line) for a file that cannot be read, is not a regular file (``open_regular``), is larger
    than ``limit`` or is not UTF-8.
    """
    try:
        fd = open_regular(path)
        if fd is None:
            raise error(f"{path}: not a regular file")
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if len(data) > limit:
        raise error(f"{path}: larger than {limit} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start})") from exc


def read_yaml(path: Path) -> dict[str, Any]:
    """Return the mapping in the YAML file ``path``. Raises ConfigError (unreadable, invalid, not a mapping)."""
    text = read_small_file(path, MAX_CONFIG_BYTES, ConfigError)
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError as exc:
        raise ConfigError(f"{path}: invalid YAML: nested too deeply") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        detail = str(getattr(exc, "problem", None) or exc).splitlines()[0]
        raise ConfigError(f"{path}: invalid YAML{where}: {detail}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys to values")
    _check_keys(path, data)
    return data


def _check_keys(path: Path, data: Any) -> None:
    """Raise ConfigError when a mapping in ``data`` has a key that is not text (YAML allows ``1:`` or ``null:``).

    Walks iteratively and visits each container once: YAML anchors can make ``data`` refer to itself.
    """
    seen: set[int] = set()
    stack = [data]
    while stack:
        item = stack.pop()
        if not isinstance(item, dict | list) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            for key, value in item.items():
                if not isinstance(key, str):
                    raise ConfigError(f"{path}: every key must be text, found {key!r}")
                stack.append(value)
        else:
            stack.extend(item)


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Return the Config from ``path`` (optional), the environment and ``overrides`` (flags).

    Raises ConfigError with one line such as ``poll_interval_seconds: Input should be greater than or equal
    to 0.05`` or ``unknown key 'pol_interval'``. Collector names are checked against the registry.
    """
    _check_environment()
    token = _CONFIG_FILE.set(path)
    try:
        cfg = Config(**(overrides or {}))
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, path, overrides or {})) from exc
    except SettingsError as exc:  # an environment variable that is not valid JSON for a list or mapping key
        raise ConfigError(_settings_error(exc)) from exc
    except RecursionError as exc:  # JSON nested thousands deep in an environment variable
        raise ConfigError("an environment variable GPUWARDEN_* holds JSON nested too deeply") from exc
    finally:
        _CONFIG_FILE.reset(token)
    try:
        select_collectors(cfg.collectors.enable, cfg.collectors.disable, cfg.collectors.disable_defaults)
    except ValueError as exc:
        raise ConfigError(f"collectors: {exc}") from exc
    taken = ("/healthz", "/readyz", "/docs", "/redoc", "/openapi.json")
    if cfg.telemetry_path in taken or cfg.telemetry_path.startswith("/api/"):
        raise ConfigError(f"telemetry_path: {cfg.telemetry_path} is taken by another endpoint")
    if cfg.replay is not None and cfg.demo:
        raise ConfigError("replay and demo exclude each other: give one")
    if cfg.demo and "listen_address" not in cfg.model_fields_set:
        # the demo is for a look on this machine: the network sees it only where asked (--web.listen-address)
        cfg = cfg.model_copy(update={"listen_address": f"127.0.0.1:{DEFAULT_PORT}"})
    if cfg.insight.code_evidence.enabled and (cfg.replay is not None or cfg.demo):
        raise ConfigError(
            "insight.code_evidence samples live processes: it cannot apply to a replay or the demo (their PIDs are "
            "the recording machine's)"
        )
    if cfg.gpus is not None and (cfg.replay is not None or cfg.demo):
        raise ConfigError("gpus selects NVML devices: it cannot apply to a replay or the demo (they serve the trace's)")
    stale = cfg.stale_after_seconds
    if stale is not None and stale < 2 * cfg.poll_interval_seconds:
        raise ConfigError(
            f"stale_after_seconds ({stale:g}) must be at least 2 poll intervals ({2 * cfg.poll_interval_seconds:g} s): "
            "readiness would fail between polls"
        )
    return cfg


#: ``GPUWARDEN_*`` variables that are not configuration keys: the systemd unit passes its flags in GPUWARDEN_ARGS
#: (deploy/systemd/gpuwarden.env).
NOT_CONFIG_VARIABLES = frozenset({"GPUWARDEN_ARGS"})
#: The variables Kubernetes gives every pod for a Service named gpuwarden in its namespace (service links).
_SERVICE_LINK = re.compile(
    r"^GPUWARDEN_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT(_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)?)$"
)


def _check_environment() -> None:
    """Raise ConfigError naming a ``GPUWARDEN_*`` environment variable that is no configuration key (a typo would
    otherwise be ignored while unknown keys in the file are refused)."""
    for name in sorted(os.environ):
        upper = name.upper()
        if not upper.startswith("GPUWARDEN_") or upper in NOT_CONFIG_VARIABLES or _SERVICE_LINK.match(upper):
            continue
        parts = name[len("GPUWARDEN_") :].lower().split("__")
        model: Any = Config
        for part in parts:
            fields = getattr(model, "model_fields", None)
            if fields is None or part not in fields:
                raise ConfigError(f"unknown environment variable {name} (no configuration key {'.'.join(parts)})")
            model = fields[part].annotation
            model = next((a for a in getattr(model, "__args__", ()) if hasattr(a, "model_fields")), model)


def env_name(loc: tuple[str | int, ...]) -> str | None:
    """Return the environment variable that set the key at ``loc`` (``GPUWARDEN_A__B``), None if none is set."""
    for depth in range(len(loc), 0, -1):
        name = "GPUWARDEN_" + "__".join(str(p) for p in loc[:depth]).upper()
        if any(k.upper() == name for k in os.environ):
            return name
    return None


def _settings_error(exc: SettingsError) -> str:
    msg = str(exc).splitlines()[0]
    for name in Config.model_fields:
        if f'field "{name}"' in msg:
            var = env_name((name,)) or f"GPUWARDEN_{name.upper()}"
            return f"environment variable {var}: not a valid value for {name}"
    return msg


def _one_line(exc: ValidationError, path: Path | None, overrides: dict[str, Any]) -> str:
    err = exc.errors()[0]
    loc = tuple(err["loc"])
    key = ".".join(str(p) for p in loc)
    var = env_name(loc) if loc and loc[0] not in overrides else None
    if var is not None:
        prefix = f"environment variable {var}: "
    elif loc and loc[0] in overrides:
        prefix = ""
    else:
        prefix = f"{path}: " if path is not None else ""
    if err["type"] == "extra_forbidden":
        return f"{prefix}unknown key {key!r}"
    value = err.get("input")
    text = repr(value)
    text = text[:60] + "..." if len(text) > 60 else text
    shown = f" (got {text})" if isinstance(value, str | int | float | bool) else ""
    return f"{prefix}{key}: {err['msg']}{shown}"
