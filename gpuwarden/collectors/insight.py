"""Time accounting, starved and imbalance scores, job attribution and diagnosis (``gpuwarden.insight``).

Reads the core of the snapshot's ``InsightResult`` (gpuwarden.insight.vocabulary.result.snapshot_core: the result
without its Diagnosis models, and each GPU's findings); definitions in docs/scores.md.

- ``gpu_state_seconds_total{gpu,uuid,state}`` counter: seconds the GPU spent in each state since the daemon
  started; ``state`` is one of gpuwarden.insight.vocabulary.states.STATES (busy, starved, paused, held_idle,
  serving_idle, ...; they add up to the accounted wall time); a state the GPU has not been in since the daemon started
  has no series (so for the idle causes of ``gpu_idle_seconds_total`` and their energy).
- ``gpu_starved_ratio{gpu,uuid}``: starved seconds / accounted seconds over the analyzer window (default 5 min).
- ``gpu_node_imbalance_ratio``: load imbalance over all GPUs of the node in [0, 1] (0 balanced, 1 one GPU does
  all the work), on GPM SM activity where every GPU has it, else util.gpu. Absent with fewer than 2 GPUs.
- ``gpu_job_imbalance_ratio{job_id,job_kind}``: the same over the GPUs where one job holds the most memory; only
  jobs on 2+ GPUs, at most 64 jobs.
- ``gpu_diagnosis{gpu,uuid,reason}``: 1 for the verdict and for each extra finding (throttled,
  memory_nearly_full); the other reasons of the fixed set (``gpuwarden.insight.reasons.REASONS``) have no series;
  absent until the analyzer has 2 s of history for the GPU.
- ``gpu_process_job_info{gpu,uuid,pid,job_id,job_kind,job_scope,container_id,user,process_name,...}`` = 1: the job
  of each GPU process (``job_scope``: cluster for ids that mean the same job on every node, else node;
  ``slurm_job_id``: the numeric Slurm job id, also for a job keyed by its SLUID where the environment gave it)
  (the ``max_processes_per_gpu`` largest by GPU memory per GPU); series end with their process. Join on
  ``gpu``/``uuid`` to put job labels on per-GPU series without making them part of those series.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from gpuwarden.allocation import allocated_jobs
from gpuwarden.catalog import Family
from gpuwarden.collectors.registry import (
    CollectOptions,
    add_grown,
    builds,
    gpu_rows,
    new_family,
    new_values,
    readings,
)
from gpuwarden.families import MetricFamily
from gpuwarden.insight.attribution import job_scope
from gpuwarden.insight.reasons import REASONS
from gpuwarden.insight.vocabulary.result import GpuInsight, InsightCore, InsightResult, ProcessJob, snapshot_core
from gpuwarden.insight.vocabulary.states import IDLE_CAUSES, STATES
from gpuwarden.snapshot import NodeSnapshot


def _core(snap: NodeSnapshot) -> InsightCore | None:
    if snap.poll is None:
        return None
    return snapshot_core(snap)


def _result(snap: NodeSnapshot) -> InsightResult | None:
    """The result's numbers (``InsightCore.base``: its GPUs' diagnoses may be None; the findings are the core's)."""
    core = _core(snap)
    return None if core is None else core.base


#: A GPU's one value of a family; None: the GPU has none.
Value = Callable[[GpuInsight], float | None]


def _per_gpu(snap: NodeSnapshot, fam: Family, value: Value, doc: str | None = None) -> MetricFamily | None:
    """Return ``fam`` with each GPU's ``value`` (labels: the GPU's), None before the first analysis or without any
    sample. ``doc`` is a help text other than the declared one."""
    res = _result(snap)
    if res is None:
        return None
    metric = new_values(fam, doc)
    labels, numbers = metric.labels, metric.numbers  # the columns, filled directly
    for g in res.gpus:
        got = value(g)
        if got is not None:
            labels.append(gpu_rows(g.gpu, g.uuid)[0])
            numbers.append(float(got))
    return metric if numbers else None


