"""``gpuwarden check``: is each GPU ready for the next job? For a Slurm prolog or a Kubernetes init container.

One NVML read of every GPU (no daemon needed), judged by ``gpuwarden.health``: PASS, WARN or CRITICAL per GPU
with the reason and the next action; with ``--prometheus``, each GPU's history too (``gpuwarden top --quality``'s
tiers over ``--range``: a GPU to service is CRITICAL, one to watch WARN). Exit codes (Nagios's): 0 every GPU PASS or
WARN, 1 a WARN with ``--strict``, 2 a CRITICAL GPU, 3 the GPUs could not be read at all (no driver, NVML failed); 64
bad flags (sysexits.h's EX_USAGE: a prolog tells a typo in its own command line from a bad GPU, and drains no node
over it).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import TYPE_CHECKING

from gpuwarden.commands import COMMANDS, Subparsers, die
from gpuwarden.commands._prometheus import duration, positive_seconds

if TYPE_CHECKING:
    from gpuwarden.health import GpuCheck
    from gpuwarden.model import NodeStatic, PollResult

EXIT_WARN, EXIT_CRITICAL, EXIT_UNKNOWN = 1, 2, 3
#: Bad flags (sysexits.h's EX_USAGE), apart from CRITICAL: gpuwarden.cli maps check's argparse errors to it.
EXIT_USAGE = 64


def add_parser(subparsers: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``check`` on ``subparsers`` and return its parser."""
    p = subparsers.add_parser("check", help=COMMANDS["check"].help, description=__doc__)
    p.add_argument("--replay", metavar="FILE", help="judge a poll of a recorded trace instead of the GPUs")
    p.add_argument("--poll", type=int, default=-1, metavar="N", help="with --replay: the poll to judge (default last)")
    p.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text for a terminal or a log (default), json for a program",
    )
    p.add_argument("--strict", action="store_true", help="exit 1 when a GPU is WARN")
    p.add_argument(
        "--gpus",
        metavar="LIST",
        help="NVML indices to check, comma-separated (a job's own: Slurm's $SLURM_JOB_GPUS); default all",
    )
    p.add_argument("--prometheus", metavar="URL",
                   help="add each GPU's history from this Prometheus (gpuwarden top --quality over --range, by UUID): "
                   "a GPU to take out of service is CRITICAL, one to watch WARN; unreachable: the NVML read alone, "
                   "said on stderr")  # fmt: skip
    p.add_argument("--range", default="7d", type=duration, help="with --prometheus: how far back (default 7d)")
    p.add_argument("--timeout", type=positive_seconds, default=10.0,
                   help="with --prometheus: seconds to wait for it, all queries together (default 10)")  # fmt: skip
    p.add_argument("--prometheus.bearer-token-file", dest="bearer_token_file", metavar="FILE",
                   help="send the token in FILE as Authorization: Bearer")  # fmt: skip
    p.add_argument("--prometheus.ca-file", dest="ca_file", metavar="FILE",
                   help="CA certificates (PEM) to verify an https Prometheus with")  # fmt: skip
    return p


def _read(args: argparse.Namespace) -> tuple[NodeStatic, PollResult]:
    """The node's static facts and one poll: from the trace of ``--replay``, or read from NVML now. Raises
    SourceError (NVML) or TraceError (the trace), or IndexError for a poll the trace does not have."""
    if args.replay is not None:
        from pathlib import Path

        from gpuwarden.trace import read_trace

        header, polls = read_trace(Path(args.replay))
        poll = polls[args.poll]
        wanted = _indices(args.gpus)
        if wanted is not None:
            poll = poll.model_copy(update={"gpus": [g for g in poll.gpus if g.index in wanted]})
        return header.node, poll
    from gpuwarden.nvml import NvmlSource

    # one read: the slow readings (ECC, row remapping, recovery action) come with the first poll; no GPM, no XID thread
    source = NvmlSource(gpm_interval=3600.0, xid_events=False, host_min_gap=3600.0, gpu_indices=_indices(args.gpus))
    try:
        static = source.open()
        return static, source.poll()
    finally:
        source.close()


def _indices(text: str | None) -> list[int] | None:
    """The NVML indices of ``--gpus`` (None: all). Raises ValueError naming a bad one."""
    if text is None:
        return None
    out = []
    for part in text.split(","):
        if not part.strip().isdigit() or len(part.strip()) > 4:
            raise ValueError(f"--gpus: {part.strip()[:20]!r} is not a GPU index")
        out.append(int(part))
    return out


