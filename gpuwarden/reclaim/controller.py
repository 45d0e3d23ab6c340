"""The reclaim controller: the ladder (gpuwarden.reclaim.ladder) evaluated over Prometheus every ``interval``, its
decisions handed to the actions (gpuwarden.reclaim.actions), logged with their evidence and counted on its own
``/metrics``; and the dry-run report of what it would have done over a past range.

A controller that starts follows the jobs' idle runs back over the longest step's ``after`` (warming up on history,
taking no step), so a restart does not send every idle job back to the bottom; it takes no step it finds already due
in the past either: a job idle for hours gets the first step at the first tick, and each next one the steps' gap
later, as it would have from the start. Each tick asks Prometheus afresh (a new client, ``timeout`` seconds for the
tick's queries together); a tick Prometheus cannot answer is logged, counted, and the next tick comes as planned.

The warm-up and the report ask the same questions at each of many past ticks: one client asks them as range queries
(gpuwarden.cluster.stepped), a handful of requests for a day, not several for each tick; the report's ticks fall on
multiples of the interval, as the query front ends of Thanos and Mimir align a range query's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuwarden.cluster.stepped import SteppedQueries
from gpuwarden.cluster.usage import Accounting, IdleFacts, JobKey
from gpuwarden.reclaim.actions import ActionRunner
from gpuwarden.reclaim.ladder import RESET, Decision, Ladder
from gpuwarden.reclaim.policy import Policy

if TYPE_CHECKING:
    from gpuwarden.cluster.promapi import InstantQueries, Prometheus

log = logging.getLogger("gpuwarden.reclaim")

#: Every outcome a decision can have (gpuwarden_reclaim_decisions_total{outcome}).
OUTCOMES = ("dry_run", "logged", "ran", "failed", "timed_out", "refused", "dropped", "reset")


class ReclaimMetrics:
    """The controller's own series (a prometheus_client registry): decisions by step and outcome, evaluations and
    their failures, the last evaluation's time, whether it runs dry, and the jobs on the ladder."""

    def __init__(self, policy: Policy, dry_run: bool, cluster_labels: tuple[str, ...]) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        self.decisions = Counter(
            "gpuwarden_reclaim_decisions",
            "Decisions of the reclaim ladder: a step a job reached (its outcome: dry_run, logged, ran, failed, "
            "timed_out, refused, dropped) or a job that worked again after climbing (step reset).",
            ["step", "outcome"],
            registry=self.registry,
        )
        for step in policy.steps:
            for outcome in OUTCOMES[:-1]:
                self.decisions.labels(step.name, outcome)
        self.decisions.labels(RESET, "reset")
        self.evaluations = Counter(
            "gpuwarden_reclaim_evaluations", "Ticks of the ladder evaluated.", registry=self.registry
        )
        self.failures = Counter(
            "gpuwarden_reclaim_evaluation_failures",
            "Ticks Prometheus could not answer (logged; the next tick comes as planned).",
            registry=self.registry,
        )
        self.last = Gauge(
            "gpuwarden_reclaim_last_evaluation_timestamp_seconds",
            "Unix time of the last tick evaluated.",
            registry=self.registry,
        )
        Gauge("gpuwarden_reclaim_dry_run", "1 when no action runs (dry run).", registry=self.registry).set(
            1 if dry_run else 0
        )
        own = ("job_id", "instance", "step")
        self.cluster_labels = tuple(label for label in cluster_labels if label not in own)
        self.jobs = Gauge(
            "gpuwarden_reclaim_job_step",
            "1 for each job on the ladder with the last step it took ('' none yet: idle, below the first step).",
            ["job_id", "instance", *self.cluster_labels, "step"],
            registry=self.registry,
        )

    def job(self, key: JobKey, cluster_labels: tuple[str, ...], step: str) -> None:
        """Set the series of ``key`` (its cluster named by ``cluster_labels``) on the ladder at ``step``."""
        cluster = dict(zip(cluster_labels, key.cluster, strict=False))
        self.jobs.labels(key.job_id, key.instance or "", *(cluster.get(c, "") for c in self.cluster_labels), step).set(
            1
        )

    def serve(self, address: str) -> None:
        """Serve the series on ``address`` (HOST:PORT) from a thread. Raises OSError when it cannot bind."""
        from prometheus_client import start_http_server

        host, _, port = address.rpartition(":")
        start_http_server(int(port), addr=host.strip("[]") or "0.0.0.0", registry=self.registry)


