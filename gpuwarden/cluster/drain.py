"""Health out to the scheduler: drain the nodes whose GPUs need service, and resume them once their GPUs are clean.

``gpuwarden drain`` asks Prometheus for each GPU's quality over a recent range (gpuwarden.cluster.quality: lost,
critical XIDs, uncorrectable ECC, failed remaps, NVLink links down, fabric), asks the scheduler for its nodes (Slurm:
``sinfo``, this module; Kubernetes: the API server, gpuwarden.cluster.kube), and plans per node (``plan``, the same
for both; Slurm's words below):

- **drain** a node with a GPU in the service tier over the range that Slurm lists as neither drained nor down, with
  the reason ``gpuwarden: GPU N: <reasons>`` (``scontrol update NodeName=... State=DRAIN Reason=...``);
- **resume** a node gpuwarden drained (its reason begins ``gpuwarden:``) whose GPUs were seen over the whole range
  and are no longer in the service tier (``State=RESUME``): a run every few minutes over a range of an hour is
  "clean checks for an hour"; a node that sends no data is never resumed (nothing known is not clean);
- **refuse** a drain that would take more than ``max_out_ratio`` of Slurm's nodes out at once (drained, draining or
  down, by anyone), so that a fault in gpuwarden or in Prometheus cannot empty the cluster.

A node another tool or a person drained is never resumed. Node names come from Prometheus (``gpu_devices{nodename}``,
the daemons' node_name): only a name Slurm lists exactly is acted on, and every command is an argument list run
without a shell. Reasons are printable ASCII, at most REASON_CHARS.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

#: The prefix of every reason gpuwarden sets: how a later run knows its own drains.
PREFIX = "gpuwarden:"
#: Longest reason set (Slurm keeps the reason whole; sinfo shows it in a column).
REASON_CHARS = 160
#: Slurm node states that are out of service already (sinfo %T, without its suffixes).
OUT_STATES = frozenset({"drained", "draining", "drain", "down", "fail", "failing", "maint", "reboot", "future"})
_SAFE = re.compile(r"[^ -~]")


class SchedulerNode(Protocol):
    """A node as its scheduler lists it: out of service or not, and whether gpuwarden took it out."""

    @property
    def out(self) -> bool:
        """Whether the node is out of service (drained, down, cordoned, tainted by gpuwarden, ...)."""

    @property
    def ours(self) -> bool:
        """Whether gpuwarden took it out (a later run may put it back)."""


@dataclass(frozen=True)
class SlurmNode:
    """A node as ``sinfo`` lists it: its state (``%T``) and its reason (``%E``, ``none`` without one)."""

    name: str
    state: str
    reason: str

    @property
    def out(self) -> bool:
        """Whether the node is out of service (drained, draining, down, ...)."""
        return any(part in OUT_STATES for part in re.split(r"[+*~#!%$@^-]", self.state.lower()) if part)

    @property
    def ours(self) -> bool:
        """Whether gpuwarden set its reason (a drain of ours)."""
        return self.reason.startswith(PREFIX)


@dataclass(frozen=True)
class Action:
    """One decision: ``kind`` drain, resume or refuse, on ``node``, with the reason (drain, refuse: the GPUs'; resume:
    why it is clean)."""

    kind: str
    node: str
    reason: str


def reason_text(gpus: Mapping[str, Sequence[str]]) -> str:
    """``gpuwarden: GPU 0: r1, r2; GPU 3: r3`` from the service reasons of each GPU (index -> reasons), printable
    ASCII only, cut at REASON_CHARS."""
    body = "; ".join(f"GPU {gpu}: {', '.join(rs)}" for gpu, rs in sorted(gpus.items()))
    text = _SAFE.sub("?", f"{PREFIX} {body}")
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 3] + "..."


def plan(
    service: Mapping[str, Mapping[str, Sequence[str]]],
    seen: Iterable[str],
    nodes: Mapping[str, SchedulerNode],
    max_out_ratio: float,
) -> list[Action]:
    """The actions for the scheduler's nodes ``nodes`` (name -> SlurmNode or gpuwarden.cluster.kube.KubeNode), given
    each node's GPUs in the service tier over the range with their reasons (``service``: node -> GPU index ->
    reasons) and the nodes with data over the whole range (``seen``): see the module. Drains are taken in name order
    until the cap; names the scheduler does not list are left out."""
    out = sum(1 for n in nodes.values() if n.out)
    cap = int(max_out_ratio * len(nodes))
    actions: list[Action] = []
    for name in sorted(service):
        node = nodes.get(name)
        if node is None or node.out or not service[name]:
            continue
        reason = reason_text(service[name])
        if out + 1 > cap:
            actions.append(Action("refuse", name, f"{reason} (would take {out + 1} of {len(nodes)} nodes out, "
                                                  f"more than max_out_ratio {max_out_ratio:g})"))  # fmt: skip
            continue
        out += 1
        actions.append(Action("drain", name, reason))
    clean = set(seen) - {n for n, gpus in service.items() if gpus}
    for name in sorted(clean):
        node = nodes.get(name)
        if node is not None and node.out and node.ours:
            actions.append(Action("resume", name, "its GPUs were clean over the range"))
    return actions


def sinfo() -> dict[str, SlurmNode]:
    """Slurm's nodes (``sinfo -h -N -o %N|%T|%E``), by name. Raises RuntimeError with sinfo's message when it
    fails."""
    done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N|%T|%E"], capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"sinfo failed: {done.stderr.strip()[:200] or done.returncode}")
    nodes: dict[str, SlurmNode] = {}
    for line in done.stdout.splitlines():
        name, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        if name:
            nodes[name] = SlurmNode(name, state.strip(), reason.strip())
    return nodes


def apply(action: Action) -> str | None:
    """Run ``action`` with scontrol (drain: State=DRAIN with its reason; resume: State=RESUME); None when done, else
    scontrol's error. A refusal runs nothing."""
    if action.kind == "refuse":
        return None
    cmd = ["scontrol", "update", f"NodeName={action.node}"]
    cmd += ["State=DRAIN", f"Reason={action.reason}"] if action.kind == "drain" else ["State=RESUME"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    return None if done.returncode == 0 else (done.stderr.strip()[:200] or f"exit {done.returncode}")
