"""The ``gpuwarden`` command: serve, record, diagnose, check-config."""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from pathlib import Path

from gpuwarden import __version__
from gpuwarden.source import SourceError

EXIT_USAGE = 2
EXIT_RUNTIME = 1


def _die(msg: str, code: int = EXIT_RUNTIME) -> int:
    print(f"gpuwarden: {msg}", file=sys.stderr)
    return code


def _meta(values: list[str]) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key:
            raise ValueError(f"--meta expects KEY=VALUE, got {v!r}")
        out[key] = val
    return out


def cmd_record(args: argparse.Namespace) -> int:
    """Record a trace from live NVML."""
    from gpuwarden.nvml import NvmlSource
    from gpuwarden.record import record

    try:
        meta = _meta(args.meta)
    except ValueError as exc:
        return _die(str(exc), EXIT_USAGE)
    for flag, value, low, high in (
        ("--duration", args.duration, 0.05, 7 * 86400.0),
        ("--interval", args.interval, 0.05, 300.0),
        ("--slow-interval", args.slow_interval, 1.0, 3600.0),
    ):
        if not (math.isfinite(value) and low <= value <= high):
            return _die(f"{flag} must be a number of seconds from {low:g} to {high:g}, got {value!r}", EXIT_USAGE)
    out = Path(args.out)
    if out.exists() and not args.force:
        return _die(f"{out} exists: give another --out, or --force to overwrite it", EXIT_USAGE)
    # a trace is for analysis and replay: GPM and the util.gpu sample buffer at every poll, whatever they cost
    source = NvmlSource(
        slow_interval=args.slow_interval,
        gpm_interval=0.0,
        samples_min_gap=0.0,
        host_min_gap=0.0,
        processes=not args.no_processes,
    )
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    bar = Progress(
        TextColumn(f"recording {out.name}"),
        BarColumn(),
        TextColumn("{task.fields[polls]} polls"),
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,  # a log file or a pipe gets the last line only
    )
    task = bar.add_task("record", total=args.duration, polls=0)
    try:
        with bar:
            result = record(
                source,
                out,
                args.duration,
                args.interval,
                meta,
                progress=lambda polls, seconds: bar.update(task, completed=seconds, polls=polls),
            )
    except SourceError as exc:
        return _die(str(exc))
    except OSError as exc:
        return _die(f"cannot write {args.out}: {exc.strerror or exc}")
    if result.error is not None:  # a full disk: the polls written before it are readable
        return _die(f"{args.out}: {result.error}; {result.polls} complete polls kept")
    how = f" (stopped by {result.stopped_by})" if result.stopped_by else ""
    print(f"recorded {result.polls} polls to {args.out}{how}", file=sys.stderr)
    return 0


def _serve_overrides(args: argparse.Namespace) -> dict[str, object]:
    """Return the config keys given as flags (flags that were not given are left out)."""
    from gpuwarden.catalog import COLLECTORS

    out: dict[str, object] = {}
    simple = {
        "listen_address": args.listen_address,
        "telemetry_path": args.telemetry_path,
        "web_config_file": args.web_config_file,
        "poll_interval_seconds": args.poll_interval,
        "slow_interval_seconds": args.slow_interval,
        "gpm_interval_seconds": args.gpm_interval,
        "replay": args.replay,
        "log_level": args.log_level,
        "log_format": args.log_format,
    }
    out.update({k: v for k, v in simple.items() if v is not None})
    if args.demo:
        out["demo"] = True
    if args.wait_for_nvml:
        out["wait_for_nvml"] = True
    if args.gpus is not None:
        try:
            out["gpus"] = [int(x) for x in args.gpus.split(",") if x.strip()]
        except ValueError as exc:
            raise ValueError(f"--gpus expects comma-separated indices, got {args.gpus!r}") from exc
    if args.no_processes:
        out["processes"] = {"enabled": False}
    enable = [n for n in COLLECTORS if getattr(args, f"collector_{n}", None) is True]
    disable = [n for n in COLLECTORS if getattr(args, f"collector_{n}", None) is False]
    if enable or disable or args.collectors_disable_defaults:
        out["collectors"] = {
            "enable": enable,
            "disable": disable,
            "disable_defaults": bool(args.collectors_disable_defaults),
        }
    return out


