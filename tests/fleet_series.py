"""Hours of gpuwarden series for two clusters, written as OpenMetrics for ``promtool tsdb create-blocks-from
openmetrics``, with what their counters say each job and GPU held, computed here sample by sample.

These are not GPU readings: they exercise the fleet accounting's arithmetic (steps, offsets, joins, counter
resets), so every number is chosen to make a wrong step visible. Clusters ``alpha`` and ``beta`` each have a node
``n1:9400`` (one instance name in both, as two clusters' first nodes often are); alpha has ``n2:9400`` too. A
Slurm job's SLUID runs in both clusters (two jobs); on alpha's n2 GPU 0 Slurm job 4242 hands over to 4343 at a
scrape that is neither on a minute nor on any step's end; beta's n1 GPU 1 runs a node-local systemd unit for an
hour; alpha's b0-b7 run a 64-GPU Slurm job, b8 an 8-GPU one; beta's n1 and alpha's b3 daemons restart (their
counters start again from zero) after a 30-second gap, and as the daemon does, it exports a state or cause only
once its counter has grown: each appears at the scrape after its first growth.

Scrapes are as a loaded Prometheus makes them: each node's at its own offset within the interval with a little
jitter, about one in 50 missed (the daemon kept counting; the next scrape reads the growth), and alpha's n2 unscraped
for 4 minutes in the third hour (its daemon kept counting).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

#: Seconds between scrapes.
SCRAPE = 15
SLUID = "sSHARED2CLUSTERS"
#: A 64-GPU Slurm job over 8 nodes of 8 GPUs (alpha's b0-b7) and an 8-GPU one (alpha's b8).
BIG, EIGHT = "7000", "7100"
UNIT = "/system.slice/train.service"
#: job id -> (scope, kind, busy seconds of each 15-second scrape, the idle state, its cause).
JOBS = {
    SLUID: ("cluster", "slurm", 9, "starved", "input_cpu"),
    BIG: ("cluster", "slurm", 12, "starved", "launch"),
    EIGHT: ("cluster", "slurm", 3, "held_idle", "held_idle"),
    "4242": ("cluster", "slurm", 14, "starved", "launch"),
    "4343": ("cluster", "slurm", 0, "held_idle", "held_idle"),
    UNIT: ("node", "systemd", 5, "paused", "paused"),
}
#: job id -> the reason the daemon gives while it holds a GPU (gpu_diagnosis{reason} at 1).
REASON = {SLUID: "input_starved", "4242": "launch_bound", "4343": "held_idle", UNIT: "paused", BIG: "launch_bound",
          EIGHT: "held_idle"}  # fmt: skip
STATES = ("busy", "starved", "paused", "held_idle", "free")
CAUSES = ("input_cpu", "launch", "held_idle", "paused", "free")
#: (cluster, instance) -> GPUs
NODES = {("alpha", "n1:9400"): 2, ("alpha", "n2:9400"): 2, ("beta", "n1:9400"): 2,
         **{("alpha", f"b{i}:9400"): 8 for i in range(9)}}  # fmt: skip
#: (cluster, instance) -> seconds past each SCRAPE mark its scrapes land (Prometheus spreads targets over the
#: interval); each scrape is up to JITTER seconds either side of it.
OFFSET = {("alpha", "n1:9400"): 3.217, ("alpha", "n2:9400"): 9.5, ("beta", "n1:9400"): 0.4,
          **{("alpha", f"b{i}:9400"): 1.1 + 1.5 * i for i in range(9)}}  # fmt: skip
JITTER = 0.2
#: One scrape in about this many is missed (a timeout under load): no sample, the counters keep growing.
MISSED_ONE_IN = 53
#: alpha's n2 is not scraped for this long from t0 + GAP_FROM (its daemon keeps counting): under the 5-minute look back.
GAP = 240
GAP_FROM = 2 * 3600 + 15 * 60 + 45
PRICE = 2.0


#: The states a job holds its GPU in (every state but free): held hours are their seconds.
HELD = ("busy", "starved", "paused", "held_idle")


def hours(seconds: dict[str, float], *names: str) -> float:
    """Hours of the ``names`` states or causes of one of Truth's dicts of seconds."""
    return sum(v for k, v in seconds.items() if k in names) / 3600


