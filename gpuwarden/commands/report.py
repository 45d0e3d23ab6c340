"""``gpuwarden report --job ID``: one job's efficiency summary (from Prometheus)."""

from __future__ import annotations

import argparse

from gpuwarden.commands import COMMANDS, Subparsers
from gpuwarden.commands._prometheus import add_common


def add_parser(subparsers: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``report`` on ``subparsers`` (from ``ArgumentParser.add_subparsers``) and return its parser."""
    p = subparsers.add_parser(
        "report",
        help=COMMANDS["report"].help,
        description="A job's efficiency over --range: GPU-hours held, with SM activity >= 50% (DCGM: below that the "
        "GPU is likely used ineffectively), busy, lost by cause, energy, the straggler if any, the verdict and what "
        "to do first. Meant for a Slurm epilog or a job controller when a job ends.",
    )
    add_common(p)
    p.add_argument("--job", required=True, metavar="ID", help="the job_id (Slurm job id, pod UID, ...)")
    p.add_argument("--instance", metavar="HOST:PORT", help="the node, for a node-local job id")
    return p


def run(args: argparse.Namespace) -> int:
    """Print one job's summary (gpuwarden.cluster.views.report): 1 with one line when the job is not found or
    Prometheus cannot answer, 2 when a node-local id is ambiguous."""
    from gpuwarden.cluster.views import report

    return report(args)