def _load(args: argparse.Namespace):  # noqa: ANN202 - returns Config
    from gpuwarden.config import load_config

    return load_config(Path(args.config) if args.config else None, _serve_overrides(args))


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon until SIGINT/SIGTERM."""
    import signal
    import threading

    # First of all: a SIGHUP (systemctl reload) while the daemon starts is noted and applied once it serves,
    # instead of ending the process (the signal's default).
    hup_pending = threading.Event()
    signal.signal(signal.SIGHUP, lambda sig, frame: hup_pending.set())
    from gpuwarden.config import ConfigError
    from gpuwarden.daemon import Daemon, StartupError, bind

    try:
        cfg = _load(args)
        # a bad web config raises WebConfigError, a ConfigError
        daemon = Daemon(cfg, reload=lambda: _load(args), hup_pending=hup_pending)
    except (ConfigError, ValueError) as exc:
        return _die(str(exc), EXIT_USAGE)
    from gpuwarden.logs import setup

    setup(cfg.log_level, cfg.log_format)
    try:
        sock = bind(cfg)
    except StartupError as exc:
        return _die(str(exc))
    try:
        daemon.start()
    except SourceError as exc:
        sock.close()
        return _die(str(exc))
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


def cmd_check_config(args: argparse.Namespace) -> int:
    """Validate a configuration file and print the effective configuration."""
    from gpuwarden.config import ConfigError, load_config

    try:
        cfg = load_config(Path(args.file))
        if cfg.web_config_file is not None:
            from gpuwarden.webconfig import load_web_config

            load_web_config(cfg.web_config_file)
        if cfg.replay is not None:  # what serve would refuse at start
            from gpuwarden.trace import TraceError, read_trace_losses

            try:
                read_trace_losses(cfg.replay)
            except TraceError as exc:
                raise ConfigError(f"replay: {exc}") from exc
    except ConfigError as exc:
        return _die(str(exc), EXIT_USAGE)
    print(f"{args.file}: OK")
    print(yaml_dump(cfg.model_dump(mode="json")))
    return 0


def yaml_dump(data: object) -> str:
    """Return ``data`` as block-style YAML."""
    import yaml

    return yaml.safe_dump(data, sort_keys=False).rstrip()


def cmd_collectors(args: argparse.Namespace) -> int:
    """List the collectors, their default state and what they export."""
    from gpuwarden.catalog import COLLECTORS

    for name, spec in sorted(COLLECTORS.items()):
        print(f"{name:14s} {'on ' if spec.enabled_by_default else 'off'}  {spec.help}")
    return 0


#: ``record`` reads the slow readings (energy, ECC, PCIe width and replays) every 10 s by default, more often than
#: ``serve`` (gpuwarden.config.SLOW_INTERVAL): a trace is for analysis, and its size barely changes.
RECORD_SLOW_INTERVAL = 10.0


def _setting_help(key: str) -> str:
    """The help of the flag for configuration key ``key``: its description and default, from the Config model."""
    from gpuwarden.config import Config

    field = Config.model_fields[key]
    default = "all" if field.default is None and key == "gpus" else field.default
    return f"{field.description or key} (default {default}; config key {key})"


def _version() -> str:
    """``gpuwarden --version``: the version and the build's runtime (Python, nvidia-ml-py, prometheus-client, and the
    NVIDIA driver where one answers)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    driver = "none found"
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            raw = pynvml.nvmlSystemGetDriverVersion()
            driver = raw.decode() if isinstance(raw, bytes) else str(raw)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no library: say so, never fail --version
        pass
    return (
        f"gpuwarden {__version__}\n  python: {platform.python_version()}\n  nvidia-ml-py: {installed('nvidia-ml-py')}"
        f"\n  prometheus-client: {installed('prometheus-client')}\n  NVIDIA driver: {driver}"
    )


