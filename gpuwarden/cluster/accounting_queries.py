"""The PromQL of the fleet accounting (gpuwarden.cluster.usage.Accounting assembles the answers): selectors with the
accounting's label matchers, a range's steps as subqueries whose steps end at the range's end, each job's share of a
GPU in a step, a counter's growth over a step, and what makes an answer's keys (clusters, GPUs).

Nothing here asks Prometheus: the same expressions for Prometheus, VictoriaMetrics, Thanos and Mimir.
"""

from __future__ import annotations

import json
import re
import time

from gpuwarden.cluster.durations import seconds
from gpuwarden.mixin import rules as _rules

#: SM activity at or above this is effective use (DCGM: below 0.5 likely ineffective).
EFFECTIVE_SM = 0.5
#: Labels of gpu_process_job_info that gpu_job_info lacks (a process's, not its job's).
PROCESS_LABELS = frozenset({"pid", "process_name", "container_id", "rank", "local_rank"})
#: A label name as a matcher of a list names it (``name=``, ``name!=``, ``name=~``, ``name!~``), at the list's start or
#: after a comma: tried only there, so a long quoted value costs one pass (a match anywhere would backtrack over every
#: run of word characters).
_LABEL_NAME = re.compile(r"(?:^|,)\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
#: A PromQL string ("...", '...' with backslash escapes, or `...`): taken out before the names are looked for.
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')


#: A cluster: the values of the accounting's cluster labels, in their order ("" where a series lacks one).
Cluster = tuple[str, ...]
#: A GPU: its cluster, instance and index.
GpuKey = tuple[Cluster, str, str]


class AccountingQueries:
    """The PromQL of an accounting over the range ``range_`` (a Prometheus duration) that ends at ``at`` (Unix
    seconds; None: now), in steps of ``step`` (the range a whole number of them); ``selector``: extra label matchers
    for every gpuwarden series; ``cluster_labels``: the labels that name a cluster. Raises ValueError for a bad
    range, step or label name."""

    def __init__(self, range_: str, step: str = "1m", selector: str = "", at: float | None = None,
                 cluster_labels: tuple[str, ...] = ("cluster",)) -> None:  # fmt: skip
        range_s, self.step_s = seconds(range_), seconds(step)
        if self.step_s > range_s:
            raise ValueError(f"--step {step} is longer than --range {range_}")
        self._range_ms, self._step_ms = round(range_s * 1000), round(self.step_s * 1000)
        if self._range_ms % self._step_ms:
            raise ValueError(f"--range {range_} is not a whole number of --step {step} steps")
        for label in cluster_labels:
            if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", label):
                raise ValueError(f"not a label name: {label!r}")
        self.range, self.step = range_, step
        self.at = time.time() if at is None else at
        self.sel = selector.strip().strip(",")
        self.cluster_labels = tuple(cluster_labels)
        self._c = self.cluster_by = "".join(f"{label}, " for label in self.cluster_labels)  # a by-clause's start
        # how far the range's end lies past a multiple of the step: PromQL's subquery steps fall on those multiples
        self._shift_ms = round(self.at * 1000) % self._step_ms

    def cluster_of(self, labels: dict[str, str]) -> Cluster:
        """The cluster of a result series: the values of the cluster labels ("" where missing)."""
        return tuple(labels.get(label, "") for label in self.cluster_labels)

    def gpu_key(self, labels: dict[str, str]) -> GpuKey:
        """The GPU of a result series carrying instance and gpu."""
        return self.cluster_of(labels), labels["instance"], labels["gpu"]

    def metric(self, metric: str, extra: str = "") -> str:
        """The selector of ``metric`` with the accounting's label matchers and ``extra`` ones."""
        inner = ", ".join(x for x in (self.sel, extra) if x)
        return f"{metric}{{{inner}}}"

    def job_series(self, extra: str = "") -> str:
        """The selector of the jobs' series with ``extra`` label matchers: ``gpu_job_info`` (a series a GPU and job,
        for the jobs its processes run and those a scheduler allocated it to), or ``gpu_process_job_info`` where
        ``extra`` names a label only processes carry (user, pid, process_name, container_id: a GPU allocated and
        never opened has no process, so such a selector never sees it)."""
        named = set(_LABEL_NAME.findall(_QUOTED.sub('""', extra)))
        return self.metric("gpu_process_job_info" if named & PROCESS_LABELS else "gpu_job_info", extra)

    def _at_step(self, metric: str, extra: str = "", before: float = 0.0, lookback: bool = False) -> str:
        """``metric``'s selector inside ``_steps``: read at the step's end (``before`` seconds earlier), not at the
        multiple of the step PromQL evaluates it at. ``lookback``: its newest sample within LOOKBACK, written out
        (``last_over_time``), for counters: an instant selector looks back as far as the engine's setting (5 minutes
        in Prometheus, about a scrape interval in VictoriaMetrics) and nowhere past a staleness marker (a failed
        scrape writes them), so a missed scrape would hide a counter's earlier value. Without it, a reading present
        at the step (a gauge or a flag, which ends where its series ends)."""
        ms = self._shift_ms - round(before * 1000)
        offset = "" if ms == 0 else f" offset {-ms}ms"
        if lookback:
            return f"last_over_time({self.metric(metric, extra)}[{_rules.LOOKBACK}]{offset})"
        return f"{self.metric(metric, extra)}{offset}"

    def _steps(self, expr: str) -> str:
        """``expr`` at the end of each step of the range, as a range vector: from the step that ends at the range's
        end back to the one that starts at its start (``expr`` selects with ``_at_step``)."""
        shift = f" offset {self._shift_ms}ms" if self._shift_ms else ""
        return f"({expr})[{self._range_ms - 1}ms:{self._step_ms}ms]{shift}"

    def _window(self) -> str:
        """A step's range selector, ending at the step's end (inside ``_steps``): ``[STEP] offset -SHIFT``."""
        return f"[{self._step_ms}ms]" + (f" offset {-self._shift_ms}ms" if self._shift_ms else "")

    def _share(self, job_filter: str = "") -> str:
        """Per (GPU, job) and step: the share of the step's scrapes in which the job held the GPU, over the sum of
        those shares of every job that held it in the step (N jobs at once: 1/N each; one after the other: each its
        part; one alone for part of the step: all the step's held time, which is its)."""
        c = self._c

        def presence(extra: str) -> str:
            info = self.job_series(extra)
            return (f"max by ({c}instance, gpu, uuid, job_id, job_scope, job_kind) (count_over_time({info}"
                    f"{self._window()}))")  # fmt: skip

        return (
            f"({presence(job_filter)} / on ({c}instance, gpu, uuid) group_left () sum by ({c}instance, gpu, uuid)"
            f" ({presence('')}))"
        )

    def _per_job(self, value: str, job_filter: str = "", by: str = "instance, job_id, job_scope, job_kind") -> str:
        """Sum over the range's steps of ``value`` (a per-GPU expression for one step, selecting with ``_at_step``)
        times each job's share of the GPU in that step."""
        c = self._c
        shared = f"{self._share(job_filter)} * on ({c}instance, gpu, uuid) group_left () ({value})"
        return f"sum by ({c}{by}) (sum_over_time({self._steps(shared)}))"

    def _one(self) -> str:
        """1 for every GPU (gpu_up is there for a lost GPU too), at a step's end."""
        return f"(0 * {self._at_step('gpu_up')} + 1)"

    def _increase(self, metric: str, extra: str = "") -> str:
        """The counter's growth over the step that ends at each step's end: its value then minus its value one
        step earlier (each the newest sample at or before that time). Summed over the steps of the range these
        telescope to the counter's growth over the range exactly, whatever the step: a step shorter than the scrape
        interval sees no growth in most steps and all of it in the one after a scrape; nothing is extrapolated
        (``rate`` and ``increase`` over a window are, and read nothing in a window with fewer than two scrapes). A
        counter that restarted (a daemon restart: below its earlier value) or appeared within the step counts its
        value since it started, up to what it can have grown (``gpuwarden.mixin.rules.counter_growth``); each value
        is the newest within LOOKBACK, so a missed or failed scrape loses nothing."""
        now = self._at_step(metric, extra, lookback=True)
        before = self._at_step(metric, extra, before=self.step_s, lookback=True)
        return _rules.counter_growth(now, before, _rules.appeared_bound(metric, self.step_s))

    def _gpu_increase(self, metric: str, extra: str = "") -> str:
        """``_increase`` summed over the series of each GPU (e.g. every state but one): one series per GPU."""
        return f"sum by ({self._c}instance, gpu, uuid) ({self._increase(metric, extra)})"

    def _effective(self) -> str:
        """Per GPU and step: 1 where SM activity (util.gpu without GPM) is at least EFFECTIVE_SM at the step's end,
        else 0 (jobs are accounted at steps of the scrape interval or shorter: each scrape's reading)."""
        activity = f"({self._at_step('gpu_sm_activity_ratio')} or {self._at_step('gpu_utilization_ratio')})"
        return f"{activity} >= bool {EFFECTIVE_SM}"


def promql_string(value: str) -> str:
    """``value`` as a PromQL double-quoted string literal, whatever it holds: JSON's string syntax is a subset of the
    Go escapes PromQL unquotes (``\\n``, ``\\"``, ``\\\\``, ``\\u00XX`` for every control character), non-ASCII
    text kept as it is. A newline written raw would end the query's string (Prometheus: "unterminated quoted
    string") and fail every query that names the value."""
    return json.dumps(value, ensure_ascii=False)