def _grown(
    snap: NodeSnapshot, fam: Family, totals: Callable[[GpuInsight], dict[str, float] | None], order: tuple[str, ...]
) -> MetricFamily | None:
    """Return ``fam`` with each GPU's counters by key (the family's one extra label), in ``order``, for the keys that
    have grown since the daemon started (``add_grown``: a GPU that never idled for a cause costs no series for it).
    A key's series appears with its first growth, its value then the seconds or joules since that growth began, which
    ``gpuwarden top`` and ``report`` count whole (a counter absent at a step's start grew from 0:
    gpuwarden.cluster.usage). None before the first analysis or without any sample."""
    res = _result(snap)
    if res is None:
        return None
    metric = new_values(fam)
    for g in res.gpus:
        add_grown(metric, g.gpu, g.uuid, totals(g), order)
    return metric if metric.numbers else None


@builds("gpu_state_seconds_total")
def state_seconds(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the seconds each GPU spent in each state it has been in since the daemon started."""
    return _grown(snap, fam, lambda g: g.state_seconds_total, STATES)


@builds("gpu_idle_seconds_total")
def idle_seconds(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the seconds each GPU idled by each cause it has idled for since the daemon started."""
    return _grown(snap, fam, lambda g: g.idle_seconds_total, IDLE_CAUSES)


@builds("gpu_held_idle_energy_joules_total")
def held_idle_energy(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the joules each GPU drew above its idle floor while held idle (GpuInsight.held_idle_energy_joules_total:
    power minus the lowest power seen since start, times the held-idle seconds of each poll interval)."""
    return _per_gpu(snap, fam, lambda g: g.held_idle_energy_joules_total)


@builds("gpu_peer_wait_seconds_total")
def peer_wait_seconds(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the busy seconds each GPU spent waiting in a collective on another GPU of its job
    (GpuInsight.peer_wait_seconds_total), for the GPUs that have waited since the daemon started (a GPU that never
    waited has no series: as ``_grown``)."""
    return _per_gpu(snap, fam, lambda g: g.peer_wait_seconds_total or None)


@builds("gpu_peer_wait_energy_joules_total")
def peer_wait_energy(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the joules each GPU drew above its idle floor while waiting on a peer
    (GpuInsight.peer_wait_energy_joules_total). Absent for a GPU that reports no power."""
    return _per_gpu(snap, fam, lambda g: g.peer_wait_energy_joules_total)


@builds("gpu_idle_energy_joules_total")
def idle_energy(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the joules each GPU drew above its idle floor while idle, by each cause it has idled for
    (GpuInsight.idle_energy_joules_total: power minus the lowest power seen, times each poll interval's idle seconds
    of the cause). Absent for a GPU that reports no power."""
    return _grown(snap, fam, lambda g: g.idle_energy_joules_total, IDLE_CAUSES)


@builds("gpu_starved_ratio")
def starved_ratio(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return each GPU's starved share of the analyzer window (help text names the window)."""
    res = _result(snap)
    doc = fam.help.format(window=f"{res.window_seconds:g}") if res is not None else None
    return _per_gpu(snap, fam, lambda g: g.starved_ratio, doc=doc)


@builds("gpu_diagnosis")
def diagnosis(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return 1 for each GPU's verdict and each of its findings; the other reasons have no series (a one-hot of
    every reason would cost a series per reason and GPU for zeros)."""
    core = _core(snap)
    if core is None:
        return None
    metric = new_values(fam)
    for g, found in zip(core.base.gpus, core.findings, strict=True):
        keys = _held(found) if found else ()
        if keys:
            metric.labels.extend(gpu_rows(g.gpu, g.uuid, keys))
            metric.numbers.extend((1.0,) * len(keys))
    return metric if metric.numbers else None


@functools.lru_cache(maxsize=256)
def _held(findings: tuple[str, ...]) -> tuple[str, ...]:
    """The reasons of REASONS among ``findings``, in REASONS' order (GPUs of a node share a few sets of findings)."""
    return tuple(r for r in REASONS if r in findings)


@builds("gpu_job_shortfall_ratio")
def job_shortfall(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return each GPU's shortfall against the busiest GPU of its job (GPUs of jobs on 2+ GPUs)."""
    return _per_gpu(snap, fam, lambda g: g.shortfall_ratio)


@builds("gpu_node_imbalance_ratio")
def node_imbalance(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the node's imbalance (absent with fewer than 2 GPUs)."""
    res = _result(snap)
    if res is None or res.node_imbalance_ratio is None:
        return None
    node = new_values(fam)
    node.add_metric([], res.node_imbalance_ratio)
    return node


@builds("gpu_job_imbalance_ratio")
def job_imbalance(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the imbalance of each job on 2 or more GPUs."""
    res = _result(snap)
    if res is None:
        return None
    job = new_values(fam)
    for j in res.jobs:
        if j.imbalance_ratio is not None:
            job.add_metric([j.job, j.job_kind], j.imbalance_ratio)
    return job if job else None


@builds("gpu_process_job_info")
def process_job(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return the job of each GPU process (the ``max_processes_per_gpu`` largest by GPU memory per GPU)."""
    res = _result(snap)
    if res is None:
        return None
    info = new_family(fam)
    per_gpu: dict[str, int] = {}
    for p in sorted(res.processes, key=lambda p: (p.gpu, -(p.gpu_memory_bytes or 0), p.pid)):
        n = per_gpu.get(p.uuid, 0)
        if n >= opts.max_processes_per_gpu:
            continue
        per_gpu[p.uuid] = n + 1
        info.add_metric(
            [str(p.gpu), p.uuid],
            {
                "pid": str(p.pid),
                **_job_labels(p),
                "container_id": p.container_id,
                "user": p.user,
                "process_name": p.command,
                "rank": "" if p.rank is None else str(p.rank),
                "local_rank": "" if p.local_rank is None else str(p.local_rank),
            },
        )
    return info if info else None


@builds("gpu_job_info")
def job_info(snap: NodeSnapshot, opts: CollectOptions, fam: Family) -> MetricFamily | None:
    """Return one series per GPU and job holding it (its processes merged; Kubernetes names from any of them), with
    its owner: ``user`` the job mapping's (the Slurm prolog's) where it names the job, else its processes' user;
    ``account`` the job mapping's."""
    res = _result(snap)
    if res is None:
        return None
    jobs: dict[tuple[int, str, str, str], dict[str, str]] = {}
    for p in sorted(res.processes, key=lambda p: (p.gpu, p.job_kind, p.job, p.pid)):
        labels = jobs.setdefault((p.gpu, p.uuid, p.job_kind, p.job), {**_job_labels(p), "user": "", "account": ""})
        for k in ("namespace", "pod", "slurm_job_id", "user"):
            labels[k] = labels[k] or getattr(p, k)
        if p.container and labels["container"] not in ("", p.container):
            labels["container"] = "*"  # processes of several containers of the pod
        elif p.container:
            labels["container"] = p.container
    for (gpu, uuid, kind, job), labels in allocated_jobs(readings(snap), res.processes).items():
        held = [v for k, v in jobs.items() if k[0] == gpu and (k[2:] == (kind, job) or _same_job(v, labels))]
        for v in held:  # the scheduler's owner on the job its processes run
            v["account"] = v["account"] or labels["account"]
            v["user"] = labels["user"] or v["user"]
        if not held:
            jobs[(gpu, uuid, kind, job)] = labels
    info = new_family(fam)
    for (gpu, uuid, _, _), labels in jobs.items():
        info.add_metric([str(gpu), uuid], labels)
    return info if info else None


def _job_labels(p: ProcessJob) -> dict[str, str]:
    """The labels of a process's job, as gpu_process_job_info and gpu_job_info write them: its id, kind and scope,
    Kubernetes names and Slurm job number (gpu_job_info adds its owner: the processes' user, the scheduler's user and
    account)."""
    return {"job_id": p.job, "job_kind": p.job_kind, "job_scope": job_scope(p.job_kind), "namespace": p.namespace,
            "pod": p.pod, "container": p.container, "slurm_job_id": p.slurm_job_id}  # fmt: skip


def _same_job(a: dict[str, str], b: dict[str, str]) -> bool:
    """Whether two jobs' labels name one job: the same Slurm job number (a process's job id may be its SLUID), or
    the same Kubernetes pod."""
    if a["slurm_job_id"] and a["slurm_job_id"] == b["slurm_job_id"]:
        return True
    return bool(a["pod"]) and (a["namespace"], a["pod"]) == (b["namespace"], b["pod"])