def run(args: argparse.Namespace) -> int:
    """Print each GPU's readiness; return the exit code of the worst (see the module docstring)."""
    from gpuwarden.health import assess, worst
    from gpuwarden.source import SourceError
    from gpuwarden.trace import TraceError

    started = time.monotonic()
    try:
        _indices(args.gpus)
    except ValueError as exc:
        return die(str(exc), EXIT_USAGE)
    try:
        static, poll = _read(args)
    except (SourceError, TraceError, OSError) as exc:
        return die(f"cannot check the GPUs: {exc}", EXIT_UNKNOWN)
    except IndexError:
        return die(f"--poll {args.poll}: the trace has no such poll", EXIT_USAGE)
    checks = assess(static, poll)
    if args.prometheus:
        checks = _with_history(checks, args)
    level = worst(checks)
    seconds = time.monotonic() - started
    if args.format == "json":
        doc = {"level": level, "seconds": round(seconds, 3), "gpus": [c.model_dump() for c in checks]}
        print(json.dumps(doc))
    else:
        _print(checks, level, seconds)
    if not checks:
        return die("no GPU to check", EXIT_UNKNOWN)
    if level == "CRITICAL":
        return EXIT_CRITICAL
    return EXIT_WARN if level == "WARN" and args.strict else 0


#: What a GPU's history asks of the next job's owner, by quality tier (gpuwarden.cluster.quality).
HISTORY_ACTIONS = {
    "service": "take it out of scheduling and have it serviced (gpuwarden top --quality lists it)",
    "watch": "it ran slower or closer to failing than its peers: watch it (gpuwarden top --quality)",
}


def _with_history(checks: list[GpuCheck], args: argparse.Namespace) -> list[GpuCheck]:
    """``checks`` with each GPU's history from ``--prometheus`` added (gpuwarden.cluster.quality over ``--range``, the
    GPUs selected by UUID): a service reason a CRITICAL finding, a watch reason a WARN. When Prometheus cannot answer,
    ``checks`` as they are, after one line on stderr: a prolog keeps its NVML verdict, it does not drain for a
    monitoring outage."""
    from gpuwarden.cluster.accounting_queries import promql_string
    from gpuwarden.cluster.promapi import ClientTls, Prometheus, PrometheusError
    from gpuwarden.cluster.quality import quality
    from gpuwarden.cluster.usage import Accounting
    from gpuwarden.health import LEVELS, Finding
    from gpuwarden.terminal import brief, redacted

    uuids = [c.uuid for c in checks if c.uuid]
    if not uuids:
        return checks
    selector = "uuid=~" + promql_string("|".join(re.escape(u) for u in uuids))
    try:
        prom = Prometheus(args.prometheus, timeout=args.timeout, tls=ClientTls(args.ca_file, None, None,
                                                                                args.bearer_token_file))  # fmt: skip
        try:
            found = quality(Accounting(prom, args.range, "1m", selector))
        finally:
            prom.close()
    except (PrometheusError, ValueError) as exc:
        print(f"gpuwarden check: no history from {redacted(args.prometheus)} ({brief(exc, 300)}): the NVML read alone",
              file=sys.stderr)  # fmt: skip
        return checks
    history = {q.uuid: q for q in found}
    out = []
    for c in checks:
        q = history.get(c.uuid)
        if q is None or not q.reasons:
            out.append(c)
            continue
        added = [Finding(level="CRITICAL" if tier == "service" else "WARN", reason=f"history, last {args.range}: {why}",
                         action=HISTORY_ACTIONS[tier]) for tier, why in q.reasons]  # fmt: skip
        findings = [*c.findings, *added]
        out.append(c.model_copy(update={"findings": findings,
                                        "level": max((f.level for f in findings), key=LEVELS.index)}))  # fmt: skip
    return out


def _print(checks: list[GpuCheck], level: str, seconds: float) -> None:
    """One line per GPU (and one per finding below it), then the node's level; text from the machine escaped."""
    from rich.console import Console

    from gpuwarden.terminal import plain

    console = Console(highlight=False)
    style = {"PASS": "green", "WARN": "yellow", "CRITICAL": "bold red"}
    for c in checks:
        line = plain(f"GPU {c.gpu} {c.name} {c.uuid}: ")
        line.append(c.level, style=style[c.level])
        console.print(line)
        for f in c.findings:
            console.print(plain(f"  {f.level}: {f.reason} - {f.action}"))
    summary = plain(f"{len(checks)} GPU(s), checked in {seconds:.2f} s: ")
    summary.append(level, style=style[level])
    console.print(summary)