@dataclass
class Truth:
    """Seconds the counters grew in (start, end], per GPU ((cluster, instance, gpu) -> state or cause -> s) and per
    job ((job id, instance or None, cluster) -> the same)."""

    gpu_states: dict[tuple, dict[str, float]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))
    gpu_causes: dict[tuple, dict[str, float]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))
    job_states: dict[tuple, dict[str, float]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))
    job_causes: dict[tuple, dict[str, float]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))


class Fleet:
    """The series from ``t0`` (Unix seconds, a multiple of SCRAPE) for ``hours``: the job changeover on alpha's n2
    GPU 0 at ``t0 + change`` s, beta's n1 daemon down from ``t0 + restart`` s for 30 s; ``nodes``: only these
    (cluster, instance) of NODES (None: all)."""

    def __init__(self, t0: int, hours: float, change: int = 3135, restart: int = 4995,
                 nodes: tuple[tuple[str, str], ...] | None = None) -> None:  # fmt: skip
        self.nodes = {k: v for k, v in NODES.items() if nodes is None or k in nodes}
        self.t0, self.end = t0, t0 + int(hours * 3600)
        self.change, self.restart = t0 + change, t0 + restart
        self.times = list(range(t0, self.end + 1, SCRAPE))
        self._samples: dict[tuple, list[tuple[float, float]]] | None = None

    def holder(self, cluster: str, instance: str, gpu: int, t: int) -> str | None:
        """The job holding the GPU at time ``t`` (None: free)."""
        if instance.startswith("b"):
            return EIGHT if instance == "b8:9400" else BIG
        if instance == "n1:9400" and (gpu == 0 or cluster == "alpha"):
            return SLUID
        if cluster == "alpha" and gpu == 0:
            return "4242" if t < self.change else "4343"
        if cluster == "beta" and self.t0 + 3600 <= t < self.t0 + 7200:
            return UNIT
        return None

    def _down(self, cluster: str, instance: str, t: int) -> bool:
        return (cluster == "beta" or instance == "b3:9400") and self.restart <= t < self.restart + 30

    def _missed(self, cluster: str, instance: str, t: int) -> bool:
        """Whether the scrape of (cluster, instance) due at ``t`` wrote nothing (the daemon ran)."""
        k = (t - self.t0) // SCRAPE + 7 * list(NODES).index((cluster, instance))
        if (cluster, instance) == ("alpha", "n2:9400") and 0 <= t - self.t0 - GAP_FROM < GAP:
            return True
        return k % MISSED_ONE_IN == MISSED_ONE_IN - 1 and t != self.change  # the handover's scrape is read

    def _stamp(self, cluster: str, instance: str, t: int) -> float:
        """When the scrape due at ``t`` (a SCRAPE mark) took its samples: the node's offset, jittered."""
        jitter = ((t // SCRAPE) * 7919 % 401 - 200) / 200 * JITTER
        return round(t + OFFSET[(cluster, instance)] + jitter, 3)

    def _growth(self, job: str | None) -> tuple[dict[str, int], dict[str, int]]:
        """One scrape interval's growth of the state and cause counters of a GPU held by ``job``."""
        if job is None:
            return {"free": SCRAPE}, {"free": SCRAPE}
        _, _, busy, state, cause = JOBS[job]
        idle = SCRAPE - busy
        return {"busy": busy, state: idle}, ({cause: idle} if idle else {})

    def samples(self) -> dict[tuple, list[tuple[float, float]]]:
        """Every series: (metric, frozen labels) -> [(t, value)], time-ordered (t: when the scrape took it); made
        once."""
        if self._samples is not None:
            return self._samples
        out: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
        for key, points in self._nominal().items():
            cluster, instance = dict(key[1])["cluster"], dict(key[1])["instance"]
            out[key] = [(self._stamp(cluster, instance, t), v) for t, v in points
                        if not self._missed(cluster, instance, t)]  # fmt: skip
        self._samples = out
        return out

    def _nominal(self) -> dict[tuple, list[tuple[int, float]]]:
        """Every series as the daemons export it at each SCRAPE mark, each scrape taken."""
        out: dict[tuple, list[tuple[int, float]]] = defaultdict(list)
        for (cluster, instance), n in self.nodes.items():
            node = {"cluster": cluster, "instance": instance, "job": "gpuwarden"}
            states = {g: dict.fromkeys(STATES, 1000.0 * (g + 1)) for g in range(n)}  # the daemon ran before
            causes = {g: dict.fromkeys(CAUSES, 500.0 * (g + 1)) for g in range(n)}
            for t in self.times:
                if self._down(cluster, instance, t):
                    continue
                restarted = (cluster == "beta" or instance == "b3:9400") and t == self.restart + 30
                name = f"{instance.split(':')[0]}-{cluster}"
                out[("gpu_devices", _key(node, nodename=name))].append((t, n))
                out[("gpuwarden_gpu_hour_price", _key(node, currency="USD"))].append((t, PRICE))
                for g in range(n):
                    gl = {**node, "gpu": str(g), "uuid": f"GPU-{cluster}-{instance}-{g}"}
                    job = self.holder(cluster, instance, g, t)
                    grow_s, grow_c = self._growth(job)
                    if restarted:  # a new daemon: its counters hold what it saw since it started
                        states[g] = dict.fromkeys(STATES, 0.0)
                        causes[g] = dict.fromkeys(CAUSES, 0.0)
                    # a state or cause has a series once its counter has grown (the daemon exports no zeros): after
                    # the restart, each appears at the scrape after its first growth
                    for s in STATES:
                        states[g][s] += grow_s.get(s, 0)
                        if states[g][s]:
                            out[("gpu_state_seconds_total", _key(gl, state=s))].append((t, states[g][s]))
                    for c in CAUSES:
                        causes[g][c] += grow_c.get(c, 0)
                        if causes[g][c]:
                            out[("gpu_idle_seconds_total", _key(gl, cause=c))].append((t, causes[g][c]))
                    out[("gpu_up", _key(gl))].append((t, 1))
                    if job is not None:
                        scope, kind, *_ = JOBS[job]
                        info = _key(gl, pid="4711", job_id=job, job_scope=scope, job_kind=kind, user="alice")
                        out[("gpu_process_job_info", info)].append((t, 1))
                        # and the GPU's job, as the daemon exports it beside its processes' (what the fleet reads)
                        out[("gpu_job_info", _key(gl, job_id=job, job_scope=scope, job_kind=kind))].append((t, 1))
                        out[("gpu_diagnosis", _key(gl, reason=REASON[job]))].append((t, 1))
                    # a kernel ran in this share of the scrape interval (effective: at least half of it)
                    out[("gpu_utilization_ratio", _key(gl))].append((t, grow_s.get("busy", 0) / SCRAPE))
        return out

    def openmetrics(self) -> str:
        """The series as OpenMetrics text (timestamps in seconds), ``# EOF`` last."""
        lines = []
        for (metric, labels), points in sorted(self.samples().items()):
            sel = ",".join(f'{k}="{v}"' for k, v in labels)
            lines += [f"{metric}{{{sel}}} {v} {t}" for t, v in points]
        return "\n".join([*lines, "# EOF", ""])

    def truth(self, start: float, end: float) -> Truth:
        """What the counters grew by in (start, end] (a reset: the new value is the growth), per GPU and per job
        (the job that held the GPU at the sample that read the growth)."""
        out = Truth()
        series = self.samples()
        for (metric, labels), points in series.items():
            if metric not in ("gpu_state_seconds_total", "gpu_idle_seconds_total"):
                continue
            d = dict(labels)
            gpu = (d["cluster"], d["instance"], d["gpu"])
            kind = "state" if "state" in d else "cause"
            for (_, before), (t, now) in zip(points, points[1:], strict=False):
                if not start < t <= end:
                    continue
                grew = now - before if now >= before else now
                due = self.t0 + int(t - self.t0) // SCRAPE * SCRAPE  # the SCRAPE mark of the scrape
                job = self.holder(d["cluster"], d["instance"], int(d["gpu"]), due)
                (out.gpu_states if kind == "state" else out.gpu_causes)[gpu][d[kind]] += grew
                if job is not None:
                    key = (job, d["instance"] if JOBS[job][0] == "node" else None, d["cluster"])
                    (out.job_states if kind == "state" else out.job_causes)[key][d[kind]] += grew
        return out


def _key(labels: dict[str, str], **more: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({**labels, **more}.items()))