class Controller:
    """The ladder of ``policy`` over the Prometheus that ``connect()`` opens a client of, acting through an
    ActionRunner (``dry_run``: none runs); ``metrics`` counted where given."""

    def __init__(
        self,
        policy: Policy,
        connect: Callable[[], Prometheus],
        dry_run: bool,
        cluster_labels: tuple[str, ...] = ("cluster",),
        metrics: ReclaimMetrics | None = None,
    ) -> None:
        self.policy, self.connect, self.cluster_labels, self.metrics = policy, connect, cluster_labels, metrics
        self.ladder = Ladder(policy)
        self.runner = ActionRunner(dry_run, self._outcome, policy.max_concurrent_actions, cluster_labels)
        self._steps = {s.name: s for s in policy.steps}

    def facts(self, at: float, queries: InstantQueries | None = None) -> dict[JobKey, IdleFacts]:
        """Every job's facts over the tick that ends at ``at`` (Unix seconds), asked through ``queries`` (None: a
        client of its own). Raises PrometheusError."""
        if queries is None:
            prom = self.connect()
            try:
                return self.facts(at, prom)
            finally:
                prom.close()
        acc = Accounting(queries, self.policy.interval, self.policy.interval, self.policy.selector, at=at,
                         cluster_labels=self.cluster_labels)  # fmt: skip
        return acc.idle_facts(tuple(self.policy.reclaimable_causes), self.policy.job_selector)

    def replay(self, times: list[float], climb_after: float, progress: Callable[[int, int], None] | None = None
               ) -> list[Decision]:  # fmt: skip
        """The ladder over the past ticks ending at ``times`` (ascending, the interval apart), each asked through one
        client as range queries (SteppedQueries); steps taken only at ticks after ``climb_after`` (Unix seconds;
        none before: warming up). ``progress(done, total)`` after each tick. Raises PrometheusError."""
        tick = self.policy.interval_seconds
        out: list[Decision] = []
        if not times:
            return out
        prom = self.connect()
        try:
            queries = SteppedQueries(prom, times, tick)
            for n, at in enumerate(times, 1):
                out += self.ladder.tick(at, tick, self.facts(at, queries), climb=at > climb_after)
                if progress is not None:
                    progress(n, len(times))
        finally:
            prom.close()
        return out

    def warm_up(self, now: float) -> None:
        """Follow the idle runs over the ticks before ``now`` (back over the longest step), taking no step."""
        tick = self.policy.interval_seconds
        self.replay(ticks(now - self.policy.steps[-1].after_seconds - tick, now - tick, tick), climb_after=now)

    def evaluate(self, at: float) -> list[Decision]:
        """One tick ending at ``at``: the decisions, each handed to its action (or logged as a reset)."""
        decisions = self.ladder.tick(at, self.policy.interval_seconds, self.facts(at))
        for d in decisions:
            if d.step == RESET:
                self._outcome(d, "reset", "the job worked again")
            else:
                self.runner.submit(d, self._steps[d.step])
        if self.metrics is not None:
            self.metrics.evaluations.inc()
            self.metrics.last.set(at)
            self.metrics.jobs.clear()
            for key in self.ladder.jobs:
                self.metrics.job(key, self.cluster_labels, self.ladder.position(key) or "")
        return decisions

    def run(self, stop: threading.Event) -> None:
        """Warm up, then evaluate a tick every ``interval`` until ``stop`` is set; a tick that fails is logged and
        counted."""
        from gpuwarden.cluster.promapi import PrometheusError

        tick = self.policy.interval_seconds
        try:
            self.warm_up(time.time())
        except (PrometheusError, ValueError) as exc:
            log.warning("reclaim: cannot read the history to warm up: %s", exc)
        while not stop.is_set():
            began = time.time()
            try:
                self.evaluate(began)
            except (PrometheusError, ValueError) as exc:
                log.warning("reclaim: tick not evaluated: %s", exc)
                if self.metrics is not None:
                    self.metrics.failures.inc()
            stop.wait(max(0.0, tick - (time.time() - began)))
        self.runner.close(wait=True)

    def _outcome(self, decision: Decision, outcome: str, detail: str) -> None:
        """Log ``decision`` with its evidence and outcome, and count it."""
        from gpuwarden.terminal import SHOWN_CHARS, brief

        # a log line holds no value of kilobytes (a hostile job id): each cut to SHOWN_CHARS, the cut said
        fields = {
            k: brief(v, SHOWN_CHARS) if isinstance(v, str) else v for k, v in record(decision, outcome, detail).items()
        }
        log.info(
            "reclaim ladder: %s %s",
            "job worked again:" if decision.step == RESET else f"step {decision.step}:",
            brief(decision.key.label(), SHOWN_CHARS),
            extra=fields,
        )
        if self.metrics is not None:
            self.metrics.decisions.labels(decision.step, outcome).inc()


