"""Whether each GPU and each job of the node is in use, idle (with its cause and since when) or not known: the body of
``GET /api/v1/idleness``, for cullers and autoscalers (notebook cullers, autostop, job controllers) that key on
utilization today and read a job waiting on its input, or one between requests, as idle.

The contract (docs/cluster.md, "Idleness"): ``active`` when the GPU's latest poll interval went mostly to a state in
which its job works (busy, starved: waiting on its own input, paused: its job stopped within seconds of GPU work);
``idle`` when it went to held_idle (a process holds it, nothing works), allocated_idle (a scheduler gave it to a job
that never opened it) or free (nobody holds it), with ``idle_seconds`` since the run of idle intervals began;
``unknown`` otherwise (the GPU could not be read, the job's CPU is not visible, no interval yet): a caller treats
unknown as active. A job is active when any of its GPUs is, idle when all are (for the shortest of their idle times),
else unknown.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from gpuwarden.allocation import allocated_jobs
from gpuwarden.insight.vocabulary.result import GpuInsight, snapshot_insight
from gpuwarden.insight.vocabulary.states import ACTIVE_STATES, IDLE_STATES
from gpuwarden.snapshot import NodeSnapshot

Status = Literal["active", "idle", "unknown"]


class GpuIdleness(BaseModel):
    """One GPU: its status, the idle state that makes it idle (``cause``), for how long, and its jobs (kind, id)."""

    gpu: int
    uuid: str
    status: Status
    cause: str | None = Field(
        default=None,
        description="held_idle, serving_idle (a server that says it has had no request for a while), allocated_idle "
        "or free while idle, else None",
    )
    idle_seconds: float | None = Field(
        default=None,
        description="seconds since the run of idle poll intervals began, to the latest poll (since the daemon "
        "started at most); None unless idle",
    )
    jobs: list[tuple[str, str]] = Field(
        default_factory=list, description="(job_kind, job_id) of each job holding or allocated the GPU"
    )


class JobIdleness(BaseModel):
    """One job of the node: active when any of its GPUs is, idle when all are (``idle_seconds``: the shortest), else
    unknown."""

    job_kind: str
    job_id: str
    status: Status
    idle_seconds: float | None = None
    gpus: list[int]


class IdlenessDocument(BaseModel):
    """The body of ``/api/v1/idleness``: ``available`` False (and ``reason``) before the first analysis or while the
    data is stale, when every status is unknown; ``timestamp`` the poll the statuses are from."""

    available: bool
    reason: str | None = None
    timestamp: float | None = None
    unknown_means: Literal["active"] = "active"
    gpus: list[GpuIdleness] = Field(default_factory=list)
    jobs: list[JobIdleness] = Field(default_factory=list)


def gpu_status(g: GpuInsight, now: float) -> tuple[Status, str | None, float | None]:
    """(status, cause, idle seconds) of one GPU at ``now`` (Unix s, its latest poll) from its latest poll interval's
    main state (``state_runs``) and ``idle_since``; see the module's contract."""
    if not g.state_runs:
        return "unknown", None, None
    state = g.state_runs[-1].state
    if state in ACTIVE_STATES:
        return "active", None, None
    if state in IDLE_STATES and g.idle_since is not None:
        return "idle", state, max(0.0, now - g.idle_since)
    return "unknown", None, None


def idleness_document(snapshot: NodeSnapshot) -> IdlenessDocument:
    """The ``/api/v1/idleness`` document of ``snapshot`` (its insight result and the scheduler's allocations of its
    latest poll). Never raises."""
    res = snapshot_insight(snapshot)
    if res is None or snapshot.poll is None:
        return IdlenessDocument(available=False, reason="no current analysis (starting, failing or stale)")
    jobs_of: dict[int, set[tuple[str, str]]] = {}
    for p in res.processes:
        jobs_of.setdefault(p.gpu, set()).add((p.job_kind, p.job))
    for gpu, _, kind, job in allocated_jobs(snapshot.poll.gpus, res.processes):
        jobs_of.setdefault(gpu, set()).add((kind, job))
    gpus = []
    for g in res.gpus:
        status, cause, idle = gpu_status(g, res.timestamp)
        gpus.append(GpuIdleness(gpu=g.gpu, uuid=g.uuid, status=status, cause=cause, idle_seconds=idle,
                                jobs=sorted(jobs_of.get(g.gpu, ()))))  # fmt: skip
    by_job: dict[tuple[str, str], list[GpuIdleness]] = {}
    for d in gpus:
        for key in d.jobs:
            by_job.setdefault(key, []).append(d)
    jobs = []
    for (kind, job), mine in sorted(by_job.items()):
        statuses = {d.status for d in mine}
        overall: Status = "active" if "active" in statuses else "idle" if statuses == {"idle"} else "unknown"
        idle = min(d.idle_seconds or 0.0 for d in mine) if overall == "idle" else None
        jobs.append(JobIdleness(job_kind=kind, job_id=job, status=overall, idle_seconds=idle,
                                gpus=sorted(d.gpu for d in mine)))  # fmt: skip
    return IdlenessDocument(available=True, timestamp=res.timestamp, gpus=gpus, jobs=jobs)
