"""``gpuwarden drain``: take the nodes of GPUs that need service out of the scheduler (a Slurm drain, or a Kubernetes
taint and node condition), and put them back once clean (from Prometheus; a dry run unless ``--apply``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from gpuwarden.cluster.drain import Action, SchedulerNode
from gpuwarden.commands import COMMANDS, EXIT_RUNTIME, Subparsers, die
from gpuwarden.commands._prometheus import add_common, bounded

if TYPE_CHECKING:
    from gpuwarden.cluster.bounds import Deadline
    from gpuwarden.cluster.kube import KubeApi


def add_parser(subparsers: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``drain`` on ``subparsers`` (from ``ArgumentParser.add_subparsers``) and return its parser."""
    p = subparsers.add_parser(
        "drain",
        help=COMMANDS["drain"].help,
        description="Drains the nodes with a GPU that needed service over --range (lost, critical XID, "
        "uncorrectable ECC, failed remap, NVLink link down, fabric: top --quality's service tier), with the reasons, "
        "and resumes the nodes it drained once their GPUs were seen clean over the whole range. Slurm: scontrol "
        "update State=DRAIN / RESUME. Kubernetes: the taint gpuwarden.io/gpu-service:NoSchedule and the node "
        "condition GPUNeedsService, set and cleared through the API server. Never more than --max-out-ratio of the "
        "nodes out at once; never resumes a node someone else took out. Prints the plan; runs it with --apply. Run "
        "it from a timer or a CronJob, every few minutes.",
    )
    add_common(p)
    p.set_defaults(range="1h")
    p.add_argument("--apply", action="store_true", help="act (default: print the plan only)")
    p.add_argument(
        "--scheduler",
        choices=("slurm", "kubernetes"),
        default="slurm",
        help="whose nodes: slurm (sinfo, scontrol; default) or kubernetes (the API server)",
    )
    p.add_argument(
        "--kube-api",
        dest="kube_api",
        metavar="URL",
        help="the Kubernetes API server (default: in-cluster, from the service account; outside a pod, "
        "kubectl proxy's address, e.g. http://127.0.0.1:8001)",
    )
    p.add_argument(
        "--kube-token-file",
        dest="kube_token_file",
        metavar="FILE",
        help="bearer token for --kube-api (default: the service account's in a pod, none otherwise)",
    )
    p.add_argument(
        "--kube-ca-file",
        dest="kube_ca_file",
        metavar="FILE",
        help="CA bundle for --kube-api (default: the service account's in a pod, the system's otherwise)",
    )
    p.add_argument(
        "--textfile",
        metavar="PATH",
        help="also write the run's decisions as Prometheus metrics to PATH (node_exporter's textfile "
        "collector: a *.prom file in its --collector.textfile.directory), replaced atomically",
    )
    p.add_argument("--max-out-ratio", dest="max_out_ratio", type=_ratio, default=0.1, metavar="RATIO",
                   help="the share of the scheduler's nodes that may be out (Slurm: drained, draining, down; "
                   "Kubernetes: cordoned, not Ready, tainted by gpuwarden) at once, by anyone, before a drain is "
                   "refused (default 0.1)")  # fmt: skip
    return p


_ratio = bounded(float, "a number above 0 and at most 1", high=1.0)


