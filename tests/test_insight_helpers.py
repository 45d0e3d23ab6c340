"""Shared by the insight tests (no tests here): run real traces through InsightAnalyzer at their recorded times."""

from __future__ import annotations

from pathlib import Path

from gpuwarden.insight.analyzer import InsightAnalyzer, InsightResult
from gpuwarden.model import NodeStatic, PollResult
from gpuwarden.snapshot import NodeSnapshot
from gpuwarden.trace import read_trace

TRACES = Path(__file__).parent / "data" / "traces"
DDP = TRACES / "h200x2-ddp_straggler.jsonl.gz"


def h100(scenario: str) -> Path:
    return TRACES / f"h100-{scenario}.jsonl.gz"


def run(polls: list[PollResult], static: NodeStatic, **kw: float) -> list[InsightResult]:
    a = InsightAnalyzer(**kw)
    return [a(p, static) for p in polls]


def run_trace(path: Path, **kw: float) -> tuple[NodeStatic, list[PollResult], list[InsightResult]]:
    header, polls = read_trace(path)
    return header.node, polls, run(polls, header.node, **kw)


def snap_of(static: NodeStatic, poll: PollResult, res: InsightResult) -> NodeSnapshot:
    return NodeSnapshot(
        seq=1, source="replay", static=static, poll=poll, interval_seconds=1.0, analyses={"insight": res}
    )
