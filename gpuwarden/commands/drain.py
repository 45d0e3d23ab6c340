"""``gpuwarden drain``: drain the Slurm nodes of GPUs that need service, and resume them once clean (from Prometheus;
a dry run unless ``--apply``)."""

from __future__ import annotations

import argparse
import json
import math

from gpuwarden.commands import COMMANDS, EXIT_RUNTIME, Subparsers, die
from gpuwarden.commands._prometheus import add_common


def add_parser(subparsers: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``drain`` on ``subparsers`` (from ``ArgumentParser.add_subparsers``) and return its parser."""
    p = subparsers.add_parser(
        "drain",
        help=COMMANDS["drain"].help,
        description="Drains (scontrol update State=DRAIN) the Slurm nodes with a GPU that needed service over "
        "--range (lost, critical XID, uncorrectable ECC, failed remap, NVLink link down, fabric: top --quality's "
        "service tier), with the reasons, and resumes the nodes it drained once their GPUs were seen clean over the "
        "whole range. Never more than --max-out-ratio of the nodes out at once; never resumes a node someone else "
        "drained. Prints the plan; runs it with --apply. Run it from a timer, every few minutes.",
    )
    add_common(p)
    p.set_defaults(range="1h")
    p.add_argument("--apply", action="store_true", help="run the scontrol commands (default: print the plan only)")
    p.add_argument("--max-out-ratio", dest="max_out_ratio", type=_ratio, default=0.1, metavar="RATIO",
                   help="the share of Slurm's nodes that may be out (drained, draining, down) at once, by anyone, "
                   "before a drain is refused (default 0.1)")  # fmt: skip
    return p


def _ratio(text: str) -> float:
    """``text`` as a ratio in (0, 1]; raises argparse.ArgumentTypeError otherwise."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a number above 0 and at most 1: {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    """Plan (and with ``--apply`` run) the drains and resumes (gpuwarden.cluster.drain); 1 with one line when
    Prometheus or Slurm cannot answer, or an scontrol command failed."""
    from gpuwarden.cluster.drain import apply, plan, sinfo
    from gpuwarden.cluster.quality import quality
    from gpuwarden.cluster.views import _ask

    got = _ask(args, "drain", lambda acc: (quality(acc), acc.node_names(), acc.seen_throughout()))
    if got is None:
        return EXIT_RUNTIME
    found, names, seen_instances = got
    try:
        slurm = sinfo()
    except (RuntimeError, OSError) as exc:
        return die(f"drain: {exc}")

    def node(cluster: tuple[str, ...], instance: str) -> str:
        return names.get((cluster, instance), "") or instance.rsplit(":", 1)[0]

    service: dict[str, dict[str, list[str]]] = {}
    for q in found:
        reasons = [text for tier, text in q.reasons if tier == "service"]
        if reasons:
            service.setdefault(node(q.cluster, q.instance), {})[q.gpu] = reasons
    seen = {node(c, i) for c, i in seen_instances}
    actions = plan(service, seen, slurm, args.max_out_ratio)
    failed = []
    rows = []
    for a in actions:
        error = apply(a) if args.apply else None
        if error is not None:
            failed.append(a.node)
        done = "refused" if a.kind == "refuse" else ("failed" if error else "done") if args.apply else "planned"
        rows.append({"action": a.kind, "node": a.node, "reason": a.reason, "status": done, "error": error})
    if args.json:
        print(json.dumps({"apply": args.apply, "range": args.range, "actions": rows}, indent=2))
    else:
        for r in rows:
            print(
                f"{r['action']}\t{r['node']}\t{r['status']}\t{r['reason']}" + (f"\t{r['error']}" if r["error"] else "")
            )
        if not rows:
            print(f"nothing to do: no node to drain or resume over the last {args.range}")
    return EXIT_RUNTIME if failed else 0
