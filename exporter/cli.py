"""The ``gpuwarden`` command: serve, record, diagnose, check-config."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from exporter import __version__
from exporter.source import SourceError

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
    from exporter.nvml import NvmlSource
    from exporter.record import record

    try:
        meta = _meta(args.meta)
    except ValueError as exc:
        return _die(str(exc), EXIT_USAGE)
    source = NvmlSource(slow_interval=args.slow_interval, processes=not args.no_processes)
    try:
        n = record(source, Path(args.out), args.duration, args.interval, meta)
    except SourceError as exc:
        return _die(str(exc))
    except OSError as exc:
        return _die(f"cannot write {args.out}: {exc.strerror or exc}")
    print(f"recorded {n} polls to {args.out}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of every subcommand."""
    p = argparse.ArgumentParser(prog="gpuwarden", description="NVIDIA GPU monitoring daemon and Prometheus exporter")
    p.add_argument("--version", action="version", version=f"gpuwarden {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="record a trace of raw NVML readings (JSON Lines)")
    r.add_argument("--duration", type=float, required=True, help="seconds to record")
    r.add_argument("--out", required=True, help="trace file to write (.jsonl, or .jsonl.gz)")
    r.add_argument("--interval", type=float, default=1.0, help="seconds between polls (default 1)")
    r.add_argument("--slow-interval", type=float, default=10.0, help="seconds between energy/ECC reads (default 10)")
    r.add_argument("--no-processes", action="store_true", help="do not record GPU processes")
    r.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE", help="metadata for the header")
    r.set_defaults(func=cmd_record)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``gpuwarden`` console script; returns the exit status."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
