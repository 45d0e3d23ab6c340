"""``gpuwarden drain``: take the nodes of GPUs that need service out of the scheduler (a Slurm drain, or a Kubernetes
taint and node condition), and put them back once clean (from Prometheus; a dry run unless ``--apply``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from gpuwarden.cluster.drain import Action, SchedulerNode
from gpuwarden.commands import COMMANDS, EXIT_RUNTIME, Subparsers, die
from gpuwarden.commands._prometheus import add_common, bounded

if TYPE_CHECKING:
    from gpuwarden.cluster.bounds import Deadline
    from gpuwarden.cluster.dra import DeviceAction, TaintRule
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
        choices=("slurm", "kubernetes", "dra"),
        default="slurm",
        help="whose nodes: slurm (sinfo, scontrol; default), kubernetes (a node taint and condition, through the API "
        "server) or dra (a DRA DeviceTaintRule for each GPU: only the bad GPU is kept out; Kubernetes 1.36+)",
    )
    p.add_argument(
        "--dra-driver",
        dest="dra_driver",
        default="gpu.nvidia.com",
        metavar="NAME",
        help="dra: the DRA driver whose ResourceSlices publish the GPUs (default gpu.nvidia.com, NVIDIA's)",
    )
    p.add_argument(
        "--dra-effect",
        dest="dra_effect",
        choices=("NoSchedule", "NoExecute"),
        default="NoSchedule",
        help="dra: the effect of a GPU that needs service (NoSchedule: no new claim gets it, default; "
        "NoExecute: its pods are evicted too). A GPU worth watching gets the effect None",
    )
    p.add_argument(
        "--max-node-out-ratio",
        dest="max_node_out_ratio",
        type=_ratio,
        default=0.5,
        metavar="RATIO",
        help="dra: the share of a node's GPUs that may be out at once before a GPU's drain is refused "
        "(default 0.5; past it, drain the node: --scheduler kubernetes)",
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
                   "refused; dra: of the driver's GPUs under a NoSchedule or NoExecute taint (default 0.1)",
                   )  # fmt: skip
    return p


_ratio = bounded(float, "a number above 0 and at most 1", high=1.0)


def run(args: argparse.Namespace) -> int:
    """Plan (and with ``--apply`` run) the drains and resumes (gpuwarden.cluster.drain, gpuwarden.cluster.kube,
    gpuwarden.cluster.dra); 1 with one line when Prometheus cannot answer, the scheduler cannot with ``--apply`` or
    at a given ``--kube-api``, or an action failed. A dry run with no scheduler to ask (sinfo failing: no slurmctld;
    outside a pod without --kube-api) plans from Prometheus alone, said in one line."""
    from gpuwarden.cluster.bounds import Deadline
    from gpuwarden.cluster.quality import quality
    from gpuwarden.cluster.views import _ask

    deadline = Deadline(args.timeout)  # Prometheus and the API server answer within one --timeout together
    got = _ask(args, "drain", lambda acc: (quality(acc), acc.node_names(), acc.seen_throughout()), deadline)
    if got is None:
        return EXIT_RUNTIME
    found, names, seen_instances = got
    import httpx

    need = _Needs(found, names, seen_instances)
    scheduler: _Slurm | KubeApi | None = None
    try:
        scheduler = _scheduler(args, deadline)
        rows, held, known = _acted(args, scheduler, need)
    except (RuntimeError, OSError, ValueError, httpx.HTTPError) as exc:
        return _without_scheduler(args, exc, need)
    finally:
        if scheduler is not None:
            scheduler.close()
    _print_rows(args, rows)
    if args.textfile:
        try:
            _write_textfile(args.textfile, args.scheduler, rows, held, known)
        except OSError as exc:
            return die(f"drain: --textfile {args.textfile}: {exc.strerror or exc}")
    return EXIT_RUNTIME if any(r["status"] == "failed" for r in rows) else 0


class _Needs:
    """What Prometheus says needs the scheduler: ``service`` (node -> GPU index -> its service reasons), ``needs``
    (every GPU with a UUID, its reasons of both tiers and whether seen over the whole range: the DRA plan's) and
    ``seen`` (the nodes seen over the whole range), node names from the daemons' ``nodename`` (else the instance's
    host)."""

    def __init__(self, found: Sequence[Any], names: Mapping[tuple[tuple[str, ...], str], str],
                 seen_instances: set[tuple[tuple[str, ...], str]]) -> None:  # fmt: skip
        from gpuwarden.cluster.dra import GpuNeed

        def node(cluster: tuple[str, ...], instance: str) -> str:
            return names.get((cluster, instance), "") or instance.rsplit(":", 1)[0]

        self.service: dict[str, dict[str, list[str]]] = {}
        self.needs: list[GpuNeed] = []
        for q in found:
            reasons = {t: [text for tier, text in q.reasons if tier == t] for t in ("service", "watch")}
            if reasons["service"]:
                self.service.setdefault(node(q.cluster, q.instance), {})[q.gpu] = reasons["service"]
            if q.uuid:
                seen = (q.cluster, q.instance) in seen_instances
                self.needs.append(GpuNeed(node(q.cluster, q.instance), q.gpu, q.uuid, reasons["service"],
                                          reasons["watch"], seen))  # fmt: skip
        self.seen = {node(c, i) for c, i in seen_instances}


def _acted(
    args: argparse.Namespace, scheduler: _Slurm | KubeApi, need: _Needs
) -> tuple[list[dict[str, Any]], int, int]:
    """Ask ``scheduler`` for its nodes (DRA: devices and rules), plan, and with ``--apply`` act: the rows, the units
    gpuwarden holds out after the run and the units the scheduler has. Raises what asking the scheduler raises."""
    from gpuwarden.cluster.dra import DraApi
    from gpuwarden.cluster.dra import plan as plan_devices
    from gpuwarden.cluster.drain import plan

    if isinstance(scheduler, DraApi):
        devices, rules = scheduler.devices(), scheduler.rules()
        actions = plan_devices(need.needs, devices, rules, args.max_out_ratio, args.max_node_out_ratio,
                               args.dra_effect)  # fmt: skip
        rows = _carried_out(actions, scheduler.apply_device, args.apply)
        return rows, _dra_held(rows, rules), len(devices)
    nodes = scheduler.nodes()
    rows = _carried_out(plan(need.service, need.seen, nodes, args.max_out_ratio), scheduler.apply, args.apply)
    return rows, _nodes_held(rows, nodes), len(nodes)


def _without_scheduler(args: argparse.Namespace, exc: Exception, need: _Needs) -> int:
    """The scheduler could not be asked (``exc``): 1 with one line where that is an outage (``--apply``, or an API
    server given), else a dry run from Prometheus alone, said in one line, and 0."""
    from gpuwarden.cluster.dra import WATCH, DeviceAction
    from gpuwarden.cluster.drain import reason_text
    from gpuwarden.terminal import brief

    where = f" (the API server {args.kube_api or 'in-cluster'})" if args.scheduler != "slurm" and (
        not isinstance(exc, ValueError) or args.kube_api) else ""  # fmt: skip
    if args.apply or args.kube_api:  # an API server given that does not answer is an outage, not a dry run's
        return die(f"drain: {exc}{where}")
    print(f"gpuwarden drain: the scheduler cannot be asked ({brief(exc, 300)}{where}): a dry run from Prometheus "
          "alone, what it says needs service; which are out already, the --max-out-ratio cap and the "
          "resumes need the scheduler, and --apply does", file=sys.stderr)  # fmt: skip
    if args.scheduler == "dra":
        blind = [DeviceAction("drain" if n.service else "watch", n.node, n.gpu, n.uuid,
                              args.dra_effect if n.service else WATCH, reason_text({n.gpu: n.service or n.watch}))
                 for n in need.needs if n.service or n.watch]  # fmt: skip
        rows = [_row(a, "planned", None) for a in blind]
    else:
        rows = [{"action": "drain", "node": name, "reason": reason_text(gpus), "status": "planned", "error": None}
                for name, gpus in sorted(need.service.items())]  # fmt: skip
    _print_rows(args, rows)
    return 0


def _carried_out(actions: Sequence[Action | DeviceAction], apply_one: Callable[[Any], str | None],
                 apply: bool) -> list[dict[str, Any]]:  # fmt: skip
    """Each action as a row (``_row``): a refusal is ``refused``; the rest with ``apply`` run by ``apply_one`` (the
    scheduler's: its error or None; ``done``, or ``failed`` with its error), else ``planned``."""
    rows = []
    for a in actions:
        error = apply_one(a) if apply else None  # a refusal runs nothing
        if a.kind == "refuse":
            status = "refused"
        elif not apply:
            status = "planned"
        else:
            status = "failed" if error else "done"
        rows.append(_row(a, status, error))
    return rows


def _row(a: Action | DeviceAction, status: str, error: str | None) -> dict[str, Any]:
    """One decision as printed and written: action, node, reason, status, error; for a GPU (DRA) also its index,
    UUID, the rule's name and the effect set."""
    from gpuwarden.cluster.dra import DeviceAction

    row: dict[str, Any] = {"action": a.kind, "node": a.node}
    if isinstance(a, DeviceAction):
        row |= {"gpu": a.gpu, "uuid": a.uuid, "rule": a.rule, "effect": a.effect or None}
    return row | {"reason": a.reason, "status": status, "error": error}


def _print_rows(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """The rows as JSON (``--json``) or one tab-separated line each, or a line saying there is nothing to do."""
    if args.json:
        print(json.dumps({"apply": args.apply, "scheduler": args.scheduler, "range": args.range, "actions": rows},
                         indent=2))  # fmt: skip
        return
    for r in rows:
        where = f"{r['node']} GPU {r['gpu']}" if "gpu" in r else r["node"]
        effect = f" ({r['effect']})" if r.get("effect") else ""
        print(
            f"{r['action']}{effect}\t{where}\t{r['status']}\t{r['reason']}" + (f"\t{r['error']}" if r["error"] else "")
        )
    if not rows:
        what = "GPU to taint or untaint" if args.scheduler == "dra" else "node to drain or resume"
        print(f"nothing to do: no {what} over the last {args.range}")


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
    """The scheduler ``--scheduler`` names (the API server answering within ``deadline``; for ``dra`` a DraApi of
    ``--dra-driver``). Raises ValueError (not in a pod without --kube-api) or OSError (a token file that cannot be
    read)."""
    if args.scheduler == "slurm":
        return _Slurm()
    from gpuwarden.cluster.dra import DraApi
    from gpuwarden.cluster.kube import KubeApi
    from gpuwarden.kubelet.apiserver import SERVICE_ACCOUNT, in_cluster_address

    kind = KubeApi if args.scheduler == "kubernetes" else partial(DraApi, driver=args.dra_driver)
    if args.kube_api:
        return kind(args.kube_api, args.kube_token_file, args.kube_ca_file, deadline)
    try:
        address = in_cluster_address()
    except ValueError as exc:
        raise ValueError(f"{exc}: give the API server with --kube-api (e.g. kubectl proxy's http://127.0.0.1:8001)"
                         ) from None  # fmt: skip
    return kind(address, args.kube_token_file or str(SERVICE_ACCOUNT / "token"),
                args.kube_ca_file or str(SERVICE_ACCOUNT / "ca.crt"), deadline)  # fmt: skip


def _nodes_held(rows: list[dict[str, Any]], nodes: Mapping[str, SchedulerNode]) -> int:
    """The nodes gpuwarden holds out after the run: those out by it before, and drained now, less those resumed."""
    done = {r["node"]: r["action"] for r in rows if r["status"] == "done"}
    ours = {name for name, n in nodes.items() if n.out and n.ours}
    ours = (ours | {n for n, a in done.items() if a == "drain"}) - {n for n, a in done.items() if a == "resume"}
    return len(ours)


def _dra_held(rows: list[dict[str, Any]], rules: Sequence[TaintRule]) -> int:
    """The GPUs gpuwarden's rules hold out of scheduling (NoSchedule, NoExecute) after the run: those before, with
    the run's done changes."""
    from gpuwarden.cluster.dra import OUT_EFFECTS

    out = {r.name for r in rules if r.ours and r.effect in OUT_EFFECTS}
    for r in rows:
        if r["status"] == "done":
            if r["action"] == "drain":
                out.add(r["rule"])
            elif r["action"] in ("watch", "resume"):
                out.discard(r["rule"])
    return len(out)


def _write_textfile(path: str, scheduler: str, rows: list[dict[str, Any]], held_out: int, known_units: int) -> None:
    """The run as metrics in the text format at ``path`` (prometheus_client.write_to_textfile: a temporary file renamed
    over it): each decision (``gpuwarden_drain_decision``, 1 a node, or for ``dra`` a node's GPU (label ``gpu``),
    acted on or refused, with the action and its status), the count of each (``gpuwarden_drain_actions``), the nodes
    (``dra``: GPUs) gpuwarden holds out after the run (``held_out``) and those the scheduler has (``known_units``),
    and the run's time. Raises OSError."""
    from prometheus_client import CollectorRegistry, Gauge, write_to_textfile

    unit = "gpus" if scheduler == "dra" else "nodes"
    where = ["node", "gpu"] if scheduler == "dra" else ["node"]
    reg = CollectorRegistry()
    decision = Gauge("gpuwarden_drain_decision", "A node (dra: a node's GPU) gpuwarden drain acted on or refused in "
                     "its last run (1), with the action (drain, watch, resume, refuse) and its status (planned, done, "
                     "failed, refused).", ["scheduler", *where, "action", "status"], registry=reg)  # fmt: skip
    count = Gauge("gpuwarden_drain_actions", "Decisions of gpuwarden drain's last run, by action and status.",
                  ["scheduler", "action", "status"], registry=reg)  # fmt: skip
    held = Gauge(f"gpuwarden_drain_{unit}_held_out", f"{unit.capitalize()} gpuwarden holds out of the scheduler "
                 "after its last run (drained or tainted by it, not resumed).", ["scheduler"],
                 registry=reg)  # fmt: skip
    seen = " (the DRA driver's devices)." if unit == "gpus" else "."
    known = Gauge(f"gpuwarden_drain_{unit}", f"The scheduler's {unit} gpuwarden drain saw in its last run{seen}",
                  ["scheduler"], registry=reg)  # fmt: skip
    last = Gauge("gpuwarden_drain_last_run_timestamp_seconds", "When gpuwarden drain last ran (Unix time).",
                 ["scheduler"], registry=reg)  # fmt: skip
    counts: dict[tuple[str, str], int] = {}
    for r in rows:
        decision.labels(scheduler, *(r[w] for w in where), r["action"], r["status"]).set(1)
        counts[(r["action"], r["status"])] = counts.get((r["action"], r["status"]), 0) + 1
    for (action, status), n in counts.items():
        count.labels(scheduler, action, status).set(n)
    held.labels(scheduler).set(held_out)
    known.labels(scheduler).set(known_units)
    last.labels(scheduler).set_to_current_time()
    write_to_textfile(path, reg)
