"""Job attribution: which job a GPU process belongs to, from its cgroup path, user and command.

Only what ``ProcessReading`` already holds is used (host PID, cgroup path from /proc/PID/cgroup, user,
process name); nothing is read here. Recognised, in this order (first match wins):

============== ============================================================== =========================
kind           cgroup path shape (cgroup v2 and v1, systemd and cgroupfs)     job id
============== ============================================================== =========================
``kubernetes`` ``.../kubepods...-pod<UID>.slice/...`` or ``/kubepods/.../pod<UID>/<id>`` pod UID (dashes)
``slurm``      ``.../job_<N>/...`` under ``slurm`` or ``slurmstepd.scope``     Slurm job id
``slurm``      ``.../slurmstepd.scope/<SLUID>/...`` (Slurm 26.05's default)   the job's SLUID
``slurm``      any other path, with ``SLURM_JOB_ID`` in the process environment  Slurm job id
``container``  ``docker-<id>.scope``, ``/docker/<id>``, ``cri-containerd-``,   container id, 12 hex chars
               ``crio-``, ``libpod-<id>.scope``, ``/containerd/.../<id>``
``systemd``    ``/system.slice/<unit>.service`` (or any ``.service`` leaf)     unit name
``cgroup``     any other cgroup below the root (not a login session)          the cgroup path
``process``    root cgroup, a login session scope, or no cgroup               ``user/command``
============== ============================================================== =========================

Kubernetes pod name, namespace and container name need the kubelet pod-resources socket or the API
server; they are not looked up (TODO in docs/scores.md): the pod UID joins with kube-state-metrics'
``kube_pod_info{uid}``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuwarden.model import PodAssignment, ProcessReading

#: Job kinds, a bounded label value set.
JOB_KINDS = ("kubernetes", "slurm", "container", "systemd", "cgroup", "process")

#: Job kinds whose ids name the same job on every node of a cluster (a pod UID, a Slurm job id); the others
#: (container, systemd unit, cgroup path, user/command) repeat on every node and name a job of one node only.
CLUSTER_JOB_KINDS = frozenset({"kubernetes", "slurm"})


def job_scope(kind: str) -> str:
    """``cluster`` for a kind in CLUSTER_JOB_KINDS (its id may join across nodes), else ``node``."""
    return "cluster" if kind in CLUSTER_JOB_KINDS else "node"


#: Longest label value kept (cgroup paths and commands are cut here to bound label size).
MAX_LABEL_CHARS = 128

_HEX_ID = r"[0-9a-f]{12,64}"
_POD_SYSTEMD = re.compile(r"kubepods[^/]*-pod([0-9a-f_]{36})\.slice")
_POD_CGROUPFS = re.compile(r"/kubepods(?:/[a-z]+)?/pod([0-9a-f-]{36})(?:/|$)")
_CONTAINER = re.compile(
    rf"(?:docker-|cri-containerd-|crio-|libpod-|containerd-)({_HEX_ID})(?:\.scope)?(?:/|$)"
    rf"|/(?:docker|containerd|libpod|crio)/(?:[^/]+/)*?({_HEX_ID})(?:/|$)"
)
_POD_CONTAINER = re.compile(rf"/({_HEX_ID})(?:\.scope)?(?:/|$)")
_SLURM = re.compile(r"(?:slurm[^/]*)/(?:[^/]+/)*?job_(\d+)(?:/|$)")
#: Slurm 26.05 names a job's cgroup by its SLUID (``s`` and Crockford base32, e.g. ``sEKNKTV3WPV500``) unless
#: ``CgroupJobIdPaths=yes``: ``/system.slice/slurmstepd.scope/<SLUID>/step_0/user/task_0``. The SLUID is unique in the
#: cluster, so the job joins across nodes as a job id does; the epilog has it as ``SLURM_JOB_SLUID``.
_SLUID = re.compile(r"(?:slurm[^/]*)/(s[0-9A-HJKMNP-TV-Z]{8,26})(?:/|$)")
_UNIT = re.compile(r"/([^/]+\.service)(?:/|$)")
_SESSION = re.compile(r"/session-[^/]+\.scope$|^/user\.slice(?:/[^/]+\.slice)?/?$")


@dataclass(frozen=True, slots=True)
class JobRef:
    """The job a process belongs to.

    ``kind`` is one of JOB_KINDS; ``job`` the job id (see the module table), at most MAX_LABEL_CHARS
    characters; ``container_id`` the 12-character container id where the cgroup names one, else "".
    """

    kind: str
    job: str
    container_id: str = ""


def _cut(s: str) -> str:
    return s if len(s) <= MAX_LABEL_CHARS else s[: MAX_LABEL_CHARS - 1] + "…"


def _container_id(path: str) -> str:
    m = _CONTAINER.search(path)
    if m:
        return (m.group(1) or m.group(2))[:12]
    return ""


def fallback_job(user: str | None, command: str | None) -> JobRef:
    """Return the ``process`` job ``user/command`` ("?" for what is unknown)."""
    return JobRef("process", _cut(f"{user or '?'}/{command or '?'}"))


def attribute_cgroup(cgroup: str | None, user: str | None = None, command: str | None = None) -> JobRef:
    """Return the job of a process whose cgroup path is ``cgroup`` (see the module table).

    ``user`` and ``command`` name the ``process`` fallback job. Never raises: an unrecognised or
    missing path falls back to ``cgroup`` or ``process``.
    """
    if not cgroup or cgroup == "/":
        return fallback_job(user, command)
    path = cgroup if cgroup.startswith("/") else "/" + cgroup
    m = _POD_SYSTEMD.search(path)
    if m:
        uid = m.group(1).replace("_", "-")
        cid = _container_id(path)
        return JobRef("kubernetes", uid, cid)
    m = _POD_CGROUPFS.search(path)
    if m:
        rest = path[m.end() - 1 :] if path[m.end() - 1 : m.end()] == "/" else ""
        c = _POD_CONTAINER.search(rest) if rest else None
        return JobRef("kubernetes", m.group(1), c.group(1)[:12] if c else "")
    m = _SLURM.search(path) or _SLUID.search(path)
    if m:
        return JobRef("slurm", m.group(1))
    cid = _container_id(path)
    if cid:
        return JobRef("container", cid, cid)
    m = _UNIT.search(path)
    if m and "user@" not in m.group(1):
        return JobRef("systemd", _cut(m.group(1)))
    if m and "user@" in m.group(1):
        # a user's own service manager: the innermost unit, if any, below user@UID.service
        inner = [u for u in re.findall(r"/([^/]+\.service)", path) if "user@" not in u]
        if inner:
            return JobRef("systemd", _cut(inner[-1]))
        return fallback_job(user, command)
    if _SESSION.search(path):
        return fallback_job(user, command)
    return JobRef("cgroup", _cut(path))


def attribute(proc: ProcessReading) -> JobRef:
    """Return the job of one GPU process: from its cgroup path when that names a pod or a Slurm job (its id, or its
    SLUID: never replaced by the environment's SLURM_JOB_ID, so that a node that can read the environment and one
    that cannot key the job alike), else from its SLURM_JOB_ID (a Slurm node without the cgroup plugin's job
    paths), else from its cgroup path, user and command."""
    ref = attribute_cgroup(proc.cgroup, proc.username, proc.name)
    if ref.kind not in CLUSTER_JOB_KINDS and proc.slurm_job_id:
        return JobRef("slurm", proc.slurm_job_id)
    return ref


_NUMERIC_JOB = re.compile(r"[0-9]{1,20}")


def slurm_job_number(ref: JobRef, proc: ProcessReading) -> str:
    """The numeric Slurm job id of a ``slurm`` job, '' for any other kind or when unknown: the job id itself when it
    is numeric, else (a job keyed by its SLUID) the process's SLURM_JOB_ID when its environment was readable and the
    value is a plain number (anything else in the environment is not trusted). Lets ``report --job`` find a
    SLUID-keyed job by the number users know."""
    if ref.kind != "slurm":
        return ""
    for candidate in (ref.job, proc.slurm_job_id or ""):
        if _NUMERIC_JOB.fullmatch(candidate):
            return candidate
    return ""


@dataclass(frozen=True, slots=True)
class PodNames:
    """The Kubernetes names of a process's pod: namespace, pod, and container ("" when the pod has several containers
    on the GPU and the process's own is unknown)."""

    namespace: str
    pod: str
    container: str = ""


def pod_of(ref: JobRef, proc: ProcessReading, pods: list[PodAssignment]) -> PodNames | None:
    """The pod of a ``kubernetes`` process among the containers the kubelet assigned its GPU (``pods``), None when it
    cannot be told: the GPU has one pod (and the process's HOSTNAME, when readable, is that pod's name), or several
    (time-slicing) and the process's HOSTNAME names exactly one of them. A pod that set its own hostname, on a shared
    GPU, stays unnamed rather than guessed."""
    if ref.kind != "kubernetes" or not pods:
        return None
    by_pod: dict[tuple[str, str], set[str]] = {}
    for a in pods:
        by_pod.setdefault((a.namespace, a.pod), set()).add(a.container)
    host = proc.hostname_env
    if len(by_pod) == 1:
        [(key, containers)] = by_pod.items()
        if host is not None and host != key[1]:
            return None  # a pod that did not ask for this GPU (e.g. one that sees every GPU)
    else:
        named = [(k, c) for k, c in by_pod.items() if host is not None and k[1] == host]
        if len(named) != 1:
            return None
        [(key, containers)] = named
    return PodNames(key[0], key[1], next(iter(containers)) if len(containers) == 1 else "")
