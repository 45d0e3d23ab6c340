"""``gpuwarden serve``: run the daemon, poll the GPUs and serve /metrics until SIGINT or SIGTERM.

Every flag that sets a configuration key is one row of ``FLAGS``: the parser, the help text (the key's description
and default, from ``Config``) and the overrides handed to ``load_config`` all come from it.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwarden.commands import COMMANDS, EXIT_USAGE, HUP_PENDING, Subparsers, die

if TYPE_CHECKING:
    from gpuwarden.config import Config


def _gpus(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise ValueError(f"--gpus expects comma-separated indices, got {text!r}") from exc


@dataclass(frozen=True)
class Flag:
    """One ``serve`` flag that sets configuration key ``key`` (a ``Config`` field).

    ``names``: its spellings: the first is the one shown in ``--help`` (Prometheus's style: ``namespace.name``,
    words joined by ``-``), the others are older names still accepted and not shown; ``kind``: ``float``/``str``
    for a value, ``bool`` for a switch that sets ``value`` when given; ``convert`` turns the given text into the
    key's value (raises ValueError); ``nested``: the sub-key for a section (``processes.enabled``); ``help``:
    overrides the key's description.
    """

    names: tuple[str, ...]
    key: str
    kind: type = str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    value: object = True
    const: str | None = None  # the value of the flag given without one (``--demo``: workloads)
    convert: Callable[[str], object] | None = None
    nested: str | None = None
    help: str | None = None

    @property
    def dest(self) -> str:
        """The argparse destination: the configuration key, or ``key_nested``."""
        return f"{self.key}_{self.nested}" if self.nested else self.key

    def override(self, given: object) -> tuple[str, object]:
        """Return (config key, value) for the parsed ``given``; raises ValueError from ``convert``."""
        value = self.value if self.kind is bool else (self.convert(str(given)) if self.convert else given)
        return self.key, ({self.nested: value} if self.nested else value)


#: Every flag that sets a configuration key (the collector switches are generated from gpuwarden.catalog.COLLECTORS).
FLAGS: tuple[Flag, ...] = (
    Flag(("--web.listen-address",), "listen_address", metavar="HOST:PORT"),
    Flag(("--web.telemetry-path",), "telemetry_path", metavar="PATH"),
    Flag(("--web.config.file",), "web_config_file", metavar="FILE"),
    Flag(("--poll.interval", "--poll-interval"), "poll_interval_seconds", float, metavar="S"),
    Flag(("--poll.slow-interval", "--slow-interval"), "slow_interval_seconds", float, metavar="S"),
    Flag(("--poll.gpm-interval", "--gpm-interval"), "gpm_interval_seconds", float, metavar="S"),
    Flag(("--gpus",), "gpus", metavar="I,J", convert=_gpus),
    Flag(("--no-processes",), "processes", bool, value=False, nested="enabled", help="do not read GPU processes"),
    Flag(("--replay",), "replay", metavar="FILE"),
    Flag(
        ("--demo",),
        "demo",
        metavar="SCENE",
        choices=("workloads", "faults"),
        const="workloads",
        help="serve a recorded node without a GPU: workloads (the default: six causes of low utilization in turn) "
        "or faults (ECC errors and XIDs the shipped rules page and ticket within minutes; docs/prometheus.md)",
    ),
    Flag(("--log.level", "--log-level"), "log_level", choices=("debug", "info", "warning", "error")),
    Flag(("--log.format",), "log_format", choices=("logfmt", "json")),
    Flag(("--nvml.wait", "--wait-for-nvml"), "wait_for_nvml", bool),
)


def _help(flag: Flag) -> str:
    """The flag's help: its own, or the key's description and default from the Config model."""
    if flag.help:
        return flag.help
    from gpuwarden.config import Config

    field = Config.model_fields[flag.key]
    if flag.kind is bool:
        return f"{field.description or flag.key} (config key {flag.key})"
    default = "all" if field.default is None and flag.key == "gpus" else field.default
    return f"{field.description or flag.key} (default {default}; config key {flag.key})"


def add_parser(subparsers: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``serve`` on ``subparsers`` (from ``ArgumentParser.add_subparsers``) and return its parser."""
    from gpuwarden.catalog import COLLECTORS

    s = subparsers.add_parser("serve", help=COMMANDS["serve"].help,
                              description="Poll the node's NVIDIA GPUs through NVML and serve their metrics for "
                              "Prometheus (/metrics), the diagnosis (/api/v1/diagnosis) and the node page. Flags "
                              "override the configuration file; --demo serves a recorded node without a "
                              "GPU.")  # fmt: skip
    s.add_argument("--config.file", dest="config", metavar="FILE", help="YAML configuration file")
    s.add_argument("--config", dest="config", metavar="FILE", help=argparse.SUPPRESS)  # the older name
    for flag in FLAGS:
        for i, name in enumerate(flag.names):  # the older names work, and --help shows only the first
            shown = _help(flag) if i == 0 else argparse.SUPPRESS
            if flag.kind is bool:
                s.add_argument(name, dest=flag.dest, action="store_true", default=None, help=shown)
            elif flag.const is not None:
                s.add_argument(name, dest=flag.dest, nargs="?", const=flag.const, metavar=flag.metavar,
                               choices=flag.choices, help=shown)  # fmt: skip
            else:
                s.add_argument(
                    name, dest=flag.dest, type=flag.kind, metavar=flag.metavar, choices=flag.choices, help=shown
                )
    s.add_argument(
        "--collector.disable-defaults",
        dest="collectors_disable_defaults",
        action="store_true",
        help="turn off every collector that is on by default (but exporter); turn some back on with --collector.NAME",
    )
    for name, spec in sorted(COLLECTORS.items()):
        s.add_argument(
            f"--collector.{name}",
            dest=f"collector_{name}",
            action=argparse.BooleanOptionalAction,  # also --no-collector.NAME, as node_exporter spells them
            default=None,
            help=f"{spec.help} (default: {'on' if spec.enabled_by_default else 'off'})",
        )
    return s