def run(args: argparse.Namespace) -> int:
    """Plan (and with ``--apply`` run) the drains and resumes (gpuwarden.cluster.drain, gpuwarden.cluster.kube); 1
    with one line when Prometheus cannot answer, the scheduler cannot with ``--apply`` or at a given ``--kube-api``,
    or an action failed. A dry run with no scheduler to ask (sinfo failing: no slurmctld; outside a pod without
    --kube-api) plans from Prometheus alone, said in one line."""
    from gpuwarden.cluster.bounds import Deadline
    from gpuwarden.cluster.drain import plan, reason_text
    from gpuwarden.cluster.quality import quality
    from gpuwarden.cluster.views import _ask
    from gpuwarden.terminal import brief

    deadline = Deadline(args.timeout)  # Prometheus and the API server answer within one --timeout together
    got = _ask(args, "drain", lambda acc: (quality(acc), acc.node_names(), acc.seen_throughout()), deadline)
    if got is None:
        return EXIT_RUNTIME
    found, names, seen_instances = got
    import httpx

    def node(cluster: tuple[str, ...], instance: str) -> str:
        return names.get((cluster, instance), "") or instance.rsplit(":", 1)[0]

    service: dict[str, dict[str, list[str]]] = {}
    for q in found:
        reasons = [text for tier, text in q.reasons if tier == "service"]
        if reasons:
            service.setdefault(node(q.cluster, q.instance), {})[q.gpu] = reasons
    scheduler: _Slurm | KubeApi | None = None
    try:
        scheduler = _scheduler(args, deadline)
        nodes = scheduler.nodes()
    except (RuntimeError, OSError, ValueError, httpx.HTTPError) as exc:
        if scheduler is not None:
            scheduler.close()
        where = f" (the API server {args.kube_api or 'in-cluster'})" if args.scheduler == "kubernetes" and (
            not isinstance(exc, ValueError) or args.kube_api) else ""  # fmt: skip
        if args.apply or args.kube_api:  # an API server given that does not answer is an outage, not a dry run's
            return die(f"drain: {exc}{where}")
        print(f"gpuwarden drain: the scheduler cannot be asked ({brief(exc, 300)}{where}): a dry run from Prometheus "
              "alone, the nodes it says need service; which are out already, the --max-out-ratio cap and the "
              "resumes need the scheduler, and --apply does", file=sys.stderr)  # fmt: skip
        rows = [{"action": "drain", "node": name, "reason": reason_text(gpus), "status": "planned", "error": None}
                for name, gpus in sorted(service.items())]  # fmt: skip
        _print_rows(args, rows)
        return 0
    seen = {node(c, i) for c, i in seen_instances}
    rows = _carried_out(plan(service, seen, nodes, args.max_out_ratio), scheduler, args.apply)
    scheduler.close()
    _print_rows(args, rows)
    if args.textfile:
        try:
            _write_textfile(args.textfile, args.scheduler, rows, nodes)
        except OSError as exc:
            return die(f"drain: --textfile {args.textfile}: {exc.strerror or exc}")
    return EXIT_RUNTIME if any(r["status"] == "failed" for r in rows) else 0


def _carried_out(actions: list[Action], scheduler: _Slurm | KubeApi, apply: bool) -> list[dict[str, Any]]:
    """Each action as a row (action, node, reason, status, error): a refusal is ``refused``; the rest with ``apply``
    run by the scheduler (``done``, or ``failed`` with its error), else ``planned``."""
    rows = []
    for a in actions:
        error = scheduler.apply(a) if apply else None  # a refusal runs nothing
        if a.kind == "refuse":
            status = "refused"
        elif not apply:
            status = "planned"
        else:
            status = "failed" if error else "done"
        rows.append({"action": a.kind, "node": a.node, "reason": a.reason, "status": status, "error": error})
    return rows


