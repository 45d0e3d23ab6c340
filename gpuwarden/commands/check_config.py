"""``gpuwarden check-config FILE``: validate a configuration file and print the effective configuration."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuwarden.commands import COMMANDS, EXIT_USAGE, Subparsers, die


def add_parser(subparsers: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``check-config`` on ``subparsers`` and return its parser."""
    p = subparsers.add_parser("check-config", help=COMMANDS["check-config"].help,
                              description="Validate a configuration file as serve would read it and print the "
                              "configuration it gives (defaults filled in); exit 2 with one line when it is "
                              "wrong.")  # fmt: skip
    p.add_argument("file", help="the YAML configuration file (e.g. /etc/gpuwarden/config.yml)")
    return p


def yaml_dump(data: object) -> str:
    """Return ``data`` as block-style YAML."""
    import yaml

    return yaml.safe_dump(data, sort_keys=False).rstrip()


def run(args: argparse.Namespace) -> int:
    """Print ``FILE: OK`` and the effective configuration (0), or one line and 2 for what ``serve`` would refuse:
    the file, its web config file, its replay trace."""
    from gpuwarden.config import ConfigError, load_config

    try:
        cfg = load_config(Path(args.file))
        if cfg.web_config_file is not None:
            from gpuwarden.web.config import load_web_config

            load_web_config(cfg.web_config_file)
        if cfg.replay is not None:  # what serve would refuse at start
            from gpuwarden.trace import TraceError, read_trace_losses

            try:
                read_trace_losses(cfg.replay)
            except TraceError as exc:
                raise ConfigError(f"replay: {exc}") from exc
    except ConfigError as exc:
        return die(str(exc), EXIT_USAGE)
    print(f"{args.file}: OK")
    print(yaml_dump(cfg.model_dump(mode="json")))
    return 0