def overrides(args: argparse.Namespace) -> dict[str, object]:
    """Return the config keys given as flags (flags not given are left out); raises ValueError for a bad value."""
    from gpuwarden.catalog import COLLECTORS

    out: dict[str, object] = {}
    for flag in FLAGS:
        given = getattr(args, flag.dest, None)
        if given is not None:
            key, value = flag.override(given)
            out[key] = value
    enable = [n for n in COLLECTORS if getattr(args, f"collector_{n}", None) is True]
    disable = [n for n in COLLECTORS if getattr(args, f"collector_{n}", None) is False]
    if enable or disable or args.collectors_disable_defaults:
        out["collectors"] = {
            "enable": enable,
            "disable": disable,
            "disable_defaults": bool(args.collectors_disable_defaults),
        }
    return out


def load(args: argparse.Namespace) -> Config:
    """Return the configuration: ``--config`` FILE (if given) under the environment and the flags' overrides
    (gpuwarden.config.load_config); raises ConfigError."""
    from gpuwarden.config import load_config

    return load_config(Path(args.config) if args.config else None, overrides(args))


def _node_name_problem(cfg: Any) -> str | None:
    """Why the node's default name is no stable ``nodename`` (gpuwarden.config.nodename), when it reads real GPUs
    under it; None when ``node_name`` is set, for a replay or the demo, or when the host name is stable."""
    if cfg.node_name or cfg.demo or cfg.replay:
        return None
    import os
    import socket

    from gpuwarden.config.nodename import unstable_name

    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            mountinfo = f.read(1 << 20)
    except OSError:
        mountinfo = ""
    return unstable_name(socket.gethostname(), os.environ, mountinfo)


def run(args: argparse.Namespace) -> int:
    """Run the daemon until SIGINT/SIGTERM: 0 then, 2 for a bad configuration, 1 when it cannot bind or open the
    source (one line on stderr)."""
    from gpuwarden import __version__
    from gpuwarden.config import ConfigError
    from gpuwarden.daemon import Daemon, bind
    from gpuwarden.source import SourceError
    from gpuwarden.web.server.listener import StartupError

    try:
        cfg = load(args)
        if problem := _node_name_problem(cfg):
            return die(f"GpuMissing could not work: {problem}", EXIT_USAGE)
        # a bad web config raises WebConfigError, a ConfigError
        daemon = Daemon(cfg, reload=lambda: load(args), hup_pending=HUP_PENDING)
    except (ConfigError, ValueError) as exc:
        return die(str(exc), EXIT_USAGE)
    from gpuwarden.logs import setup

    setup(cfg.log_level, cfg.log_format)
    try:
        sock = bind(cfg)
    except StartupError as exc:
        return die(str(exc))
    try:
        daemon.start()
    except SourceError as exc:
        sock.close()
        hint = ""
        if daemon.poller.source.kind == "nvml" and "NVML unavailable" in str(exc):
            hint = " (no GPU here? 'gpuwarden serve --demo' replays a recorded node)"
        return die(f"{exc}{hint}")
    snap = daemon.poller.snapshot
    assert snap is not None  # start() took the first poll
    host = cfg.listen_address.rpartition(":")[0] or "0.0.0.0"
    logging.getLogger("gpuwarden").info(
        "serving",
        extra={
            "version": __version__,
            "gpus": len(snap.static.gpus),
            "source": daemon.poller.source.kind,
            "url": f"{daemon.scheme}://{host}:{cfg.port}{cfg.telemetry_path}",
        },
    )
    daemon.serve(sock)
    return 0