class _VersionAction(argparse.Action):
    """``--version``: print ``_version()`` (computed only when asked: it may load NVML) and exit 0."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=str(kwargs.get("help", "")))

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: object, values: object, option: object = None
    ) -> None:
        print(_version())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of every subcommand."""
    p = argparse.ArgumentParser(prog="gpuwarden", description="NVIDIA GPU monitoring daemon and Prometheus exporter")
    p.add_argument("--version", action=_VersionAction, help="print the version and the runtime, then exit")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the daemon: poll the GPUs and serve /metrics")
    s.add_argument("--config", metavar="FILE", help="YAML configuration file")
    s.add_argument(
        "--web.listen-address",
        dest="listen_address",
        metavar="HOST:PORT",
        help=_setting_help("listen_address"),
    )
    s.add_argument(
        "--web.telemetry-path", dest="telemetry_path", metavar="PATH", help=_setting_help("telemetry_path")
    )
    s.add_argument(
        "--web.config.file",
        dest="web_config_file",
        metavar="FILE",
        help="exporter-toolkit web config: TLS and basic auth",
    )
    s.add_argument("--poll-interval", type=float, metavar="S", help=_setting_help("poll_interval_seconds"))
    s.add_argument("--slow-interval", type=float, metavar="S", help=_setting_help("slow_interval_seconds"))
    s.add_argument("--gpm-interval", type=float, metavar="S", help=_setting_help("gpm_interval_seconds"))
    s.add_argument("--gpus", metavar="I,J", help=_setting_help("gpus"))
    s.add_argument("--no-processes", action="store_true", help="do not read GPU processes")
    s.add_argument("--replay", metavar="FILE", help="serve a recorded trace (looping) instead of live NVML")
    s.add_argument("--demo", action="store_true", help="serve the real trace shipped in the package (no GPU needed)")
    s.add_argument(
        "--log.level", "--log-level", dest="log_level", choices=["debug", "info", "warning", "error"],
        help=_setting_help("log_level"),
    )
    s.add_argument("--log.format", dest="log_format", choices=["logfmt", "json"], help=_setting_help("log_format"))
    s.add_argument(
        "--wait-for-nvml",
        action="store_true",
        help="if NVML is missing at start, serve gpuwarden_source_up 0 and retry instead of exiting",
    )
    from gpuwarden.catalog import COLLECTORS

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
    s.set_defaults(func=cmd_serve)
    c = sub.add_parser("check-config", help="validate a configuration file")
    c.add_argument("file")
    c.set_defaults(func=cmd_check_config)
    from gpuwarden import diagnose

    diagnose.add_parser(sub)
    from gpuwarden.cluster import commands as cluster_commands

    cluster_commands.add_parsers(sub)
    ls = sub.add_parser("collectors", help="list collectors and their default state")
    ls.set_defaults(func=cmd_collectors)
    r = sub.add_parser("record", help="record a trace of raw NVML readings (JSON Lines)")
    r.add_argument("--duration", type=float, required=True, help="seconds to record")
    r.add_argument("--out", required=True, help="trace file to write (.jsonl, or .jsonl.gz)")
    r.add_argument("--interval", type=float, default=1.0, help="seconds between polls (default 1)")
    r.add_argument(
        "--slow-interval",
        type=float,
        default=RECORD_SLOW_INTERVAL,
        help=f"seconds between the slow readings (default {RECORD_SLOW_INTERVAL:g}: a trace keeps more of them than "
        "serve, whose default is its slow_interval_seconds)",
    )
    r.add_argument("--no-processes", action="store_true", help="do not record GPU processes")
    r.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE", help="metadata for the header")
    r.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    r.set_defaults(func=cmd_record)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpuwarden`` console script; returns the exit status."""
    from gpuwarden.logs import setup

    setup("warning")  # serve sets its configured level and format once it has read them
    try:
        args = build_parser().parse_args(argv)  # --version prints here
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (check-config FILE | head -1): nothing more to say to it
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
