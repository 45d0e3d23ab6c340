"""The fail-slow suspects as an exclude list for the scheduler: Slurm (``--exclude`` and a drain) or Kubernetes (a
taint), printed as commands for the operator to review and run - gpuwarden proposes, it does not act.

Node names come from Prometheus (the ``nodename`` label of ``gpu_devices``) and so are hostile input: a name that
is not a valid node name of that scheduler is left out with a comment saying so, never pasted into a command.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpuwarden.cluster.suspects import Suspect

#: A Slurm node name (NodeName: letters, digits, '-', '_', '.') and a Kubernetes one (an RFC 1123 subdomain).
SLURM_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
K8S_NODE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
#: The taint key gpuwarden proposes for a suspect node.
TAINT_KEY = "gpuwarden.io/fail-slow"


def _by_node(found: Sequence[tuple[Suspect, str]]) -> dict[str, list[Suspect]]:
    """The suspects grouped by their node's name, in the order found."""
    nodes: dict[str, list[Suspect]] = {}
    for s, node in found:
        nodes.setdefault(node, []).append(s)
    return nodes


def _why(gpus: list[Suspect]) -> str:
    """Why a node is listed, in one line: each suspect GPU, its jobs and evidence."""
    parts = []
    for s in gpus:
        evidence = f" ({', '.join(s.evidence)})" if s.evidence else ""
        parts.append(f"GPU {s.gpu} the straggler of {s.jobs} jobs{evidence}")
    return "; ".join(parts)


def exclude_list(found: Sequence[tuple[Suspect, str]], scheduler: str, window: str) -> str:
    """Return the commands that keep jobs off the suspects' nodes (``found``: each suspect with its node's name;
    ``scheduler``: ``slurm`` or ``k8s``; ``window``: the range they were found over, for the comments). Raises
    ValueError for another scheduler."""
    if scheduler not in ("slurm", "k8s"):
        raise ValueError(f"unknown scheduler {scheduler!r}: slurm or k8s")
    valid = SLURM_NODE if scheduler == "slurm" else K8S_NODE
    lines = [f"# gpuwarden fail-slow suspects over the last {window}: review before running"]
    good: list[str] = []
    for node, suspects in _by_node(found).items():
        if not valid.match(node):
            lines.append(f"# left out: {node[:80]!r} is not a valid {scheduler} node name".replace("\n", " "))
            continue
        good.append(node)
        lines.append(f"# {node}: {_why(suspects)}".replace("\n", " "))
    if not good:
        lines.append("# no node to exclude")
        return "\n".join(lines) + "\n"
    if scheduler == "slurm":
        nodes = ",".join(good)
        lines.append(f"# new jobs: sbatch --exclude={nodes} ...")
        lines.append(f'scontrol update NodeName={nodes} State=DRAIN Reason="gpuwarden fail-slow suspect"')
    else:
        for node in good:
            gpus = "_".join(s.gpu for s in _by_node(found)[node] if s.gpu.isdigit())[:63]
            lines.append(f"kubectl taint nodes {node} {TAINT_KEY}=gpu{gpus}:NoSchedule --overwrite")
    return "\n".join(lines) + "\n"
