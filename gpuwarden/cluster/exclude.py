"""The fail-slow suspects as an exclude list for the scheduler: Slurm (``--exclude`` and a drain) or Kubernetes (a
taint), printed as commands for the operator to review and run - gpuwarden proposes, it does not act.

Node names come from Prometheus (the ``nodename`` label of ``gpu_devices``) and so are hostile input: a name that
is not a valid node name of that scheduler is left out with a comment saying so, never pasted into a command.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from gpuwarden.cluster.suspects import Suspect

#: A Slurm node name (NodeName: letters, digits, '-', '_', '.') and a Kubernetes one (an RFC 1123 subdomain).
SLURM_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
K8S_NODE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
#: The taint key gpuwarden proposes for a suspect node, and for a node with a GPU that needs service.
TAINT_KEY = "gpuwarden.io/fail-slow"
SERVICE_TAINT_KEY = "gpuwarden.io/gpu-service"


@dataclass(frozen=True)
class Listed:
    """A GPU to keep jobs away from: its node's name, its index and why (one sentence)."""

    node: str
    gpu: str
    why: str


def from_suspects(found: Sequence[tuple[Suspect, str]]) -> list[Listed]:
    """The fail-slow suspects (each with its node's name) as Listed GPUs: the straggler of how many jobs, and the
    evidence on the node."""
    out = []
    for s, node in found:
        evidence = f" ({', '.join(s.evidence)})" if s.evidence else ""
        out.append(Listed(node, s.gpu, f"GPU {s.gpu} the straggler of {s.jobs} jobs{evidence}"))
    return out


def exclude_list(
    listed: Sequence[Listed],
    scheduler: str,
    window: str,
    what: str = "fail-slow suspects",
    drain_reason: str = "gpuwarden fail-slow suspect",
    taint_key: str = TAINT_KEY,
) -> str:
    """Return the commands that keep jobs off the nodes of the ``listed`` GPUs (``scheduler``: ``slurm`` or ``k8s``;
    ``window``: the range they were found over, and ``what`` they are, for the comments; ``drain_reason`` and
    ``taint_key``: what the drain says and the taint is keyed by). Raises ValueError for another scheduler."""
    if scheduler not in ("slurm", "k8s"):
        raise ValueError(f"unknown scheduler {scheduler!r}: slurm or k8s")
    valid = SLURM_NODE if scheduler == "slurm" else K8S_NODE
    lines = [f"# gpuwarden {what} over the last {window}: review before running"]
    nodes: dict[str, list[Listed]] = {}
    for entry in listed:
        nodes.setdefault(entry.node, []).append(entry)
    good: list[str] = []
    for node, gpus in nodes.items():
        if not valid.match(node):
            lines.append(f"# left out: {node[:80]!r} is not a valid {scheduler} node name".replace("\n", " "))
            continue
        good.append(node)
        lines.append(f"# {node}: {'; '.join(g.why for g in gpus)}".replace("\n", " "))
    if not good:
        lines.append("# no node to exclude")
        return "\n".join(lines) + "\n"
    if scheduler == "slurm":
        joined = ",".join(good)
        lines.append(f"# new jobs: sbatch --exclude={joined} ...")
        lines.append(f'scontrol update NodeName={joined} State=DRAIN Reason="{drain_reason}"')
    else:
        for node in good:
            indices = "_".join(g.gpu for g in nodes[node] if g.gpu.isdigit())[:63]
            lines.append(f"kubectl taint nodes {node} {taint_key}=gpu{indices}:NoSchedule --overwrite")
    return "\n".join(lines) + "\n"
