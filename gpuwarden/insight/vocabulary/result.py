"""What the insight analyzer derives after a poll: per-GPU insight, jobs, processes and the node's imbalance
(``InsightResult``, frozen pydantic models), what the metrics read of it (``InsightCore``: the result without its
Diagnosis models, and each GPU's findings), and the deferred result the poller stores (``DeferredInsight``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from gpuwarden.insight.vocabulary.verdicts import Diagnosis
from gpuwarden.model import ProcessIdentity
from gpuwarden.snapshot import NodeSnapshot


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class StateRun(_Frozen):
    """A stretch of consecutive poll intervals of one GPU whose time went mostly to one state
    (gpuwarden.insight.vocabulary.states.STATES): from ``start`` to ``end``, Unix seconds."""

    state: str
    start: float
    end: float


class GpuInsight(_Frozen):
    """One GPU's time accounting, scores and verdict.

    ``state_seconds_total``: seconds per state since the analyzer started (counters). ``window_state_seconds``:
    the same over the last ``window_seconds``. ``starved_ratio``: starved / accounted seconds in the window.
    ``state_runs``: the window as a strip, each interval under the state that took most of it.
    ``activity_ratio``: mean GPM SM activity over the window (``activity_source`` "sm_activity"), else mean
    util.gpu ("utilization_gpu"). ``diagnosis``: None until MIN_SECONDS of history or while the GPU is down.
    """

    gpu: int
    uuid: str
    state_seconds_total: dict[str, float]
    idle_seconds_total: dict[str, float] = Field(
        default_factory=dict,
        description="seconds the GPU idled since the analyzer started, by cause (gpuwarden.insight.vocabulary.states."
        "IDLE_CAUSES); with state busy they add up to the accounted wall time",
    )
    held_idle_energy_joules_total: float | None = Field(
        default=None,
        description="joules drawn above the GPU's idle floor (lowest power seen since the analyzer started) while "
        "held idle, since the analyzer started (None: the GPU reports no power)",
    )
    idle_energy_joules_total: dict[str, float] | None = Field(
        default=None,
        description="joules drawn above the GPU's idle floor while idle, by idle cause "
        "(gpuwarden.insight.vocabulary.states.IDLE_CAUSES), since the analyzer started (None: the GPU reports no "
        "power)",
    )
    peer_wait_seconds_total: float = Field(
        default=0.0,
        description="seconds of the GPU's busy time (a kernel ran) spent in kernels waiting in a collective on "
        "another GPU of its job (gpuwarden.insight.peers.peer_wait_share per poll interval), since the analyzer "
        "started",
    )
    peer_wait_energy_joules_total: float | None = Field(
        default=None,
        description="joules drawn above the GPU's idle floor in those seconds, since the analyzer started (None: the "
        "GPU reports no power)",
    )
    window_state_seconds: dict[str, float]
    starved_ratio: float | None = None
    activity_ratio: float | None = None
    activity_source: str | None = None
    shortfall_ratio: float | None = Field(
        default=None, description="1 - activity / the busiest activity among the GPUs of its job (None: 1 GPU)"
    )
    diagnosis: Diagnosis | None = None
    state_runs: list[StateRun] = Field(
        default_factory=list,
        description="the window's poll intervals by main state, oldest first (gaps: time not accounted)",
    )
    idle_since: float | None = Field(
        default=None,
        description="Unix time the GPU's current run of idle poll intervals began (main state held_idle, "
        "serving_idle, allocated_idle or free: gpuwarden.insight.vocabulary.states.IDLE_STATES), since the analyzer "
        "started; "
        "None while its latest interval is in use (busy, starved, paused) or not known (unknown, lost)",
    )


class ProcessJob(_Frozen, ProcessIdentity):
    """One GPU process (its ProcessIdentity) and its job (gpuwarden.insight.attribution)."""

    gpu: int
    uuid: str
    job: str
    job_kind: str
    container_id: str = ""
    user: str = ""
    command: str = Field(default="", description="process name (not the command line)")
    namespace: str = Field(default="", description="Kubernetes namespace (kubelet pod-resources), '' when unknown")
    pod: str = Field(default="", description="Kubernetes pod name, '' when unknown")
    container: str = Field(default="", description="Kubernetes container name, '' when unknown")
    slurm_job_id: str = Field(
        default="",
        description="the numeric Slurm job id of a slurm job: the job id itself, or for a job keyed by its SLUID the "
        "process's SLURM_JOB_ID where its environment is readable; '' when unknown",
    )
    cpu_cores: float | None = Field(default=None, description="CPU seconds per second over the last poll interval")


class JobInsight(_Frozen):
    """A job on this node: the GPUs where it holds the most memory, and its imbalance over them.

    ``imbalance_ratio`` is None for a job on one GPU (see gpuwarden.insight.scores.imbalance).
    """

    job: str
    job_kind: str
    gpus: list[int] = Field(description="the indices of the GPUs where the job holds the most memory")
    pids: list[int] = Field(description="the process ids of its processes on this node's GPUs")
    slurm_job_id: str = Field(
        default="",
        description="the numeric Slurm job id users type (squeue, scancel): of a job keyed by its SLUID, its "
        "processes' SLURM_JOB_ID where an environment was readable; '' when unknown or not a Slurm job",
    )
    imbalance_ratio: float | None = None
    activity_source: str | None = None


class InsightResult(_Frozen):
    """Everything the insight analyzer derived after one poll (what ``analyses["insight"]`` holds)."""

    timestamp: float
    window_seconds: float
    diagnosis_window_seconds: float
    gpus: list[GpuInsight]
    processes: list[ProcessJob]
    jobs: list[JobInsight]
    node_imbalance_ratio: float | None = None
    node_activity_source: str | None = None


class Verdict(Protocol):
    """A GPU's verdict as decided (gpuwarden.insight.diagnosis.Decided): its findings, its Diagnosis on demand."""

    @property
    def findings(self) -> tuple[str, ...]:
        """The verdict, then every other finding that applies."""

    def diagnosis(self) -> Diagnosis:
        """The Diagnosis model, made at each call."""


