"""``load_config``: the Config from a YAML file, the environment and the flags, through pydantic-settings.

Precedence (highest first): command-line flags, ``GPUWARDEN_*`` environment variables (nested keys with ``__``,
e.g. ``GPUWARDEN_PROCESSES__MAX_PER_GPU``), the YAML file given by ``--config.file``, the defaults. Unknown keys,
unknown ``GPUWARDEN_*`` variables and bad values are refused with one line naming the key (``ConfigError``).
"""

from __future__ import annotations

import os
import re
from contextvars import ContextVar
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, ValidationError
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

from gpuwarden.catalog import select_collectors
from gpuwarden.config.files import read_yaml
from gpuwarden.config.model import DEFAULT_PORT, Config, ConfigError

#: The YAML file of the Config being loaded (set by load_config for the duration of one load).
_CONFIG_FILE: ContextVar[Path | None] = ContextVar("gpuwarden_config_file", default=None)


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


class _Settings(BaseSettings, Config):
    """Config's fields and checks, filled from the flags (init), the environment, then the YAML file."""

    model_config = SettingsConfigDict(env_prefix="GPUWARDEN_", env_nested_delimiter="__", extra="forbid")

    gpus: Annotated[list[int] | None, NoDecode] = Field(
        default=None, description="NVML indices to watch, a list or comma-separated (default: all)"
    )

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


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Return the Config from ``path`` (optional), the environment and ``overrides`` (flags).

    Raises ConfigError with one line such as ``poll_interval_seconds: Input should be greater than or equal
    to 0.05`` or ``unknown key 'pol_interval'``. Collector names are checked against the registry.
    """
    _check_environment()
    cfg = _combined(path, overrides or {})
    try:
        select_collectors(cfg.collectors.enable, cfg.collectors.disable, cfg.collectors.disable_defaults)
    except ValueError as exc:
        raise ConfigError(f"collectors: {exc}") from exc
    return _checked_together(cfg)


def _combined(path: Path | None, overrides: dict[str, Any]) -> Config:
    """The file at ``path``, the environment and ``overrides``, each key validated (pydantic-settings). Raises
    ConfigError with one line."""
    token = _CONFIG_FILE.set(path)
    try:
        settings = _Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_one_line(exc, path, overrides)) from exc
    except SettingsError as exc:  # an environment variable that is not valid JSON for a list or mapping key
        raise ConfigError(_settings_error(exc)) from exc
    except RecursionError as exc:  # JSON nested thousands deep in an environment variable
        raise ConfigError("an environment variable GPUWARDEN_* holds JSON nested too deeply") from exc
    finally:
        _CONFIG_FILE.reset(token)
    return Config.model_validate(settings.model_dump(exclude_unset=True))


def _checked_together(cfg: Config) -> Config:
    """``cfg`` once the keys that depend on each other agree (the metrics path free, one source, code evidence and
    GPU selection only on live NVML, readiness not failing between polls), the demo on the loopback address unless
    one was given. Raises ConfigError with one line."""
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
