"""``gpuwarden reclaim``: the reclaim ladder over Prometheus - a controller that notifies, warns and reclaims jobs
that hold GPUs idle (dry run by default), or ``--report``: what it would have done over a past range."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuwarden.commands import COMMANDS, Subparsers
from gpuwarden.commands._prometheus import add_common

if TYPE_CHECKING:
    from gpuwarden.cluster.promapi import Prometheus
    from gpuwarden.reclaim.ladder import Decision


def add_parser(subparsers: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``reclaim`` on ``subparsers`` and return its parser."""
    p = subparsers.add_parser(
        "reclaim",
        help=COMMANDS["reclaim"].help,
        description="Climbs jobs that hold GPUs and leave them idle up a ladder of actions (notify, warn, reclaim) "
        "set in --policy, from the daemons' accounting and verdicts in Prometheus: held idle or paused jobs climb; "
        "starved, launch-bound, checkpointing or waiting-on-peers jobs never do. Runs no action unless the policy "
        "says dry_run: false. --report: what it would have done over --range.",
    )
    p.add_argument("--policy", required=True, type=Path, metavar="FILE", help="the reclaim policy (YAML)")
    add_common(p)
    p.set_defaults(range="1d", step=None)
    p.add_argument("--report", action="store_true",
                   help="print what the ladder would have decided over --range ending --at, then exit")  # fmt: skip
    p.add_argument(
        "--once",
        action="store_true",
        help="evaluate one tick (ending --at, default now; after warming up on the history), then exit",
    )
    p.add_argument("--dry-run", action="store_true", help="run no action whatever the policy says")
    p.add_argument("--web.listen-address", dest="listen_address", default="127.0.0.1:10401", metavar="HOST:PORT",
                   help="where the controller serves its /metrics (default 127.0.0.1:10401; '' for none)")  # fmt: skip
    return p


def run(args: argparse.Namespace) -> int:
    """Load the policy (exit 2 on a bad one), then report, evaluate once, or run the controller until SIGTERM."""
    from gpuwarden.cluster.durations import seconds
    from gpuwarden.cluster.promapi import PrometheusError
    from gpuwarden.commands import EXIT_USAGE, die
    from gpuwarden.reclaim.policy import PolicyError, load_policy
    from gpuwarden.terminal import brief

    try:
        policy = load_policy(args.policy)
    except PolicyError as exc:
        return die(f"reclaim: {brief(exc, 400)}", EXIT_USAGE)
    from pydantic import ValidationError

    changed: dict[str, str] = {}
    if args.step is not None:
        changed["interval"] = args.step
    if args.selector:
        changed["selector"] = ",".join(x for x in (policy.selector, args.selector) if x)
    try:  # validated as the file's own values are (a job label in --selector selects nothing)
        policy = type(policy).model_validate({**policy.model_dump(), **changed})
    except ValidationError as exc:
        problem = exc.errors()[0]
        return die(f"reclaim: {'.'.join(map(str, problem['loc']))}: {brief(problem['msg'], 400)}", EXIT_USAGE)
    labels = tuple(args.cluster_labels)
    try:
        if args.report:
            return _report(args, policy, seconds(args.range), labels)
        return _control(args, policy, labels)
    except (PrometheusError, ValueError) as exc:
        return die(f"reclaim: {brief(exc, 400)}")


def _connect(args: argparse.Namespace) -> Prometheus:
    from gpuwarden.cluster.promapi import ClientTls, Prometheus

    tls = ClientTls(args.ca_file, args.cert_file, args.key_file, args.bearer_token_file)
    return Prometheus(args.prometheus, timeout=args.timeout, headers=dict(args.header), tls=tls)


def _report(args: argparse.Namespace, policy: Any, range_s: float, labels: tuple[str, ...]) -> int:
    from gpuwarden.reclaim.controller import record, report
    from gpuwarden.terminal import progress

    end = time.time() if args.at is None else args.at
    with progress(f"reclaim ladder over {args.range}: ticks") as advance:
        decisions = report(policy, lambda: _connect(args), end, range_s, labels, progress=advance)
    rows = [record(d, "reset" if d.step == "reset" else "dry_run") for d in decisions]
    if args.json:
        print(json.dumps({"range_seconds": range_s, "end": end, "decisions": rows, "reached": _reached(decisions,
                          policy)}, indent=1))  # fmt: skip
        return 0
    _print_report(rows, policy, range_s)
    return 0


def _reached(decisions: list[Decision], policy: Any) -> dict[str, list[str]]:
    """Per step, the jobs that reached it in the range (labels)."""
    out: dict[str, list[str]] = {s.name: [] for s in policy.steps}
    for d in decisions:
        if d.step in out and d.key.label() not in out[d.step]:
            out[d.step].append(d.key.label())
    return out


def _print_report(rows: list[dict[str, Any]], policy: Any, range_s: float) -> None:
    from rich.console import Console
    from rich.table import Table

    from gpuwarden.terminal import SHOWN_CHARS, brief, plain

    header = ("time (UTC)", "job", "step", "idle min", "GPUs", "nodes", "evidence")
    cells = [
        (time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["time"])), r["job_id"] + (f" @ {r['instance']}"
         if r["instance"] else ""), r["step"], f"{r['idle_minutes']:g}", str(r["gpus"]), r["nodes"], r["evidence"])
        for r in rows
    ]  # fmt: skip
    title = f"reclaim ladder over the last {range_s / 3600:g} h (dry run): {len(rows)} decision(s)"
    console = Console()
    if not console.is_terminal:
        lines = [f"# {title}", "\t".join(header), *("\t".join(brief(c, SHOWN_CHARS).replace("\t", "\\t") for c in row)
                                                      for row in cells)]  # fmt: skip
        sys.stdout.write("".join(line + "\n" for line in lines))
        return
    table = Table(title=title)
    for h in header:
        table.add_column(h, overflow="fold")
    for row in cells:
        table.add_row(*(plain(c) for c in row))
    console.print(table)


def _control(args: argparse.Namespace, policy: Any, labels: tuple[str, ...]) -> int:
    import logging
    import signal
    import threading

    from gpuwarden.commands import EXIT_USAGE, die
    from gpuwarden.logs import setup
    from gpuwarden.reclaim.controller import Controller, ReclaimMetrics

    setup("info")
    dry_run = policy.dry_run or args.dry_run
    metrics = ReclaimMetrics(policy, dry_run, labels)
    controller = Controller(policy, lambda: _connect(args), dry_run, labels, metrics)
    if args.once:
        at = time.time() if args.at is None else args.at
        controller.warm_up(at)
        controller.evaluate(at)
        controller.runner.close(wait=True)
        return 0
    if args.listen_address:
        try:
            metrics.serve(args.listen_address)
        except (OSError, ValueError) as exc:
            return die(f"reclaim: cannot listen on {args.listen_address}: {exc}", EXIT_USAGE)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, f: stop.set())
    logging.getLogger("gpuwarden.reclaim").info(
        "reclaim: evaluating every %s (%s)", policy.interval, "dry run" if dry_run else "actions run"
    )
    controller.run(stop)
    return 0