def record(decision: Decision, outcome: str, detail: str = "") -> dict[str, Any]:
    """A decision as structured fields (a log line's, a report's JSON row)."""
    f = decision.facts
    return {
        "time": round(decision.time, 3),
        "job_id": decision.key.job_id,
        "instance": decision.key.instance or "",
        "cluster": "/".join(decision.key.cluster),
        "job_kind": f.kind,
        "step": decision.step,
        "idle_minutes": round(decision.idle_seconds / 60, 1),
        "gpus": len(f.gpus),
        "nodes": ",".join(sorted({inst for inst, _ in f.gpus})),
        "reasons": ",".join(sorted(f.reasons)),
        "evidence": decision.evidence,
        "outcome": outcome,
        "detail": detail,
    }


def ticks(start: float, end: float, tick: float) -> list[float]:
    """The ends of the ticks after ``start`` up to ``end`` (inclusive), ``tick`` seconds apart, the last at ``end``:
    Unix seconds, each a whole number of milliseconds (so that each is the same time wherever it is rounded)."""
    end_ms, tick_ms = round(end * 1000), round(tick * 1000)
    n = int((end - start) // tick)
    return [(end_ms - i * tick_ms) / 1000 for i in range(n, -1, -1) if (end_ms - i * tick_ms) / 1000 > start]


def report(
    policy: Policy,
    connect: Callable[[], Prometheus],
    end: float,
    range_seconds: float,
    cluster_labels: tuple[str, ...] = ("cluster",),
    progress: Callable[[int, int], None] | None = None,
) -> list[Decision]:
    """What the ladder would have decided over the range of ``range_seconds`` ending at ``end``: a controller
    started at the range's start (warmed up on the history before it), in dry run, its ticks at the multiples of the
    interval (the last at or before ``end``). ``progress(done, total)`` after each tick. Raises PrometheusError."""
    controller = Controller(policy, connect, dry_run=True, cluster_labels=cluster_labels)
    start = end - range_seconds
    tick = policy.interval_seconds
    tick_ms = round(tick * 1000)
    aligned = round(end * 1000) // tick_ms * tick_ms / 1000
    times = ticks(start - policy.steps[-1].after_seconds - tick, aligned, tick)
    try:
        return controller.replay(times, climb_after=start, progress=progress)
    finally:
        controller.runner.close(wait=False)
