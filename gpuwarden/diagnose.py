"""``gpuwarden diagnose``: a one-shot report of why each GPU of this node is (not) working.

Live (NVML, sampling for ``--seconds``) or over a recorded trace (``--replay FILE``), every poll goes
through ``InsightAnalyzer``; the report shows, per GPU, the verdict, the numbers behind it and remedies,
then the jobs and the node's imbalance, and for a replay the verdicts over time. ``--json`` prints the
same as JSON.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from gpuwarden.insight.analyzer import InsightAnalyzer, InsightResult
from gpuwarden.insight.document import DiagnosisDocument, diagnosis_document
from gpuwarden.model import NodeStatic, PollResult
from gpuwarden.snapshot import NodeSnapshot
from gpuwarden.source import SourceError


class VerdictSpan(BaseModel):
    """A stretch of consecutive polls with the same verdict on one GPU (offsets in seconds from the start)."""

    gpu: int
    verdict: str | None = Field(description="None: not enough history yet")
    start_seconds: float
    end_seconds: float
    polls: int


class DiagnoseReport(BaseModel):
    """What ``gpuwarden diagnose`` reports: the source, the final diagnosis and the verdicts over time."""

    source: str
    scenario: str | None = None
    polls: int
    seconds: float
    diagnosis: DiagnosisDocument
    timeline: list[VerdictSpan]


def analyze(
    polls: list[PollResult], static: NodeStatic, source: str, analyzer: InsightAnalyzer | None = None
) -> tuple[DiagnosisDocument, list[VerdictSpan]]:
    """Run ``polls`` through an InsightAnalyzer; return the final document and each GPU's verdict spans.

    Raises ValueError when ``polls`` is empty.
    """
    if not polls:
        raise ValueError("no poll to analyze")
    analyzer = analyzer or InsightAnalyzer()
    t0 = polls[0].timestamp
    spans: dict[int, list[VerdictSpan]] = {}
    res: InsightResult | None = None
    for p in polls:
        res = analyzer(p, static)
        at = p.timestamp - t0
        for g in res.gpus:
            verdict = g.diagnosis.verdict if g.diagnosis else None
            lst = spans.setdefault(g.gpu, [])
            if lst and lst[-1].verdict == verdict:
                last = lst[-1]
                lst[-1] = last.model_copy(update={"end_seconds": round(at, 3), "polls": last.polls + 1})
            else:
                lst.append(
                    VerdictSpan(
                        gpu=g.gpu, verdict=verdict, start_seconds=round(at, 3), end_seconds=round(at, 3), polls=1
                    )
                )
    snap = NodeSnapshot(
        seq=len(polls),
        source=source,
        static=static,
        poll=polls[-1],
        interval_seconds=0.0,
        analyses={"insight": res},
    )
    return diagnosis_document(snap), [s for gpu in sorted(spans) for s in spans[gpu]]


def replay_report(path: Path) -> DiagnoseReport:
    """Diagnose a recorded trace. Raises SourceError (one line) when it cannot be read."""
    from gpuwarden.trace import TraceError, read_trace

    try:
        header, polls = read_trace(path)
    except TraceError as exc:
        raise SourceError(str(exc)) from exc
    doc, timeline = analyze(polls, header.node, "replay")
    scenario = header.metadata.get("scenario")
    return DiagnoseReport(
        source=f"replay of {path}",
        scenario=str(scenario) if scenario is not None else None,
        polls=len(polls),
        seconds=round(polls[-1].timestamp - polls[0].timestamp, 3),
        diagnosis=doc,
        timeline=timeline,
    )


def live_report(seconds: float, interval: float, status: Any = None) -> DiagnoseReport:
    """Sample this node's GPUs through NVML for ``seconds`` every ``interval`` s and diagnose them.

    Raises SourceError (one line) when NVML cannot start. ``status``, if given, is called with a short
    progress message before each poll.
    """
    from gpuwarden.nvml import NvmlSource

    source = NvmlSource(slow_interval=max(seconds, 10.0), xid_events=False)
    static = source.open()
    polls: list[PollResult] = []
    try:
        n = max(2, int(round(seconds / interval)) + 1)
        next_at = time.monotonic()
        for i in range(n):
            if status is not None:
                status(f"sampling the GPUs: poll {i + 1} of {n}")
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            polls.append(source.poll())
            next_at += interval
        static = getattr(source, "static", static)
    finally:
        source.close()
    doc, timeline = analyze(polls, static, "nvml")
    return DiagnoseReport(
        source="live NVML",
        polls=len(polls),
        seconds=round(polls[-1].timestamp - polls[0].timestamp, 3),
        diagnosis=doc,
        timeline=timeline,
    )


# -- rendering -------------------------------------------------------------------------------------------

_STYLE = {"ok": "green", "info": "cyan", "warning": "yellow"}


def _fmt(value: float, unit: str) -> str:
    if unit == "ratio":
        return f"{value:.1%}" if value < 0.1 else f"{value:.0%}"
    if unit == "bytes_per_second":
        return f"{value / 1e9:.2f} GB/s" if value >= 1e8 else f"{value / 1e6:.1f} MB/s"
    if unit == "bytes":
        return f"{value / 1e9:.1f} GB"
    if unit == "cores":
        return f"{value:.2f} cores"
    if unit == "watts":
        return f"{value:.0f} W"
    if unit == "seconds":
        return f"{value:.0f} s"
    return f"{value:g}"


def render(report: DiagnoseReport, console: Any) -> None:
    """Print ``report`` on a rich ``console``: one panel per GPU, then jobs, imbalance and the timeline."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    doc = report.diagnosis
    head = f"[bold]gpuwarden diagnose[/] · {doc.hostname} · {report.source}"
    if report.scenario:
        head += f" (scenario [bold]{report.scenario}[/])"
    console.print(head)
    console.print(
        f"{report.polls} polls over {report.seconds:.0f} s; verdicts over the last "
        f"{doc.diagnosis_window_seconds or 0:.0f} s of each GPU's current processes.\n"
    )
    if not doc.available:
        console.print(f"[red]no diagnosis:[/] {doc.reason}")
        return
    for g in doc.gpus:
        d = g.diagnosis
        title = f"GPU {g.gpu} · {g.name or ''} · {g.uuid}"
        if d is None:
            console.print(Panel("not enough history for a verdict yet", title=title, border_style="dim"))
            continue
        style = _STYLE.get(d.severity, "white")
        parts: list[Any] = []
        verdict = Text(d.verdict.upper().replace("_", " "), style=f"bold {style}")
        also = [f for f in d.findings if f != d.verdict]
        if also:
            verdict.append("  + " + ", ".join(also), style=style)
        parts.append(verdict)
        parts.append(Text(d.summary))
        states = g.window_state_seconds
        total = sum(states.values())
        if total > 0:
            split = "  ".join(f"{k} {v / total:.0%}" for k, v in states.items() if v > 0)
            sr = "n/a" if g.starved_ratio is None else f"{g.starved_ratio:.0%}"
            parts.append(
                Text(
                    f"score window (last {total:.0f} s, at most {doc.window_seconds or 0:.0f}): {split}; "
                    f"starved ratio {sr}",
                    style="dim",
                )
            )
        if d.job:
            parts.append(Text(f"job: {d.job} ({d.job_kind})", style="dim"))
        ev = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
        ev.add_column("evidence")
        ev.add_column("value", justify="right")
        ev.add_column("rule", style="dim")
        for e in d.evidence:
            ev.add_row(e.name, _fmt(e.value, e.unit), e.rule or "")
        parts.append(ev)
        parts.append(Text("what to do:", style="bold"))
        for r in d.remedies:
            parts.append(Text(f"  • {r}"))
        console.print(Panel(Group(*parts), title=title, title_align="left", border_style=style))
    if doc.jobs:
        jt = Table(title="jobs", title_justify="left", header_style="bold")
        for col in ("job", "kind", "GPUs", "PIDs", "imbalance"):
            jt.add_column(col)
        for j in doc.jobs:
            imb = "n/a (1 GPU)" if j.imbalance_ratio is None else f"{j.imbalance_ratio:.2f} ({j.activity_source})"
            jt.add_row(j.job, j.job_kind, ",".join(map(str, j.gpus)) or "-", ",".join(map(str, j.pids)), imb)
        console.print(jt)
    if doc.node_imbalance_ratio is not None:
        console.print(
            f"node imbalance: [bold]{doc.node_imbalance_ratio:.2f}[/] on {doc.node_activity_source} "
            "(0 balanced, 1 one GPU does all the work)"
        )
    if len({(s.gpu, s.verdict) for s in report.timeline if s.verdict is not None}) > len(doc.gpus):
        tt = Table(title="verdicts over time", title_justify="left", header_style="bold")
        for col in ("GPU", "from s", "to s", "polls", "verdict"):
            tt.add_column(col, justify="right" if col != "verdict" else "left")
        for s in report.timeline:
            if s.verdict is None:
                continue  # polls before a verdict was possible (kept in --json)
            tt.add_row(str(s.gpu), f"{s.start_seconds:.0f}", f"{s.end_seconds:.0f}", str(s.polls), s.verdict or "-")
        console.print(tt)


def cmd_diagnose(args: argparse.Namespace) -> int:
    """Run ``gpuwarden diagnose``; returns the exit status (1 with one line on stderr when the source fails)."""
    from rich.console import Console

    err = Console(stderr=True)
    try:
        if args.replay:
            report = replay_report(Path(args.replay))
        else:
            if args.seconds <= 0 or args.interval <= 0:
                print("gpuwarden: --seconds and --interval must be positive", file=sys.stderr)
                return 2
            with err.status("sampling the GPUs") as st:
                report = live_report(args.seconds, args.interval, status=st.update if not args.json else None)
    except SourceError as exc:
        print(f"gpuwarden: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        render(report, Console())
    return 0


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``diagnose`` subcommand on ``subparsers`` (from ``ArgumentParser.add_subparsers``)."""
    p = subparsers.add_parser(
        "diagnose",
        help="one-shot report: why each GPU is (not) working, with evidence and remedies",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--replay", metavar="FILE", help="diagnose a recorded trace instead of live NVML")
    p.add_argument("--seconds", type=float, default=10.0, help="live: seconds to sample (default 10)")
    p.add_argument("--interval", type=float, default=1.0, help="live: seconds between polls (default 1)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.set_defaults(func=cmd_diagnose)
    return p
