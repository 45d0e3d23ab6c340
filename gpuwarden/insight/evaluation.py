"""Evaluation of the diagnosis on recordings: the verdict per GPU against the one expected in the trace's header.

The expected verdict of each GPU is in the trace's header (``metadata.expected_verdicts``: GPU index -> verdict;
``expected_findings``: findings that must come with it). ``evaluate(path)`` replays a trace through the insight
analyzer and returns, per GPU, the verdict at the end of the trace (over the diagnosis window), and the share of
polls whose verdict was right since the GPU's current processes appeared (a verdict describes the job holding the GPU
now; where jobs hold a GPU in turn, the expected verdict is the last one's). Polls before the analyzer has enough
history give none, and those of a job's start-up (``starting``: gpuwarden.insight.startup) describe no steady
state: neither is counted.
``bench/insight_eval.py`` prints it for every recording; the tests assert it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpuwarden.insight.analyzer import InsightAnalyzer, insight_result
from gpuwarden.trace import read_trace


@dataclass
class Row:
    """One GPU of one trace: expected and final verdict, share of polls right, findings missing, and whether the final
    verdict is near the line (its diagnosis names alternatives: a threshold within its margin, insight.margins)."""

    trace: str
    gpu: int
    expected: str | None
    given: str | None
    polls_right: float | None
    missing: list[str]
    near_line: bool = False

    @property
    def ok(self) -> bool:
        """True when the final verdict is the expected one and no expected finding is missing."""
        return self.expected is not None and self.given == self.expected and not self.missing


def evaluate(path: Path) -> list[Row]:
    """Return one Row per GPU of the trace at ``path``. Raises TraceError for an unreadable trace."""
    header, polls = read_trace(path)
    expected: dict[str, str] = header.metadata.get("expected_verdicts", {})
    findings_wanted: list[str] = header.metadata.get("expected_findings", [])
    analyzer = InsightAnalyzer()
    right: dict[int, int] = {}
    counted: dict[int, int] = {}
    final: dict[int, tuple[str | None, list[str], bool]] = {}
    holders: dict[int, frozenset[int]] = {}
    for poll in polls:
        for r in poll.gpus:  # another job on the GPU: the verdict now describes it, count from here
            pids = frozenset(p.pid for p in r.processes or ())
            if r.index in holders and pids != holders[r.index] and not pids & holders[r.index]:
                right[r.index] = counted[r.index] = 0
            holders[r.index] = pids
        res = insight_result(analyzer(poll, header.node))
        if res is None:
            continue
        for g in res.gpus:
            if g.diagnosis is None or g.diagnosis.verdict == "starting":
                continue  # no steady-state verdict yet
            counted[g.gpu] = counted.get(g.gpu, 0) + 1
            right[g.gpu] = right.get(g.gpu, 0) + (g.diagnosis.verdict == expected.get(str(g.gpu)))
            final[g.gpu] = (g.diagnosis.verdict, list(g.diagnosis.findings), bool(g.diagnosis.alternatives))
    rows = []
    name = path.name.removesuffix(".jsonl.gz")
    for s in header.node.gpus:
        verdict, findings, near = final.get(s.index, (None, [], False))
        n = counted.get(s.index, 0)
        rows.append(
            Row(
                trace=name,
                gpu=s.index,
                expected=expected.get(str(s.index)),
                given=verdict,
                polls_right=right.get(s.index, 0) / n if n else None,
                missing=[f for f in findings_wanted if f not in findings],
                near_line=near,
            )
        )
    return rows