def _print_rows(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """The rows as JSON (``--json``) or one tab-separated line each, or a line saying there is nothing to do."""
    if args.json:
        print(json.dumps({"apply": args.apply, "scheduler": args.scheduler, "range": args.range, "actions": rows},
                         indent=2))  # fmt: skip
        return
    for r in rows:
        print(f"{r['action']}\t{r['node']}\t{r['status']}\t{r['reason']}" + (f"\t{r['error']}" if r["error"] else ""))
    if not rows:
        print(f"nothing to do: no node to drain or resume over the last {args.range}")


class _Slurm:
    """The drain's Slurm side: sinfo's nodes, scontrol's actions."""

    def nodes(self) -> Mapping[str, SchedulerNode]:
        """Slurm's nodes by name; RuntimeError or OSError when sinfo fails."""
        from gpuwarden.cluster.drain import sinfo

        return sinfo()

    def apply(self, action: Action) -> str | None:
        """scontrol's error, None when done."""
        from gpuwarden.cluster.drain import apply

        return apply(action)

    def close(self) -> None:
        """Nothing to close."""


def _scheduler(args: argparse.Namespace, deadline: Deadline) -> _Slurm | KubeApi:
    """The scheduler ``--scheduler`` names (the API server answering within ``deadline``). Raises ValueError (not in
    a pod without --kube-api) or OSError (a token file that cannot be read)."""
    if args.scheduler == "slurm":
        return _Slurm()
    from gpuwarden.cluster.kube import KubeApi
    from gpuwarden.kubelet.apiserver import SERVICE_ACCOUNT, in_cluster_address

    if args.kube_api:
        return KubeApi(args.kube_api, args.kube_token_file, args.kube_ca_file, deadline)
    try:
        address = in_cluster_address()
    except ValueError as exc:
        raise ValueError(f"{exc}: give the API server with --kube-api (e.g. kubectl proxy's http://127.0.0.1:8001)"
                         ) from None  # fmt: skip
    return KubeApi(address, args.kube_token_file or str(SERVICE_ACCOUNT / "token"),
                   args.kube_ca_file or str(SERVICE_ACCOUNT / "ca.crt"), deadline)  # fmt: skip


def _write_textfile(path: str, scheduler: str, rows: list[dict[str, Any]], nodes: Mapping[str, SchedulerNode]) -> None:
    """The run as metrics in the text format at ``path`` (prometheus_client.write_to_textfile: a temporary file renamed
    over it): each decision (``gpuwarden_drain_decision``, 1 a node acted on or refused, with the action and its
    status), the count of each (``gpuwarden_drain_actions``), the nodes gpuwarden holds out after the run and the
    scheduler's nodes, and the run's time. Raises OSError."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    reg = CollectorRegistry()
    decision = Gauge("gpuwarden_drain_decision", "A node gpuwarden drain acted on or refused in its last run (1), "
                     "with the action (drain, resume, refuse) and its status (planned, done, failed, refused).",
                     ["scheduler", "node", "action", "status"], registry=reg)  # fmt: skip
    count = Gauge("gpuwarden_drain_actions", "Decisions of gpuwarden drain's last run, by action and status.",
                  ["scheduler", "action", "status"], registry=reg)  # fmt: skip
    held = Gauge("gpuwarden_drain_nodes_held_out", "Nodes gpuwarden holds out of the scheduler after its last run "
                 "(drained or tainted by it, not resumed).", ["scheduler"], registry=reg)  # fmt: skip
    known = Gauge("gpuwarden_drain_nodes", "The scheduler's nodes gpuwarden drain saw in its last run.",
                  ["scheduler"], registry=reg)  # fmt: skip
    last = Gauge("gpuwarden_drain_last_run_timestamp_seconds", "When gpuwarden drain last ran (Unix time).",
                 ["scheduler"], registry=reg)  # fmt: skip
    counts: dict[tuple[str, str], int] = {}
    for r in rows:
        decision.labels(scheduler, r["node"], r["action"], r["status"]).set(1)
        counts[(r["action"], r["status"])] = counts.get((r["action"], r["status"]), 0) + 1
    for (action, status), n in counts.items():
        count.labels(scheduler, action, status).set(n)
    done = {r["node"]: r["action"] for r in rows if r["status"] == "done"}
    ours = {name for name, n in nodes.items() if n.out and n.ours}
    ours = (ours | {n for n, a in done.items() if a == "drain"}) - {n for n, a in done.items() if a == "resume"}
    held.labels(scheduler).set(len(ours))
    known.labels(scheduler).set(len(nodes))
    last.labels(scheduler).set_to_current_time()
    write_to_textfile(path, reg)
