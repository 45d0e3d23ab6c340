"""The validated configuration: a YAML file, overridden by environment variables, overridden by flags.

Precedence (highest first): command-line flags, ``GPUWARDEN_*`` environment variables (nested keys with
``__``, e.g. ``GPUWARDEN_PROCESSES__MAX_PER_GPU``), the YAML file given by ``--config.file``, the defaults.
Unknown keys and bad values are refused with one line naming the key (``ConfigError``).

``model`` holds the keys (``Config``), ``files`` the safe reading of small YAML files, ``load`` the loading through
pydantic-settings, ``example`` the example file written from the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuwarden.config.files import MAX_CONFIG_BYTES, open_regular, read_small_file, read_yaml
from gpuwarden.config.model import (
    DEFAULT_PORT,
    GPM_INTERVAL,
    SLOW_INTERVAL,
    CodeEvidenceConfig,
    CollectorsConfig,
    Config,
    ConfigError,
    InsightConfig,
    ProcessesConfig,
)

__all__ = [
    "DEFAULT_PORT",
    "GPM_INTERVAL",
    "MAX_CONFIG_BYTES",
    "SLOW_INTERVAL",
    "CodeEvidenceConfig",
    "CollectorsConfig",
    "Config",
    "ConfigError",
    "InsightConfig",
    "ProcessesConfig",
    "load_config",
    "open_regular",
    "read_small_file",
    "read_yaml",
]


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Return the Config from the YAML file ``path`` (optional), the ``GPUWARDEN_*`` environment and ``overrides``
    (the flags' keys): gpuwarden.config.load, imported here when a command loads a configuration (pydantic-settings
    stays out of the commands that read none).

    Raises ConfigError with one line such as ``poll_interval_seconds: Input should be greater than or equal to
    0.05`` or ``unknown key 'pol_interval'``; collector names are checked against the registry.
    """
    from gpuwarden.config.load import load_config as load

    return load(path, overrides)
