"""``gpuwarden record``: poll live NVML for a while and write every poll to a trace (gpuwarden.record)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from gpuwarden.commands import COMMANDS, EXIT_USAGE, Subparsers, die

#: ``record`` reads the slow readings (energy, ECC, PCIe width and replays) every 10 s by default, more often than
#: ``serve`` (gpuwarden.config.SLOW_INTERVAL): a trace is for analysis, and its size barely changes.
RECORD_SLOW_INTERVAL = 10.0


def add_parser(subparsers: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``record`` on ``subparsers`` and return its parser."""
    r = subparsers.add_parser("record", help=COMMANDS["record"].help)
    r.add_argument("--duration", type=float, required=True, help="seconds to record")
    r.add_argument("--out", required=True, help="trace file to write (.jsonl, or .jsonl.gz)")
    r.add_argument(
        "--poll.interval",
        dest="interval",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between polls (default 1)",
    )
    r.add_argument(
        "--poll.slow-interval",
        dest="slow_interval",
        type=float,
        metavar="S",
        default=RECORD_SLOW_INTERVAL,
        help=f"seconds between the slow readings (default {RECORD_SLOW_INTERVAL:g}: a trace keeps more of them than "
        "serve, whose default is its slow_interval_seconds)",
    )
    r.add_argument("--interval", dest="interval", type=float, help=argparse.SUPPRESS)  # older name, after the default
    r.add_argument(
        "--slow-interval", dest="slow_interval", type=float, help=argparse.SUPPRESS
    )  # older name, after the default
    r.add_argument("--no-processes", action="store_true", help="do not record GPU processes")
    r.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE", help="metadata for the header")
    r.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    return r


def _meta(values: list[str]) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, val = v.partition("=")
        if not sep or not key:
            raise ValueError(f"--meta expects KEY=VALUE, got {v!r}")
        out[key] = val
    return out


def run(args: argparse.Namespace) -> int:
    """Record a trace from live NVML: 0, 2 for bad flags, 1 with one line when NVML or the disk fails."""
    from gpuwarden.nvml import NvmlSource
    from gpuwarden.record import record
    from gpuwarden.source import SourceError

    try:
        meta = _meta(args.meta)
    except ValueError as exc:
        return die(str(exc), EXIT_USAGE)
    for flag, value, low, high in (
        ("--duration", args.duration, 0.05, 7 * 86400.0),
        ("--poll.interval", args.interval, 0.05, 300.0),
        ("--poll.slow-interval", args.slow_interval, 1.0, 3600.0),
    ):
        if not (math.isfinite(value) and low <= value <= high):
            return die(f"{flag} must be a number of seconds from {low:g} to {high:g}, got {value!r}", EXIT_USAGE)
    out = Path(args.out)
    if out.exists() and not args.force:
        return die(f"{out} exists: give another --out, or --force to overwrite it", EXIT_USAGE)
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
        return die(str(exc))
    except OSError as exc:
        return die(f"cannot write {args.out}: {exc.strerror or exc}")
    if result.error is not None:  # a full disk: the polls written before it are readable
        return die(f"{args.out}: {result.error}; {result.polls} complete polls kept")
    how = f" (stopped by {result.stopped_by})" if result.stopped_by else ""
    print(f"recorded {result.polls} polls to {args.out}{how}", file=sys.stderr)
    return 0
