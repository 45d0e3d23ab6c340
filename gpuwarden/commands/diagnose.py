"""``gpuwarden diagnose``: why each GPU of this node is (not) working (the reports: gpuwarden.diagnose)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwarden.commands import COMMANDS, Subparsers
from gpuwarden.diagnose import (
    DiagnoseReport,
    LiveSampler,
    first_remedies,
    live_report,
    render,
    renderables,
    replay_report,
    url_report,
)
from gpuwarden.source import SourceError
from gpuwarden.terminal import visible


def _watch(args: argparse.Namespace, console: Any) -> int:
    """``--watch``: redraw the report every ``--interval`` s until interrupted (exit 0). What is drawn fits the
    terminal: the whole report, or the summary with each GPU's first remedy, or the summary alone. A daemon that does
    not answer (``--url``: restarting, unreachable) is said on the first line and asked again at the next redraw;
    one line and 1 only when live NVML cannot start."""
    from rich.live import Live
    from rich.text import Text

    sampler: LiveSampler | None = None
    if args.url:

        def step() -> DiagnoseReport:
            return url_report(args.url, auth=args.auth)

    else:
        sampler = LiveSampler()
        step = sampler.step
    if not console.is_terminal:
        return _each_redraw(args, step, sampler, _plain_drawer(args, console))
    with Live(console=console, auto_refresh=False, transient=False, vertical_overflow="crop") as live:
        last: list[DiagnoseReport] = []

        def draw(report: DiagnoseReport | None, problem: str | None) -> None:
            if report is not None:
                last[:] = [report]
            line = Text(problem, style="red") if problem else None
            live.update(_fit(console, last[0] if last else None, line, args.brief), refresh=True)

        return _each_redraw(args, step, sampler, draw)


#: Draws one redraw: the report (None while the daemon does not answer), or the line saying why there is none.
Drawer = Callable[[DiagnoseReport | None, str | None], None]


def _each_redraw(args: argparse.Namespace, step: Callable[[], DiagnoseReport], sampler: LiveSampler | None,
                 draw: Drawer) -> int:  # fmt: skip
    """Draw ``step()``'s report every ``--interval`` s until interrupted (0); a ``--url`` daemon that does not answer
    is drawn as a problem line and asked again, live NVML that cannot start raises SourceError. Closes ``sampler``."""
    try:
        while True:
            try:
                report = step()
            except SourceError as exc:
                if not args.url:
                    raise
                draw(None, f"{visible(exc)}; asking again every {args.interval:g} s")
            else:
                draw(report, None)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0
    finally:
        if sampler is not None:
            sampler.close()


def _plain_drawer(args: argparse.Namespace, console: Any) -> Drawer:
    """``--watch`` into a pipe or a file: nothing to redraw in place, so each redraw (the whole report; ``--brief``:
    the summary and each GPU's first remedy) is printed after the last, under a line with its time (UTC, RFC 3339),
    flushed at once (``| tee``, ``| grep --line-buffered``)."""
    from datetime import UTC, datetime

    def draw(report: DiagnoseReport | None, problem: str | None) -> None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if report is None:
            print(f"--- {stamp}: {problem}", flush=True)
            return
        print(f"--- {stamp}", flush=True)
        with console.capture() as captured:
            brief = renderables(report, brief=True) + first_remedies(report)
            for r in brief if args.brief else renderables(report):
                console.print(r)
        sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
        sys.stdout.flush()

    return draw


def _fit(console: Any, report: DiagnoseReport | None, problem: Any, brief: bool) -> Any:
    """The largest view of ``report`` that fits ``console``'s height, under ``problem`` (a line, or None)."""
    from rich.console import Group

    top = [problem] if problem is not None else []
    if report is None:
        return Group(*top)
    views = [] if brief else [renderables(report)]
    summary = renderables(report, brief=True)
    views += [summary + first_remedies(report), summary]
    for view in views:
        group = Group(*top, *view)
        if len(console.render_lines(group, console.options, pad=False)) < console.size.height:
            return group
    return group  # the summary alone, cropped at the bottom


def _auth(args: argparse.Namespace) -> tuple[str, str] | None:
    """(user, password) from --url.username and the first line of --url.password-file; None without them. Raises
    SourceError (one line) for a file that cannot be read or holds no password."""
    if not args.url_username:
        return None
    try:
        with open(args.url_password_file, encoding="utf-8") as f:
            password = f.readline(4096).rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot read --url.password-file {visible(args.url_password_file)}: "
                          f"{type(exc).__name__}") from None  # fmt: skip
    if not password:
        raise SourceError(f"--url.password-file {visible(args.url_password_file)} holds no password on its first line")
    return str(args.url_username), password


def run(args: argparse.Namespace) -> int:
    """Run ``gpuwarden diagnose``; returns the exit status (2 for flags that cannot apply, 1 with one line on stderr
    when the source fails)."""
    from rich.console import Console

    if args.replay and args.url:
        print("gpuwarden: --replay and --url cannot apply together: give one source", file=sys.stderr)
        return 2
    if args.watch and (args.replay or args.json):
        print("gpuwarden: --watch redraws a live view: not with --replay or --json", file=sys.stderr)
        return 2
    if args.seconds <= 0 or args.interval <= 0:
        print("gpuwarden: --seconds and --interval must be positive", file=sys.stderr)
        return 2
    if bool(args.url_username) != bool(args.url_password_file) or (args.url_username and not args.url):
        print("gpuwarden: --url.username and --url.password-file go together, with --url", file=sys.stderr)
        return 2
    err = Console(stderr=True)
    try:
        args.auth = _auth(args)
        if args.watch:
            return _watch(args, Console())
        if args.replay:
            report = replay_report(Path(args.replay))
        elif args.url:
            report = url_report(args.url, auth=args.auth)
        else:
            with err.status("sampling the GPUs") as st:
                report = live_report(args.seconds, args.interval, status=st.update if not args.json else None)
    except SourceError as exc:
        print(f"gpuwarden: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        render(report, Console(), brief=args.brief)
    return 0


def add_parser(subparsers: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``diagnose`` on ``subparsers`` (from ``ArgumentParser.add_subparsers``) and return its parser."""
    p = subparsers.add_parser(
        "diagnose",
        help=COMMANDS["diagnose"].help,
        description="Why each GPU of this node is (not) working: one line per GPU (verdict, starved share, what to "
        "do first), then the evidence and every remedy. Samples NVML for --seconds, or reads a recorded trace "
        "(--replay), or asks a running daemon for its diagnosis over its own window (--url).",
    )
    src = p.add_argument_group("source (one; default: sample this node's GPUs)")
    src.add_argument("--replay", metavar="FILE", help="diagnose a recorded trace")
    src.add_argument(
        "--url", metavar="URL", help="ask a running daemon, e.g. http://NODE:10400 (credentials: --url.username)"
    )
    src.add_argument("--url.username", dest="url_username", metavar="USER",
                     help="basic auth user for --url, with --url.password-file")  # fmt: skip
    src.add_argument("--url.password-file", dest="url_password_file", metavar="FILE",
                     help="a file whose first line is the password (never on the command line: ps and shell history "
                     "show it)")  # fmt: skip
    p.add_argument("--seconds", type=float, default=10.0, help="live: seconds to sample (default 10)")
    p.add_argument(
        "--interval", type=float, default=1.0, help="live: seconds between polls; --watch: between redraws (default 1)"
    )
    p.add_argument("--brief", action="store_true", help="only the one-line-per-GPU table")
    p.add_argument("--watch", action="store_true", help="redraw live until Ctrl-C (live NVML or --url)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p
