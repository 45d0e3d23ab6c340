"""The analysis of one poll: from the captured windows of every GPU to the InsightResult - each GPU's verdict (with
its job's other GPUs as peers), the jobs and their imbalance and shortfalls, the node's imbalance."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gpuwarden.insight.attribution import JobRef
from gpuwarden.insight.diagnosis import Decided, decide, lost
from gpuwarden.insight.gpu_window import GpuWindow
from gpuwarden.insight.margins import VerdictMemory
from gpuwarden.insight.peers import Activity
from gpuwarden.insight.scores import imbalance, shortfalls, starved_ratio
from gpuwarden.insight.vocabulary.result import GpuInsight, InsightCore, InsightResult, JobInsight, ProcessJob
from gpuwarden.insight.windows import GpuCapture, WindowActivity

#: A diagnosis window holding at least this share of its length is full: only then is its verdict kept within the
#: margin (gpuwarden.insight.margins.VerdictMemory).
FULL_WINDOW = 0.95
#: At most this many jobs are reported (the ones holding most GPU memory): bounds ``gpu_job_*`` series.
MAX_JOBS = 64


def activities(windows: Sequence[Activity]) -> tuple[list[float], str] | None:
    """Per-GPU activity: SM activity when every GPU has it, else util.gpu when every GPU has it."""
    sm = [w.sm for w in windows if w.sm is not None]
    if windows and len(sm) == len(windows):
        return sm, "sm_activity"
    util = [w.util for w in windows if w.util is not None]
    if windows and len(util) == len(windows):
        return util, "utilization_gpu"
    return None


class _Windows:
    """The windows of every GPU captured after a poll: the node window (scores) of each, and the job and diagnosis
    windows of the GPUs up, each GPU under its job (``primary``: the one holding most of its memory). The node and
    job windows are what the scores read of them (``WindowActivity``); the diagnosis window is all of it."""

    def __init__(
        self,
        captures: list[GpuCapture],
        primary: dict[str, JobRef],
        memory: VerdictMemory | None,
        timestamp: float,
        diagnosis_seconds: float,
        ranks: dict[str, int],
    ) -> None:
        self.primary = primary
        self.memory, self.timestamp, self.full = memory, timestamp, diagnosis_seconds * FULL_WINDOW
        self.index = {c.uuid: c.index for c in captures}
        self.node: dict[str, WindowActivity] = {}
        self.job: dict[str, WindowActivity] = {}
        self.diag: dict[str, GpuWindow] = {}
        for c in captures:
            job = primary.get(c.uuid)
            self.node[c.uuid] = c.node.activity(c.index)
            if c.diag is not None and c.job is not None:
                w = c.diag.window(c.index, c.uuid, job)
                self.diag[c.uuid] = w if c.uuid not in ranks else dataclasses.replace(w, rank=ranks[c.uuid])
                self.job[c.uuid] = c.job.activity(c.index)
        # each job's GPUs with a diagnosis window, in ``primary``'s order: a GPU's peers are the others of its job
        self.members: dict[JobRef, list[GpuWindow]] = {}
        for u, ref in primary.items():
            if u in self.diag:
                self.members.setdefault(ref, []).append(self.diag[u])

    def diagnosis(self, uuid: str) -> Decided | None:
        """The verdict on GPU ``uuid`` with the other GPUs of its job as peers, kept as last given within the margin
        (``memory``: gpuwarden.insight.margins) once the window is full (FULL_WINDOW of the diagnosis window: a young
        window's verdict describes seconds, and should not stick); None without a diagnosis window."""
        if uuid not in self.diag:
            return None
        job = self.primary.get(uuid)
        w = self.diag[uuid]
        peers = [p for p in self.members.get(job, ()) if p.uuid != uuid] if job is not None else []
        keep = self.memory if self.memory is not None and w.seconds >= self.full else None
        d = decide(w, peers, keep.previous(uuid, w.processes) if keep is not None else None, self.memory)
        if d is not None and keep is not None:
            keep.remember(uuid, w.processes, d.findings[0], self.timestamp)
        return d


def _jobs(windows: _Windows, processes: list[ProcessJob]) -> tuple[list[JobInsight], dict[str, float]]:
    """The jobs (at most MAX_JOBS, most GPU memory first) with their imbalance, and each GPU's shortfall."""
    by_job: dict[tuple[str, str], list[str]] = {}
    for uuid, ref in windows.primary.items():
        by_job.setdefault((ref.kind, ref.job), []).append(uuid)
    mem: dict[tuple[str, str], int] = {}
    pids: dict[tuple[str, str], set[int]] = {}
    slurm: dict[tuple[str, str], str] = {}
    for p in processes:
        key = (p.job_kind, p.job)
        mem[key] = mem.get(key, 0) + (p.gpu_memory_bytes or 0)
        pids.setdefault(key, set()).add(p.pid)
        if p.slurm_job_id and not slurm.get(key):
            slurm[key] = p.slurm_job_id
    jobs: list[JobInsight] = []
    shortfall: dict[str, float] = {}
    for key in sorted(mem, key=lambda k: (-mem[k], k))[:MAX_JOBS]:
        uuids = sorted(by_job.get(key, []), key=lambda u: windows.index[u])
        measured = [u for u in uuids if u in windows.job]
        act = activities([windows.job[u] for u in measured])
        falls = shortfalls(act[0]) if act else None
        if falls is not None:
            shortfall.update(zip(measured, falls, strict=True))
        jobs.append(
            JobInsight(
                job=key[1],
                job_kind=key[0],
                gpus=[windows.index[u] for u in uuids],
                pids=sorted(pids[key]),
                slurm_job_id=slurm.get(key, ""),
                imbalance_ratio=imbalance(act[0]) if act else None,
                activity_source=act[1] if act else None,
            )
        )
    return jobs, shortfall


def _gpu(
    c: GpuCapture, windows: _Windows, shortfall: float | None, down: dict[str, str]
) -> tuple[GpuInsight, Decided | None]:
    """The insight on one GPU (its totals and node window scores; ``diagnosis`` None) and its verdict (``gpu_lost``
    when it could not be read)."""
    w = windows.node[c.uuid]
    decided = windows.diagnosis(c.uuid)
    if decided is None and c.uuid not in windows.diag and c.uuid in down:
        decided = lost(c.index, c.uuid, down[c.uuid])
    activity = w.sm if w.sm is not None else w.util
    source = "sm_activity" if w.sm is not None else "utilization_gpu"
    insight = GpuInsight(
        gpu=c.index,
        uuid=c.uuid,
        state_seconds_total=c.totals,
        idle_seconds_total=c.idle,
        held_idle_energy_joules_total=c.held_idle_joules,
        idle_energy_joules_total=c.idle_joules,
        peer_wait_seconds_total=c.peer_wait_seconds,
        peer_wait_energy_joules_total=c.peer_wait_joules,
        window_state_seconds=dict(w.states),
        starved_ratio=starved_ratio(w.states),
        activity_ratio=activity,
        activity_source=None if activity is None else source,
        shortfall_ratio=shortfall,
        diagnosis=None,
        state_runs=list(c.runs),
        idle_since=c.idle_since,
    )
    return insight, decided


def _ranks(processes: list[ProcessJob], primary: dict[str, JobRef]) -> dict[str, int]:
    """Each GPU's rank in its job: the lowest rank (RANK) among the processes of the GPU's job on it, where known."""
    out: dict[str, int] = {}
    for p in processes:
        ref = primary.get(p.uuid)
        if p.rank is not None and ref is not None and (p.job_kind, p.job) == (ref.kind, ref.job):
            out[p.uuid] = min(p.rank, out.get(p.uuid, p.rank))
    return out


def build_core(
    timestamp: float,
    window_seconds: float,
    diagnosis_seconds: float,
    captures: list[GpuCapture],
    up: list[str],
    processes: list[ProcessJob],
    primary: dict[str, JobRef],
    down: dict[str, str] | None = None,
    memory: VerdictMemory | None = None,
) -> InsightCore:
    """The InsightResult of one poll from what the analyzer captured after it, as its core (the verdicts decided,
    their Diagnosis models made when ``result()`` is first called). ``up``: UUIDs of the GPUs up, in the poll's
    order; ``primary``: each GPU's job, the one holding most of its memory; ``down``: the GPUs that could not be
    read this poll, with NVML's error; ``memory``: the verdicts last given, kept within the margin - None: each
    verdict from its window alone."""
    windows = _Windows(captures, primary, memory, timestamp, diagnosis_seconds, _ranks(processes, primary))
    jobs, shortfall = _jobs(windows, processes)
    made = [_gpu(c, windows, shortfall.get(c.uuid), down or {}) for c in captures]  # in GPU index order
    node_act = activities([windows.node[u] for u in up if u in windows.node])
    base = InsightResult(
        timestamp=timestamp,
        window_seconds=window_seconds,
        diagnosis_window_seconds=diagnosis_seconds,
        gpus=[g for g, _ in made],
        processes=processes,
        jobs=jobs,
        node_imbalance_ratio=imbalance(node_act[0]) if node_act else None,
        node_activity_source=node_act[1] if node_act and len(node_act[0]) >= 2 else None,
    )
    return InsightCore(base, [d for _, d in made])
