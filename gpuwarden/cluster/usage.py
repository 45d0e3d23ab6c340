"""GPU-hours held and lost, by job and by GPU, over a time range, from gpuwarden's series in Prometheus.

The numbers come from the daemons' own accounting (``gpu_idle_seconds_total{cause}``, ``gpu_state_seconds_total``,
``gpu_energy_joules_total``, ``gpu_held_idle_energy_joules_total``, ``gpu_diagnosis``), joined with
``gpu_job_info`` (the jobs of a GPU: those its processes run, and those a scheduler allocated it to) step by step
(PromQL subqueries ``[RANGE:STEP]``), so a GPU that changed hands within the range counts for each job only while
that job held it.

- **Job keys.** An id with ``job_scope="cluster"`` (Slurm job, Kubernetes pod UID) is one job on every node; any
  other id (container, systemd unit, cgroup path, ``user/command``) is a job of its node only, keyed by
  (id, instance).
- **Shared GPUs.** A GPU held by N jobs at once counts 1/N of its time for each, so the jobs' hours add up to the
  GPU's.
- **Held time** is the GPU's accounted seconds in every state but ``free`` while the job held it (a GPU allocated to
  the job and never opened, ``allocated_idle``, included), so held = busy +
  lost exactly. **Lost time** is idle time a job held: every cause of ``gpu_idle_seconds_total`` but ``free`` (nobody
  held the GPU; that is the fleet's spare capacity, reported per GPU), ``lost`` (the GPU could not be read) included.
- **Exact at any step.** Counters are summed step by step as their growth since the previous step (``_increase``),
  which telescopes to their growth over the range, exactly: the steps end at the range's end and every step
  before it, back to its start (PromQL aligns a subquery's steps to multiples of the step since 1970 and includes
  both ends of its range: the inner selectors are shifted to the range's end with a negative offset, the subquery
  back with a positive one, and its range is a millisecond short of the range). The growth is taken at steps of
  at most the scrape interval that tile ``--step`` (``ATTRIBUTION_SECONDS``, ``--resolution``): each holds one
  scrape, so a daemon restart (its counters start again) loses nothing, and a job's share of a GPU in each is
  whether it held the GPU at that scrape. Scraped more often than that, a restart loses the growth of the part it
  fell in before it, and a GPU that changed hands within a part splits the part's busy and lost time by the share
  of its scrapes each job held it in (held time stays exact: a GPU accrues it only while held). The diagnosis is
  sampled at each ``--step``.
- **The same on every engine.** A counter's value at a step is its newest sample within 5 minutes, written out
  (``last_over_time(m[5m])``) rather than left to the engine's look back (Prometheus stops at the staleness markers a
  failed scrape writes; VictoriaMetrics looks back about a scrape interval): a missed scrape loses nothing, and a
  counter that appears counts at most what it can have grown. A job's queries name at most NARROW_GPUS of its GPUs
  each, so none grows with the job.
- **Clusters.** Every key carries the values of ``cluster_labels`` (default ``cluster``), as the alert rules do: a
  job id (a Slurm job, a SLUID) seen in two clusters is two jobs, and a node is its instance in its cluster.
- **Effective time** (``top`` and ``report``): time with SM activity >= 0.5 (util.gpu where the GPU has no GPM),
  sampled at each attribution step (each scrape): DCGM's guidance
  is that SM activity below 0.5 likely means the GPU is used ineffectively.
- **Peak-equivalent time** (``top`` and ``report``): the sum over the steps of the job's GPUs' mean FLOP utilization
  estimate over the step (OFU, ``gpu_flop_utilization_ratio``) times the step: the GPU-hours the job's tensor work
  would take at the dense peak. None where no GPU of the job has GPM.
- **Waiting on peers** (``gpu_peer_wait_seconds_total``): busy time (a kernel ran) in which a GPU waited in a
  collective on another GPU of its job; part of busy, not of lost, since NVML counts it busy; ``report`` shows it with
  its energy above the idle floor (``gpu_peer_wait_energy_joules_total``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuwarden.cluster.accounting_queries import (
    AccountingQueries,
    Cluster,
    GpuKey,
    promql_string,
)
from gpuwarden.insight.reasons import REASONS, REMEDIES
from gpuwarden.insight.vocabulary.states import IDLE_CAUSES
from gpuwarden.mixin import rules as _rules

if TYPE_CHECKING:
    from collections.abc import Iterable

    from gpuwarden.cluster.promapi import InstantQueries, Sample

#: Causes of lost (held but idle) time: every idle cause but ``free``.
LOST_CAUSES = tuple(c for c in IDLE_CAUSES if c != "free")
#: A GPU is lost during a job when it is down (gpu_up 0) within this many seconds of the job's last sample on it:
#: NVML lists no process on a lost GPU, so the job's series on it end at the scrape that finds it lost; Prometheus's
#: default lookback (5 min) bounds how late that scrape can be.
LOST_WITHIN_SECONDS = 300
#: A GPU flagged ``straggler`` in at least this share of the steps its job held it is reported as the straggler.
STRAGGLER_MIN_SHARE = 0.1


@dataclass(frozen=True, order=True)
class JobKey:
    """A job: its id, its node's instance when the id is node-local (None: the id is cluster-wide), and its cluster
    (the values of the cluster labels: the same id in two clusters is two jobs)."""

    job_id: str
    instance: str | None = None
    cluster: Cluster = ()

    def label(self) -> str:
        """``ID`` for a cluster-wide id, ``ID @ INSTANCE`` for a node-local one, then `` in CLUSTER`` where the
        series name one."""
        where = "" if self.instance is None else f" @ {self.instance}"
        return f"{self.job_id}{where}" + (f" in {'/'.join(self.cluster)}" if any(self.cluster) else "")


@dataclass
class Usage:
    """GPU-hours of one job or one GPU over the range: held, busy, lost by cause, energy (joules), the reasons the
    daemons gave (GPU-steps per reason), the nodes and GPUs involved."""

    held_hours: float = 0.0
    busy_hours: float = 0.0
    lost_hours: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LOST_CAUSES, 0.0))
    free_hours: float = 0.0
    effective_hours: float | None = None
    peak_equivalent_hours: float | None = None
    energy_joules: float | None = None
    held_idle_energy_joules: float | None = None
    idle_energy_joules: dict[str, float] | None = None  # report: above the idle floor, by lost cause
    peer_wait_hours: float | None = None  # busy GPU-hours spent waiting in a collective on a peer (jobs only)
    peer_wait_energy_joules: float | None = None  # report: above the idle floor while waiting on peers
    reasons: dict[str, float] = field(default_factory=dict)
    instances: set[str] = field(default_factory=set)
    gpus: set[tuple[str, str]] = field(default_factory=set)  # (instance, gpu index), in the cluster
    cluster: Cluster = ()
    kind: str = ""
    cost: float | None = None
    currency: str = ""
    price: float | None = None  # per GPU-hour: the mean of its nodes' (the accounting's _price)

    @property
    def lost_total(self) -> float:
        """Lost GPU-hours, all causes."""
        return sum(self.lost_hours.values())

    def verdict(self) -> list[str]:
        """The reasons seen most, main one first (the daemons' verdicts and findings, by GPU-steps), at most 3."""
        ranked = sorted(self.reasons, key=lambda r: (-self.reasons[r], REASONS.index(r) if r in REASONS else 99))
        return ranked[:3]

    def absorb(self, other: Usage) -> None:
        """Add ``other`` (the same job or GPU, over other GPUs: ``Accounting.narrowed``'s parts) to this usage: hours,
        energies and reasons summed (None where neither knows one), nodes and GPUs joined. The cost is left to be
        priced again over the whole."""
        self.held_hours += other.held_hours
        self.busy_hours += other.busy_hours
        self.free_hours += other.free_hours
        for cause, h in other.lost_hours.items():
            self.lost_hours[cause] = self.lost_hours.get(cause, 0.0) + h
        for name in _OPTIONAL_SUMS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if theirs is not None:
                setattr(self, name, theirs if mine is None else mine + theirs)
        if other.idle_energy_joules is not None:
            joules = self.idle_energy_joules or dict.fromkeys(LOST_CAUSES, 0.0)
            for cause, j in other.idle_energy_joules.items():
                joules[cause] = joules.get(cause, 0.0) + j
            self.idle_energy_joules = joules
        for reason, n in other.reasons.items():
            self.reasons[reason] = self.reasons.get(reason, 0.0) + n
        self.instances |= other.instances
        self.gpus |= other.gpus
        self.cluster = self.cluster or other.cluster
        self.kind = self.kind or other.kind

    def first_remedy(self) -> str:
        """The first remedy of the main reason (gpuwarden.insight.reasons.REMEDIES), '' without one."""
        for r in self.verdict():
            if REMEDIES.get(r):
                return REMEDIES[r][0]
        return ""


#: Usage's figures that are None where no series gave them: ``absorb`` sums them None-aware.
_OPTIONAL_SUMS = ("effective_hours", "peak_equivalent_hours", "energy_joules", "held_idle_energy_joules",
                  "peer_wait_hours", "peer_wait_energy_joules")  # fmt: skip


@dataclass
class IdleFacts:
    """One job over a range, as the reclaim ladder weighs it (``Accounting.idle_facts``): seconds held (its GPUs'
    accounted seconds but free, while it held them), of which reclaimable idle, the GPUs ((instance, gpu) in its
    cluster), the reasons the daemons gave for them, its kind and names (namespace, pod, slurm_job_id: '' unknown)."""

    held_seconds: float = 0.0
    reclaimable_seconds: float = 0.0
    gpus: set[tuple[str, str]] = field(default_factory=set)
    reasons: set[str] = field(default_factory=set)
    kind: str = ""
    names: dict[str, str] = field(default_factory=dict)


#: The labels a per-GPU, per-job sample must carry.
_GPU_JOB = ("instance", "gpu", "job_id")
#: Counters are summed, and jobs given their share of a GPU, at steps this long or shorter (a longer step is cut into
#: equal parts): Prometheus's usual scrape interval (deploy/prometheus/prometheus.yml's), so each such step holds one
#: scrape of a GPU and the hours are the same whatever ``--step``, a restarted daemon's counters and a GPU that
#: changed hands included.
ATTRIBUTION_SECONDS = 15.0


#: A job's queries name at most this many of its GPUs (``Accounting.narrowed``: a larger job is asked about in parts
#: and the parts added up): each GPU's UUID adds about 250 bytes to the longest query (its selector appears in it
#: several times), so a query stays under about 5 KB whatever the job's size (VictoriaMetrics refuses queries past
#: 16 KiB by default, ``-search.maxQueryLen``). Selecting the job's GPUs by a join instead would read every GPU of the
#: fleet in every step of every query.
NARROW_GPUS = 16


#: The most attribution steps ``default_attribution`` gives a range: a day of 15-second steps. Every query of ``top``
#: evaluates its expression at each of them, so a week at 15 s would cost seven days' worth of a day's.
MAX_ATTRIBUTION_STEPS = 5760


#: The usage records (alerts/gpuwarden.rules.yml, group gpuwarden.usage: gpuwarden.mixin.rules names them) at their
#: shipped interval, which ``recorded_jobs`` sums: a rule file generated with another ``usage_interval`` names them
#: by it, and ``top --source raw`` does without them.
RECORDED_INTERVAL = "1m"
RECORDED = {k: v + RECORDED_INTERVAL for k, v in _rules.USAGE.items()}
RECORDED_SHARE = _rules.USAGE_SHARE + RECORDED_INTERVAL
RECORDED_GPU = {k: v + RECORDED_INTERVAL for k, v in _rules.USAGE_GPU.items()}
RECORDED_HEARTBEAT = _rules.USAGE_HEARTBEAT
#: Records that begin this many seconds or more after the range's start are said to begin late (``top``'s note).
RECORDED_CHECK = 300


@dataclass(frozen=True)
class RecordsCoverage:
    """What of a range the usage records hold (``Accounting.records_coverage``): ``start``, when they begin in it
    (Unix seconds; None: no record in the range); ``missing``, the share (0 to 1) of the evaluations due since then
    that wrote no record, so the recorded figures are low by about that share."""

    start: float | None
    missing: float


#: Each record covers the interval that ended this many seconds before its evaluation (gpuwarden.mixin.rules's
#: USAGE_OFFSET: the scrapes of the interval are all written by then).
RECORDED_OFFSET = int(_rules.seconds(_rules.USAGE_OFFSET))


def default_attribution(range_s: float) -> float:
    """The attribution step for a range of ``range_s`` seconds when none is given: ATTRIBUTION_SECONDS, or
    range / MAX_ATTRIBUTION_STEPS (whole seconds) past a day, so that a week costs no more than a day does (its job
    splits then to within that step: 105 s at 7 days), unless ``--step`` is finer still (the parts divide it)."""
    return max(ATTRIBUTION_SECONDS, float(-(-int(range_s) // MAX_ATTRIBUTION_STEPS)))


def _attribution_ms(step_ms: int, most_ms: int) -> int:
    """The longest step of at most ``most_ms`` (ms) that divides ``step_ms`` (ms) into equal parts."""
    parts = -(-step_ms // most_ms)
    while step_ms % parts:
        parts += 1
    return step_ms // parts


class Accounting(AccountingQueries):
    """The answers of ``top`` and ``report``, asked of ``prom`` and assembled into jobs, GPUs and their usage (the
    PromQL they ask: AccountingQueries, whose range, step, selector, end and cluster labels these are). ``range_``:
    a Prometheus duration ending at ``at`` (Unix seconds; None: now), in steps of ``step`` (1m by default; the range
    a whole number of them); ``selector``: extra label matchers for every gpuwarden series, e.g.
    ``cluster="train-a"``; ``cluster_labels``: the labels that name a cluster (jobs and nodes are keyed within it);
    ``attribution``: the longest step, in seconds, at which counters are summed and jobs given their share of a GPU
    (ATTRIBUTION_SECONDS). Raises ValueError for a bad range or step."""

    def __init__(self, prom: InstantQueries, range_: str, step: str = "1m", selector: str = "",
                 at: float | None = None, cluster_labels: tuple[str, ...] = ("cluster",),
                 attribution: float = ATTRIBUTION_SECONDS) -> None:  # fmt: skip
        super().__init__(range_, step, selector, at, cluster_labels)
        self.prom = prom
        self._reasons: dict[GpuKey, dict[str, float]] | None = None
        self._narrow = False  # restricted to one job's GPUs already (``narrowed``)
        # jobs are attributed at steps of at most ATTRIBUTION_SECONDS that tile the step (the range's steps of a
        # finer accounting): a GPU that changed hands within a long step is split where it changed, to that step
        if not attribution > 0.001:
            raise ValueError(f"attribution step {attribution!r} s is not positive")
        fine_ms = _attribution_ms(self._step_ms, round(attribution * 1000))
        self._fine = self if fine_ms == self._step_ms else Accounting(
            prom, range_, f"{fine_ms}ms", selector, at=self.at, cluster_labels=cluster_labels,
            attribution=fine_ms / 1000)  # fmt: skip

    def samples(self, promql: str, *need: str) -> list[Sample]:
        """The query's samples that carry every label in ``need``: PromQL drops an empty label from a ``by`` result
        (a series with no job id), and a server that is not what it claims may send anything."""
        return [s for s in self.prom.query(promql, self.at) if all(s.labels.get(k) for k in need)]

    def _job_key(self, labels: dict[str, str]) -> JobKey:
        """The job of a result series: its id, its instance when the id is node-local, its cluster."""
        scope = labels.get("job_scope", "node")
        return JobKey(labels["job_id"], None if scope == "cluster" else labels.get("instance"), self.cluster_of(labels))

    def owners(self, kind: str) -> dict[JobKey, str]:
        """Each job's owner of ``kind`` (a label of gpu_job_info: user, account, namespace) over the range, from the
        jobs' series (``max_over_time``: a job that ended is still named); a job that gave several (a user from its
        processes, then the prolog's) is given the first in order. Jobs without one are left out."""
        named = self.metric("gpu_job_info", kind + '!=""')
        q = f"max by ({self._c}instance, job_id, job_scope, job_kind, {kind}) (max_over_time({named}[{self.range}]))"
        out: dict[JobKey, str] = {}
        for s in sorted(self.samples(q, "job_id", kind), key=lambda s: s.labels[kind]):
            out.setdefault(self._job_key(s.labels), s.labels[kind])
        return out

    def jobs(self, job_id: str | None = None, instance: str | None = None) -> dict[JobKey, Usage]:
        """Usage of every job that held a GPU in the range (or of one job id, on one instance)."""
        if self._fine is not self:
            self._fine._reasons = self._gpu_reasons()  # which reasons to ask about: the step's are enough
            return self._fine.jobs(job_id, instance)
        jf = _job_filter(job_id, instance)
        out: dict[JobKey, Usage] = defaultdict(Usage)
        self._add_held(out, jf)
        self._add_counted(out, jf)
        self._add_per_step(out, jf)
        self._add_reasons(out, jf)
        self._price(out.values())
        return dict(out)

    def _add_held(self, out: dict[JobKey, Usage], jf: str) -> None:
        """Add each job's held GPU-hours, nodes, GPUs, cluster and kind to ``out``."""
        # held: the GPU's accounted seconds in every state but free while the job held it (so held = busy + lost,
        # from the same counters), per GPU and job: the job's held hours, nodes and GPUs
        held = self._gpu_increase("gpu_state_seconds_total", 'state!="free"')
        for s in self.samples(self._per_job(held, jf, by="instance, gpu, job_id, job_scope, job_kind"), *_GPU_JOB):
            u = out[self._job_key(s.labels)]
            u.held_hours += s.value / 3600
            u.instances.add(s.labels["instance"])
            u.gpus.add((s.labels["instance"], s.labels["gpu"]))
            u.cluster = self.cluster_of(s.labels)
            u.kind = s.labels.get("job_kind", u.kind)

    def _add_counted(self, out: dict[JobKey, Usage], jf: str) -> None:
        """Add each job's busy and lost GPU-hours by cause, the energy held idle and the peer waits to ``out``
        (the growth of the daemons' counters over the range)."""
        busy = self._increase("gpu_state_seconds_total", 'state="busy"')
        for s in self.samples(self._per_job(busy, jf), "job_id"):
            out[self._job_key(s.labels)].busy_hours += s.value / 3600
        for cause in LOST_CAUSES:
            idle = self._increase("gpu_idle_seconds_total", f'cause="{cause}"')
            for s in self.samples(self._per_job(idle, jf), "job_id"):
                out[self._job_key(s.labels)].lost_hours[cause] += s.value / 3600
        for s in self.samples(self._per_job(self._increase("gpu_held_idle_energy_joules_total"), jf), "job_id"):
            u = out[self._job_key(s.labels)]
            u.held_idle_energy_joules = (u.held_idle_energy_joules or 0.0) + s.value
        for s in self.samples(self._per_job(self._increase("gpu_peer_wait_seconds_total"), jf), "job_id"):
            u = out[self._job_key(s.labels)]
            u.peer_wait_hours = (u.peer_wait_hours or 0.0) + s.value / 3600

    def _add_per_step(self, out: dict[JobKey, Usage], jf: str) -> None:
        """Add the effective and peak-equivalent GPU-hours of each job already in ``out``, step by step."""
        # effective (SM activity >= EFFECTIVE_SM) and peak-equivalent (OFU) GPU-hours, step by step
        h = self.step_s / 3600
        for s in self.samples(self._per_job(self._effective(), jf), "job_id"):
            if self._job_key(s.labels) in out:
                u = out[self._job_key(s.labels)]
                u.effective_hours = (u.effective_hours or 0.0) + s.value * h
        ofu = f"avg_over_time({self.metric('gpu_flop_utilization_ratio')}{self._window()})"
        for s in self.samples(self._per_job(ofu, jf), "job_id"):
            if self._job_key(s.labels) in out:
                u = out[self._job_key(s.labels)]
                u.peak_equivalent_hours = (u.peak_equivalent_hours or 0.0) + s.value * h

    def _add_reasons(self, out: dict[JobKey, Usage], jf: str) -> None:
        """Add the steps of each reason the daemons gave for a job's GPUs while it held them to ``out``."""
        # the reasons the daemons gave for a job's GPUs while it held them, step by step (one query per reason seen
        # in the range: the diagnosis and the job shares both have several series per GPU, which PromQL cannot
        # match many-to-many)
        seen = {r for reasons in self._gpu_reasons().values() for r in reasons}
        for reason in sorted(seen):
            flagged = f"{self._at_step('gpu_diagnosis', f'reason={promql_string(reason)}')} == bool 1"
            for s in self.samples(self._per_job(flagged, jf), "job_id"):
                if s.value > 0:
                    u = out[self._job_key(s.labels)]
                    u.reasons[reason] = u.reasons.get(reason, 0.0) + s.value

    def records_coverage(self) -> RecordsCoverage:
        """What of the range the usage records (alerts/gpuwarden.rules.yml, group gpuwarden.usage) hold for the
        selected nodes, from their heartbeat (RECORDED_HEARTBEAT, one record a node and evaluation): in the cluster
        whose records begin latest, when they begin, and in the cluster that misses most, the share of the
        evaluations due since its first record that wrote none (1 - records / due, the one an end of the range may
        cut forgiven). An evaluation Prometheus missed (a group past its interval, a restart, a ruler down) is an
        interval of GPU-time no record holds; the counters (``jobs()``) lose nothing."""
        by = self._c.rstrip(", ")
        beat = self.metric(RECORDED_HEARTBEAT)
        end = self.at + RECORDED_OFFSET  # each record covers the interval that ended RECORDED_OFFSET before it
        counts = {
            self.cluster_of(s.labels): s.value
            for s in self.prom.query(f"max by ({by}) (count_over_time({beat}[{self._range_ms}ms]))", end)
        }
        first = f"min by ({by}) (min_over_time(timestamp({beat})[{self._range_ms}ms:{RECORDED_INTERVAL}]))"
        starts = {self.cluster_of(s.labels): s.value for s in self.prom.query(first, end)}  # fmt: skip
        known = [c for c in counts if c in starts]
        if not known:
            return RecordsCoverage(None, 0.0)
        interval = _rules.seconds(RECORDED_INTERVAL)
        missing = 0.0
        for c in known:
            due = (end - starts[c]) / interval + 1  # an evaluation at the first record's time and each interval after
            missing = max(missing, (due - counts[c] - 1) / due)
        return RecordsCoverage(max(starts[c] for c in known), max(0.0, missing))

    def _summed_records(self, name: str, by: str, *need: str) -> list[Sample]:
        """The usage record ``name`` summed over the range by cluster, instance and ``by``, the samples that carry
        instance and every label of ``need``. Each record covers the interval that ended RECORDED_OFFSET before
        its evaluation: they are read that much later, so that they cover the range."""
        window = f"[{self._range_ms}ms] offset -{RECORDED_OFFSET}s"
        q = f"sum by ({self._c}instance, {by}) (sum_over_time({self.metric(name)}{window}))"
        return self.samples(q, "instance", *need)

    def recorded_jobs(self) -> dict[JobKey, Usage]:
        """``jobs()`` from the usage records (``recorded`` says whether they cover the range): every job that held a
        GPU in the range, each figure the sum over the range of the records of its nodes, one sample a node and
        record interval (what the records are: gpuwarden.mixin.rules.usage_records). Within about 1% of ``jobs()``
        over hours: the records cover whole intervals (1 minute), so the range's ends are those of the intervals
        nearest them (a GPU held across an end counts up to an interval more or less there), a GPU that changed
        hands within an interval is split by its scrapes there, an evaluation Prometheus missed is a gap, and the
        reasons are GPU-scrapes (``jobs()``: GPU-steps), which only rank them."""
        c = self._c
        window = f"[{self._range_ms}ms]"
        out: dict[JobKey, Usage] = defaultdict(Usage)

        def summed(name: str, extra: str = "") -> list[Sample]:
            return self._summed_records(name, "job_id, job_scope, job_kind" + extra, "job_id")

        for s in summed(RECORDED["held"]):
            u = out[self._job_key(s.labels)]
            u.held_hours += s.value / 3600
            u.instances.add(s.labels["instance"])
            u.cluster = self.cluster_of(s.labels)
            u.kind = s.labels.get("job_kind", u.kind)
        share = f"last_over_time({self.metric(RECORDED_SHARE)}{window})"
        for s in self.samples(f"group by ({c}instance, gpu, job_id, job_scope, job_kind) ({share})", *_GPU_JOB):
            if self._job_key(s.labels) in out:
                out[self._job_key(s.labels)].gpus.add((s.labels["instance"], s.labels["gpu"]))
        fields = (("busy", "busy_hours", 3600), ("peer_wait", "peer_wait_hours", 3600),
                  ("held_idle_energy", "held_idle_energy_joules", 1), ("effective", "effective_hours", 3600),
                  ("peak_equivalent", "peak_equivalent_hours", 3600))  # fmt: skip
        for record, attr, unit in fields:
            for s in summed(RECORDED[record]):
                if (job := out.get(self._job_key(s.labels))) is not None:
                    setattr(job, attr, (getattr(job, attr) or 0.0) + s.value / unit)
        for s in summed(RECORDED["lost"], ", cause"):
            if (job := out.get(self._job_key(s.labels))) is not None and s.labels.get("cause") in job.lost_hours:
                job.lost_hours[s.labels["cause"]] += s.value / 3600
        for s in summed(RECORDED["reasons"], ", reason"):
            if (job := out.get(self._job_key(s.labels))) is not None and s.labels.get("reason"):
                job.reasons[s.labels["reason"]] = job.reasons.get(s.labels["reason"], 0.0) + s.value
        self._price(out.values())
        return dict(out)

    def recorded_gpus(self) -> dict[GpuKey, Usage]:
        """``gpus()`` from the usage records per GPU (each state's and idle cause's growth a minute, the diagnosis's
        scrapes by reason), summed over the range as ``recorded_jobs`` sums the jobs' (the same 1% and the same
        ends). The reasons are scrapes (``gpus()``: steps), which only rank them."""
        out: dict[GpuKey, Usage] = defaultdict(Usage)

        def summed(name: str, by: str) -> list[Sample]:
            return self._summed_records(name, f"gpu, {by}", "gpu", by)

        for s in summed(RECORDED_GPU["causes"], "cause"):
            u = out[self.gpu_key(s.labels)]
            if s.labels["cause"] == "free":
                u.free_hours += s.value / 3600
            elif s.labels["cause"] in u.lost_hours:
                u.lost_hours[s.labels["cause"]] += s.value / 3600
        for s in summed(RECORDED_GPU["states"], "state"):
            u = out[self.gpu_key(s.labels)]
            if s.labels["state"] != "free":
                u.held_hours += s.value / 3600
            if s.labels["state"] == "busy":
                u.busy_hours += s.value / 3600
        for s in summed(RECORDED_GPU["reasons"], "reason"):
            if self.gpu_key(s.labels) in out:
                out[self.gpu_key(s.labels)].reasons[s.labels["reason"]] = s.value
        return self._priced_gpus(out)

    def idle_facts(self, reclaimable: tuple[str, ...], job_filter: str = "") -> dict[JobKey, IdleFacts]:
        """What the reclaim ladder (gpuwarden.reclaim) asks of each job over the range: the seconds it held its GPUs
        (every state but free, while it held them), how many of those went to the ``reclaimable`` idle causes (e.g.
        held_idle, paused), the GPUs, the reasons the daemons gave for them, and the job's names from gpu_job_info
        at the range's end (namespace, pod, slurm_job_id, where a daemon knew them). ``job_filter``: label matchers
        of the jobs asked about, on their series (``job_series``: e.g. ``job_kind="slurm"``)."""
        if self._fine is not self:
            self._fine._reasons = self._gpu_reasons()
            return self._fine.idle_facts(reclaimable, job_filter)
        jf = job_filter.strip().strip(",")
        out: dict[JobKey, IdleFacts] = {}
        held = self._gpu_increase("gpu_state_seconds_total", 'state!="free"')
        for s in self.samples(self._per_job(held, jf, by="instance, gpu, job_id, job_scope, job_kind"), *_GPU_JOB):
            f = out.setdefault(self._job_key(s.labels), IdleFacts(kind=s.labels.get("job_kind", "")))
            f.held_seconds += s.value
            f.gpus.add((s.labels["instance"], s.labels["gpu"]))
        if reclaimable:
            causes = "|".join(re.escape(c) for c in reclaimable)
            idle = self._gpu_increase("gpu_idle_seconds_total", f'cause=~"{causes}"')
            for s in self.samples(self._per_job(idle, jf), "job_id"):
                if self._job_key(s.labels) in out:
                    out[self._job_key(s.labels)].reclaimable_seconds += s.value
        seen = {r for reasons in self._gpu_reasons().values() for r in reasons}
        for reason in sorted(seen):
            flagged = f"{self._at_step('gpu_diagnosis', f'reason={promql_string(reason)}')} == bool 1"
            for s in self.samples(self._per_job(flagged, jf), "job_id"):
                if s.value > 0 and self._job_key(s.labels) in out:
                    out[self._job_key(s.labels)].reasons.add(reason)
        info = f"last_over_time({self.metric('gpu_job_info')}[{self._range_ms}ms])"
        q = f"max by ({self._c}instance, job_id, job_scope, namespace, pod, slurm_job_id) ({info})"
        for s in self.samples(q, "job_id"):
            named = out.get(self._job_key(s.labels))
            if named is not None:
                for name in ("namespace", "pod", "slurm_job_id"):
                    named.names[name] = named.names.get(name) or s.labels.get(name, "")
        return out

    def narrowed(self, job_filter: str) -> list[Accounting] | None:
        """This accounting restricted to the GPUs the job(s) of ``job_filter`` (label matchers) held in the range, in
        parts of at most NARROW_GPUS GPUs each (a ``uuid=~`` matcher added to each part's selector), so that a job's
        queries cost what the job is, not what the fleet is, and no query grows with the job: other jobs' shares of
        those GPUs are still counted, and every figure is a sum over GPUs, so the parts add up to the job. None when
        no such job held a GPU in the range; [self] when a series of the job names no UUID (nothing to narrow by)."""
        if self._narrow:
            return [self]
        info = self.job_series(job_filter)
        window = self._range_ms + self._step_ms  # the first step's presence reads a step before the range
        q = f"group by (uuid) (last_over_time({info}[{window}ms]))"
        found = self.prom.query(q, self.at)
        if not found:
            return None
        uuids = sorted({s.labels.get("uuid", "") for s in found})
        if "" in uuids:
            return [self]
        parts = []
        for first in range(0, len(uuids), NARROW_GPUS):
            regex = promql_string("|".join(re.escape(u) for u in uuids[first : first + NARROW_GPUS]))
            sel = ", ".join(x for x in (self.sel, f"uuid=~{regex}") if x)
            part = Accounting(self.prom, self.range, self.step, sel, at=self.at, cluster_labels=self.cluster_labels,
                              attribution=self._fine.step_s)  # fmt: skip
            part._narrow = part._fine._narrow = True
            parts.append(part)
        return parts

    def job_details(self, job_id: str, instance: str | None = None) -> dict[JobKey, Usage]:
        """``jobs()`` of one id, with energy added: all of it, above the idle floor by lost cause, and above it while
        waiting on peers. Asks only about the GPUs the id held (``narrowed``)."""
        parts = self.narrowed(_job_filter(job_id, instance))
        if parts is None:
            return {}
        if parts[0] is not self:
            out: dict[JobKey, Usage] = {}
            for part in parts:
                for key, usage in part.job_details(job_id, instance).items():
                    if key in out:
                        out[key].absorb(usage)
                    else:
                        out[key] = usage
            self._price(out.values())
            return out
        if self._fine is not self:
            self._fine._reasons = self._gpu_reasons()
            return self._fine.job_details(job_id, instance)
        out = self.jobs(job_id, instance)
        jf = _job_filter(job_id, instance)
        for s in self.samples(self._per_job(self._increase("gpu_peer_wait_energy_joules_total"), jf), "job_id"):
            if self._job_key(s.labels) in out:
                u = out[self._job_key(s.labels)]
                u.peer_wait_energy_joules = (u.peer_wait_energy_joules or 0.0) + s.value
        for cause in LOST_CAUSES:  # one query per cause: the job shares have several series per GPU too
            joules = self._increase("gpu_idle_energy_joules_total", f"cause={promql_string(cause)}")
            for s in self.samples(self._per_job(joules, jf), "job_id"):
                if self._job_key(s.labels) in out:
                    u = out[self._job_key(s.labels)]
                    u.idle_energy_joules = u.idle_energy_joules or dict.fromkeys(LOST_CAUSES, 0.0)
                    u.idle_energy_joules[cause] += s.value
        for s in self.samples(self._per_job(self._increase("gpu_energy_joules_total"), jf), "job_id"):
            if self._job_key(s.labels) in out:
                u = out[self._job_key(s.labels)]
                u.energy_joules = (u.energy_joules or 0.0) + s.value
        return out

    def stragglers(self, key: JobKey) -> list[tuple[str, str, float]]:
        """GPUs of the job the daemons flagged ``straggler`` in at least STRAGGLER_MIN_SHARE of the steps the job held
        them: (instance, gpu, share), most flagged first."""
        jf = _key_filter(key, self.cluster_labels)
        parts = self.narrowed(jf)
        if parts is None:
            return []
        if parts[0] is not self:
            return sorted((g for part in parts for g in part.stragglers(key)), key=lambda x: -x[2])
        if self._fine is not self:
            return self._fine.stragglers(key)
        straggler = self._at_step("gpu_diagnosis", 'reason="straggler"')
        flagged = self.samples(self._per_job(f"{straggler} == bool 1", jf, by="instance, gpu"), "instance", "gpu")
        held = {
            (s.labels["instance"], s.labels["gpu"]): s.value
            for s in self.samples(self._per_job(self._one(), jf, by="instance, gpu"), "instance", "gpu")
        }
        out = []
        for s in flagged:
            g = (s.labels["instance"], s.labels["gpu"])
            share = s.value / held[g] if held.get(g) else 0.0
            if share >= STRAGGLER_MIN_SHARE:
                out.append((g[0], g[1], share))
        return sorted(out, key=lambda x: -x[2])

    def slurm_jobs(self, number: str) -> list[tuple[str, Cluster]]:
        """The job ids (SLUIDs), with their clusters, of the Slurm jobs whose series carry ``slurm_job_id`` =
        ``number`` in the range: a job keyed by its SLUID (Slurm 26.05+ cgroups) found by the numeric id users know.
        Sorted; [] when no daemon could read the number (it comes from a process's environment)."""
        info = self.job_series(f'job_kind="slurm", slurm_job_id={promql_string(number)}')
        q = f"group by ({self._c}job_id) (max_over_time({info}[{self.range}]))"
        found = {(s.labels["job_id"], self.cluster_of(s.labels)) for s in self.samples(q, "job_id")}
        return sorted(x for x in found if x[0] != number)

    def lost_gpus(self, key: JobKey) -> list[tuple[str, str]]:
        """The GPUs of the job that went down (``gpu_up`` 0) in the range within LOST_WITHIN_SECONDS of the job's
        last sample on them: (instance, gpu), sorted."""
        parts = self.narrowed(_key_filter(key, self.cluster_labels))
        if parts is None:
            return []
        if parts[0] is not self:
            return sorted(g for part in parts for g in part.lost_gpus(key))
        c = self._c
        info = self.job_series(_key_filter(key, self.cluster_labels))
        recent = f"max by ({c}instance, gpu, uuid) (max_over_time({info}[{LOST_WITHIN_SECONDS}s]))"
        down = f"({self.metric('gpu_up')} == bool 0)"
        q = (f"max by (instance, gpu) (max_over_time(({down} * on ({c}instance, gpu, uuid) group_left () {recent})"
             f"[{self.range}:{self.step}])) == 1")  # fmt: skip
        return sorted((s.labels["instance"], s.labels["gpu"]) for s in self.samples(q, "instance", "gpu"))

    def _gpu_reasons(self) -> dict[GpuKey, dict[str, float]]:
        """Per GPU, the steps of the range each reason of gpu_diagnosis was 1 (asked once: jobs() and gpus() share
        it)."""
        if self._reasons is not None:
            return self._reasons
        flagged = f"{self._at_step('gpu_diagnosis')} == 1"
        q = f"sum by ({self._c}instance, gpu, reason) (count_over_time({self._steps(flagged)}))"
        out: dict[GpuKey, dict[str, float]] = defaultdict(dict)
        for s in self.samples(q, "instance", "gpu", "reason"):
            out[self.gpu_key(s.labels)][s.labels["reason"]] = s.value
        self._reasons = dict(out)
        return self._reasons

    def gpus(self) -> dict[GpuKey, Usage]:
        """Usage of every GPU over the range: held (every state but free), busy, lost hours by cause, free hours,
        the reasons given."""
        if self._fine is not self:
            self._fine._reasons = self._gpu_reasons()
            return self._fine.gpus()
        out: dict[GpuKey, Usage] = defaultdict(Usage)
        c = self._c
        idle = self._increase("gpu_idle_seconds_total")
        q = f"sum by ({c}instance, gpu, cause) (sum_over_time({self._steps(idle)}))"
        for s in self.samples(q, "instance", "gpu", "cause"):
            u = out[self.gpu_key(s.labels)]
            if s.labels["cause"] == "free":
                u.free_hours += s.value / 3600
            elif s.labels["cause"] in u.lost_hours:
                u.lost_hours[s.labels["cause"]] += s.value / 3600
        for state, attr in (('state="busy"', "busy_hours"), ('state!="free"', "held_hours")):
            grew = self._increase("gpu_state_seconds_total", state)
            q = f"sum by ({c}instance, gpu) (sum_over_time({self._steps(grew)}))"
            for s in self.samples(q, "instance", "gpu"):
                u = out[self.gpu_key(s.labels)]
                setattr(u, attr, getattr(u, attr) + s.value / 3600)
        for g, reasons in self._gpu_reasons().items():
            if g in out:
                out[g].reasons = reasons
        return self._priced_gpus(out)

    def _priced_gpus(self, out: dict[GpuKey, Usage]) -> dict[GpuKey, Usage]:
        """``out`` with each GPU's cluster, instance and GPU set on its usage, and its cost (``_price``)."""
        for (cluster, inst, gpu), u in out.items():
            u.cluster = cluster
            u.instances.add(inst)
            u.gpus.add((inst, gpu))
        self._price(out.values())
        return dict(out)

    def seen_throughout(self) -> set[tuple[Cluster, str]]:
        """(cluster, instance) of every node whose GPUs (``gpu_up``) have samples both at the range's end and at its
        start: a node with data over the whole range."""
        up = self.metric("gpu_up")

        def nodes(offset: str) -> set[tuple[Cluster, str]]:
            q = f"group by ({self._c}instance) ({up}{offset})"
            return {(self.cluster_of(s.labels), s.labels["instance"]) for s in self.samples(q, "instance")}

        return nodes("") & nodes(f" offset {self.range}")

    def node_names(self) -> dict[tuple[Cluster, str], str]:
        """(cluster, instance) -> node name (gpu_devices{nodename}) of every instance seen in the range (a node gone
        since keeps its name)."""
        q = f"max by ({self._c}instance, nodename) (max_over_time({self.metric('gpu_devices')}[{self.range}]))"
        return {(self.cluster_of(s.labels), s.labels["instance"]): s.labels.get("nodename", "")
                for s in self.samples(q, "instance")}  # fmt: skip

    def _price(self, usages: Iterable[Usage]) -> None:
        """Set each usage's price (per GPU-hour: the mean of its nodes' prices, a multi-node job split evenly over
        them) and cost (its lost GPU-hours at that price); no price on any of its nodes: None."""
        prices = self._node_prices()
        for u in usages:
            priced = [prices[(u.cluster, i)] for i in u.instances if (u.cluster, i) in prices]
            if priced:
                u.price = sum(p for p, _ in priced) / len(priced)
                u.cost = u.lost_total * u.price
                u.currency = "/".join(sorted({c for _, c in priced}))

    def _node_prices(self) -> dict[tuple[Cluster, str], tuple[float, str]]:
        """Each priced node's price of a GPU-hour and its currency. A node's price is its GPU models' prices
        (gpuwarden_gpu_hour_price{model}, the highest each node exported in the range, so a node gone since is
        priced); on a node of several priced models, weighted by its GPUs of each (gpu_info's name, the accounting's
        GPUs where it is narrowed to a job's). A price without a model (an older daemon's) is the node's for every
        model."""
        range_ = f"[{self.range}]"
        q = (f"max by ({self._c}instance, model, currency) "
             f"(max_over_time({self.metric('gpuwarden_gpu_hour_price')}{range_}))")  # fmt: skip
        by_model: dict[tuple[Cluster, str], dict[str, tuple[float, str]]] = defaultdict(dict)
        for s in self.samples(q, "instance"):
            node = (self.cluster_of(s.labels), s.labels["instance"])
            by_model[node][s.labels.get("model", "")] = (s.value, s.labels.get("currency", ""))
        mixed = sorted({i for (_, i), models in by_model.items() if len(models) > 1})
        counts: dict[tuple[Cluster, str], dict[str, float]] = defaultdict(dict)
        if mixed:  # only a node of several priced models is weighted: the query grows with those, not the fleet
            regex = promql_string("|".join(re.escape(i) for i in mixed))
            info = self.metric("gpu_info", f"instance=~{regex}")
            for s in self.samples(f"count by ({self._c}instance, name) (max_over_time({info}{range_}))", "instance"):
                counts[(self.cluster_of(s.labels), s.labels["instance"])][s.labels.get("name", "")] = s.value
        return {node: _weighted(models, counts.get(node, {})) for node, models in by_model.items()}


def _job_filter(job_id: str | None, instance: str | None) -> str:
    """Label matchers selecting one job id and/or one instance ('' for neither)."""
    parts = [f"{k}={promql_string(v)}" for k, v in (("job_id", job_id), ("instance", instance)) if v is not None]
    return ", ".join(parts)


def _key_filter(key: JobKey, cluster_labels: tuple[str, ...]) -> str:
    """Label matchers selecting the series of one job: its id, its instance if node-local, its cluster."""
    cluster = [f"{label}={promql_string(v)}" for label, v in zip(cluster_labels, key.cluster, strict=False)]
    return ", ".join([_job_filter(key.job_id, key.instance), *cluster])


def _weighted(models: dict[str, tuple[float, str]], counts: dict[str, float]) -> tuple[float, str]:
    """A node's price and currency from its models' (model -> (price, currency); "" for a price without a model)
    weighted by its GPUs of each (``counts``: model -> GPUs); without counts (one model, or GPUs gone from
    gpu_info) each model's price weighs the same."""
    weighted = [(models.get(m, models.get("")), n) for m, n in counts.items()]
    known = [(p, n) for p, n in weighted if p is not None] or [(p, 1.0) for p in models.values()]
    total = sum(n for _, n in known)
    return sum(p[0] * n for p, n in known) / total, "/".join(sorted({p[1] for p, _ in known}))
