"""``gpuwarden top``: the cluster's jobs and GPUs ranked by GPU-hours lost, by cause (from Prometheus)."""

from __future__ import annotations

import argparse

from gpuwarden.commands import COMMANDS, Subparsers
from gpuwarden.commands._prometheus import add_common, bounded, duration


def add_parser(subparsers: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``top`` on ``subparsers`` (from ``ArgumentParser.add_subparsers``) and return its parser."""
    p = subparsers.add_parser(
        "top",
        help=COMMANDS["top"].help,
        description="Ranks the jobs and GPUs of every node Prometheus scrapes by the GPU-hours they held but left "
        "idle over --range, split by cause (input, paused, held idle, ...), with each one's verdict and what to do "
        "first. Prices them when the nodes export gpuwarden_gpu_hour_price.",
    )
    add_common(p)
    p.add_argument("--limit", type=int, default=15, help="rows per table (default 15)")
    p.add_argument("--details", action="store_true",
                   help="below the job table: each job's nodes, causes, cost, verdict, what to do first")  # fmt: skip
    p.add_argument("--source", choices=("auto", "recorded", "raw"), default="auto",
                   help="recorded: sum the usage records (the rules' group gpuwarden.usage: one sample a job "
                   "and node a minute, a week in seconds, within about 1%%); raw: the exact accounting of every GPU "
                   "at every scrape (its cost grows with the range and the fleet); auto (default): recorded where "
                   "the records cover a range of 15 minutes or more, else raw")  # fmt: skip
    p.add_argument("--suspects", action="store_true",
                   help="instead: the GPUs that held back several jobs (fail-slow suspects) with their node-local "
                   "evidence; use a long --range, e.g. 7d")  # fmt: skip
    p.add_argument("--quality", action="store_true",
                   help="instead: every GPU's quality across the jobs it ran (service, watch, good) with the reasons: "
                   "errors, links, clocks, fail-slow; use a long --range, e.g. 7d")  # fmt: skip
    p.add_argument("--suspects.min-jobs", dest="suspect_jobs", type=_positive_int, default=3, metavar="N",
                   help="distinct jobs a GPU must have been the straggler of (default 3)")  # fmt: skip
    p.add_argument("--suspects.straggler-for", dest="straggler_for", type=duration, default="5m",
                   help="how long the daemon must flag it its job's straggler to count (default 5m)")  # fmt: skip
    p.add_argument("--by", choices=("user", "account", "namespace", "job"), default=None,
                   help="instead: GPU-hours held, used and lost by cause, and the money of each, added up by owner: "
                   "the user or account of gpu_job_info (the Slurm prolog's; the processes' user), the pod's "
                   "namespace, or the job (chargeback; --json, or --format csv)")  # fmt: skip
    p.add_argument("--format", choices=("table", "slurm", "k8s", "csv"), default="table",
                   help="with --suspects: the suspects' nodes, with --quality the nodes of GPUs that need service, as "
                   "a Slurm exclude list and drain, or Kubernetes taints (commands to review, not run); with --by: "
                   "csv, for a chargeback tool")  # fmt: skip
    return p


_positive_int = bounded(int, "a whole number of 1 or more")


def run(args: argparse.Namespace) -> int:
    """Print the jobs and GPUs that lost the most GPU-hours (gpuwarden.cluster.views.top); 1 with one line on
    errors."""
    from gpuwarden.cluster.views import quality_view, suspects_view, top
    from gpuwarden.commands import EXIT_USAGE, die

    if sum(map(bool, (args.suspects, args.quality, args.by))) > 1:
        return die("--suspects, --quality and --by are views of their own: give one", EXIT_USAGE)
    if args.format == "csv" and not args.by:
        return die("--format csv writes the rows of --by: give it", EXIT_USAGE)
    if args.format in ("slurm", "k8s") and not (args.suspects or args.quality):
        return die(f"--format {args.format} lists the fail-slow suspects' nodes (--suspects) or those of GPUs that "
                   "need service (--quality): give one of them", EXIT_USAGE)  # fmt: skip
    if args.by:
        from gpuwarden.cluster.owners import owners_view

        return owners_view(args)
    if args.quality:
        return quality_view(args)
    return suspects_view(args) if args.suspects else top(args)