class InsightCore:
    """An InsightResult before its Diagnosis models are made: ``base`` (the result with every GPU's ``diagnosis``
    None, or the whole result where it was made whole) and each GPU's ``findings`` (in ``base.gpus``' order; None:
    no verdict yet). What the metrics read: a scrape exports the findings, and only the JSON routes, pages and
    reports read the diagnoses' summaries and evidence rows. ``result()`` gives the whole InsightResult, made on the
    first call and kept (thread-safe).
    """

    __slots__ = ("base", "findings", "_verdicts", "_result", "_lock")

    def __init__(self, base: InsightResult, verdicts: Sequence[Verdict | None]) -> None:
        self.base = base
        self.findings: list[tuple[str, ...] | None] = [None if v is None else v.findings for v in verdicts]
        self._verdicts: Sequence[Verdict | None] | None = verdicts
        self._result: InsightResult | None = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, result: InsightResult) -> InsightCore:
        """The core of a whole InsightResult: ``base`` and ``result()`` are ``result``, the findings its diagnoses'."""
        core = cls(result, ())
        core.findings = [None if g.diagnosis is None else tuple(g.diagnosis.findings) for g in result.gpus]
        core._result, core._verdicts = result, None
        return core

    def result(self) -> InsightResult:
        """Return the InsightResult: ``base`` with each GPU's Diagnosis made from its verdict."""
        with self._lock:
            if self._result is None:
                assert self._verdicts is not None
                gpus = [
                    g if v is None else g.model_copy(update={"diagnosis": v.diagnosis()})
                    for g, v in zip(self.base.gpus, self._verdicts, strict=True)
                ]
                self._result, self._verdicts = self.base.model_copy(update={"gpus": gpus}), None
            return self._result


class DeferredInsight:
    """The InsightResult of one poll, computed when first asked for and kept (thread-safe): what the daemon's poller
    stores in ``NodeSnapshot.analyses["insight"]``. A result costs more to build than the poll's accounting (windows,
    scores, the diagnosis and its models); read once per scrape, most polls never build theirs, and a scrape builds
    only the core (``core()``: the verdicts without their Diagnosis models).
    """

    __slots__ = ("_compute", "_core", "_lock")

    def __init__(self, compute: Callable[[], InsightCore]) -> None:
        self._compute: Callable[[], InsightCore] | None = compute
        self._core: InsightCore | None = None
        self._lock = threading.Lock()

    def core(self) -> InsightCore:
        """Return the core, computing it the first time."""
        with self._lock:
            if self._core is None:
                assert self._compute is not None
                self._core, self._compute = self._compute(), None
            return self._core

    def __call__(self) -> InsightResult:
        """Return the whole result (the core's, its diagnoses made the first time)."""
        return self.core().result()


def insight_result(value: object) -> InsightResult | None:
    """Return the InsightResult held in ``NodeSnapshot.analyses["insight"]`` (an InsightResult or a DeferredInsight),
    None for anything else (no analysis yet)."""
    if isinstance(value, DeferredInsight):
        return value()
    return value if isinstance(value, InsightResult) else None


def insight_core(value: object) -> InsightCore | None:
    """Return the InsightCore of what ``NodeSnapshot.analyses["insight"]`` holds (``insight_result``'s values),
    None for anything else."""
    if isinstance(value, DeferredInsight):
        return value.core()
    return InsightCore.of(value) if isinstance(value, InsightResult) else None


def snapshot_core(snapshot: NodeSnapshot) -> InsightCore | None:
    """The core of the insight analyzer's result of ``snapshot``'s poll (what the metrics read), None when the
    analyzer is not running or has not run."""
    return insight_core(snapshot.analyses.get("insight"))


def snapshot_insight(snapshot: NodeSnapshot) -> InsightResult | None:
    """The insight analyzer's result of ``snapshot``'s poll (``analyses["insight"]``: built on first read when
    deferred), None when the analyzer is not running or has not run."""
    return insight_result(snapshot.analyses.get("insight"))
