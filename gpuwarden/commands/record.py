"""``gpuwarden record``: poll live NVML for a while and write every poll to a trace.

While it records, the insight analyzer the daemon runs (same windows) reads every poll as it is written; at the end
its verdict on each GPU goes into the trace's header (``metadata.live_verdicts``: GPU index -> verdict, with
``live_findings``), so a replay of the trace can be held to what the daemon said live
(tests/test_insight_live_and_clock.py).
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwarden.commands import COMMANDS, EXIT_USAGE, Subparsers, die
from gpuwarden.insight.analyzer import DeferredInsight, InsightAnalyzer, insight_result
from gpuwarden.model import NodeStatic, PollResult
from gpuwarden.source import Source
from gpuwarden.trace import TraceHeader, TraceWriter, rewrite_header

#: ``record`` reads the slow readings (energy, ECC, PCIe width and replays) every 10 s by default, more often than
#: ``serve`` (gpuwarden.config.SLOW_INTERVAL): a trace is for analysis, and its size barely changes.
RECORD_SLOW_INTERVAL = 10.0


@dataclass(frozen=True)
class Recorded:
    """How a recording ended: ``polls`` written (each complete and readable), the signal that stopped it early
    (``SIGTERM``, ``SIGINT``) or None, and the write error that ended it (a full disk) or None."""

    polls: int
    stopped_by: str | None = None
    error: str | None = None
    live_verdicts: dict[str, str] | None = None


class LiveVerdicts:
    """The daemon's insight analyzer run over the polls of a recording as they are written (``add``); ``metadata()``
    returns the verdict and findings of each GPU at the last poll (GPU index as a string -> verdict; GPUs still
    without one are left out)."""

    def __init__(self, static: NodeStatic) -> None:
        self.static = static
        self.analyzer = InsightAnalyzer()
        self.last: DeferredInsight | None = None

    def add(self, poll: PollResult) -> None:
        """Account ``poll`` (the result is built only when ``metadata`` asks for it)."""
        self.last = self.analyzer.prepare(poll, self.static)

    def metadata(self) -> dict[str, Any]:
        """``{"live_verdicts": {...}, "live_findings": {...}}`` at the last poll; empty before any poll."""
        res = insight_result(self.last) if self.last is not None else None
        if res is None:
            return {}
        verdicts = {str(g.gpu): g.diagnosis.verdict for g in res.gpus if g.diagnosis is not None}
        findings = {str(g.gpu): list(g.diagnosis.findings) for g in res.gpus if g.diagnosis is not None}
        return {"live_verdicts": verdicts, "live_findings": findings}


def record(
    source: Source,
    out: Path,
    duration: float,
    interval: float,
    metadata: dict[str, Any],
    overwrite: bool = True,
    progress: Callable[[int, float], None] | None = None,
) -> Recorded:
    """Open ``source``, poll it every ``interval`` s for ``duration`` s, write the trace to ``out``.

    SIGTERM and SIGINT (in the main thread) end the recording after the poll in hand, the trace closed and complete.
    A write that fails after the header (ENOSPC) ends it with the polls before it kept. Raises SourceError when the
    source cannot open, OSError when ``out`` cannot be created, FileExistsError when it exists and not
    ``overwrite``. ``progress(polls, seconds)``, if given, is called after each poll written. Every poll is
    flushed as it is written (gpuwarden.trace.TraceWriter), so a kill keeps the
    complete polls readable.
    """
    stop = threading.Event()
    stopped: list[str] = []

    def on_signal(sig: int, frame: object) -> None:
        stopped.append(signal.Signals(sig).name)
        stop.set()

    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    node = source.open()
    live = LiveVerdicts(node)
    try:
        header = TraceHeader(created=time.time(), poll_interval_seconds=interval, node=node, metadata=metadata)
        with TraceWriter(out, header, overwrite=overwrite) as writer:
            start = time.monotonic()
            next_at = start
            while not stop.is_set():
                poll = source.poll()
                try:
                    writer.write(poll)
                except OSError as exc:
                    return Recorded(writer.polls - 1, error=f"write failed: {exc.strerror or exc}")
                live.add(poll)
                if progress is not None:
                    progress(writer.polls, time.monotonic() - start)
                next_at += interval
                if next_at - start > duration:
                    break
                stop.wait(max(0.0, next_at - time.monotonic()))
        extra = live.metadata()
        if extra:
            try:
                rewrite_header(out, header.model_copy(update={"metadata": {**metadata, **extra}}))
            except OSError as exc:  # the trace as written stays whole
                return Recorded(writer.polls, error=f"live verdicts not written to the header: {exc.strerror or exc}")
        return Recorded(
            writer.polls, stopped_by=stopped[0] if stopped else None, live_verdicts=extra.get("live_verdicts")
        )
    finally:
        source.close()
        for s, h in handlers.items():
            signal.signal(s, h)


def add_parser(subparsers: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``record`` on ``subparsers`` and return its parser."""
    r = subparsers.add_parser("record", help=COMMANDS["record"].help,
                              description="Record this node's NVML readings for --duration seconds into a trace "
                              "that serve --replay, check --replay and the tests replay.")  # fmt: skip
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
    # a trace is for analysis and replay: GPM at every poll, whatever it costs
    source = NvmlSource(
        slow_interval=args.slow_interval,
        gpm_interval=0.0,
        host_min_gap=0.0,
        processes=not args.no_processes,
        server_requests=not args.no_processes,  # what a server says of its requests, as serve reads it
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
