"""``gpuwarden diagnose``: why each GPU of this node is (not) working, its reports built and rendered.

Live (NVML, sampling for ``--seconds``), over a recorded trace (``--replay FILE``), or as a running daemon sees it
(``--url``: its /api/v1/diagnosis, over the daemon's own window). Every poll goes through ``InsightAnalyzer``; the
report shows one line per GPU (verdict, starved share, first remedy), then per GPU the numbers behind the verdict and
every remedy, the jobs and the node's imbalance, and for a replay the verdicts over time. ``--brief`` stops after
the first table, ``--watch`` redraws it live, ``--json`` prints the report as JSON.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, Field

from gpuwarden.commands import COMMANDS, Subparsers
from gpuwarden.insight.analyzer import InsightAnalyzer, InsightResult
from gpuwarden.model import NodeStatic, PollResult
from gpuwarden.snapshot import NodeSnapshot
from gpuwarden.source import SourceError
from gpuwarden.terminal import plain, visible, why
from gpuwarden.web.diagnosis import DiagnosisDocument, GpuDiagnosisDocument, diagnosis_document


class VerdictSpan(BaseModel):
    """A stretch of consecutive polls with the same verdict on one GPU (offsets in seconds from the start)."""

    gpu: int
    verdict: str | None = Field(description="None: not enough history yet")
    start_seconds: float
    end_seconds: float
    polls: int


class DiagnoseReport(BaseModel):
    """What ``gpuwarden diagnose`` reports: the source, the final diagnosis and the verdicts over time.

    ``polls`` and ``seconds`` are None for a daemon's diagnosis (``--url``): its window is the document's.
    """

    source: str
    scenario: str | None = None
    polls: int | None
    seconds: float | None
    diagnosis: DiagnosisDocument
    timeline: list[VerdictSpan]


class Analysis(NamedTuple):
    """What ``analyze`` gives: the final document, each GPU's verdict spans, how many polls it read and the seconds
    from the first to the last."""

    document: DiagnosisDocument
    timeline: list[VerdictSpan]
    polls: int
    seconds: float


def analyze(
    polls: Iterable[PollResult], static: NodeStatic, source: str, analyzer: InsightAnalyzer | None = None
) -> Analysis:
    """Run ``polls`` through an InsightAnalyzer, one at a time (a trace read as it goes is never held whole); return
    the final document, each GPU's verdict spans, the count of polls and the seconds they cover.

    Raises ValueError when ``polls`` is empty; what iterating ``polls`` raises (a TraceError) passes through.
    """
    analyzer = analyzer or InsightAnalyzer()
    first: PollResult | None = None
    last: PollResult | None = None
    count = 0
    spans: dict[int, list[VerdictSpan]] = {}
    res: InsightResult | None = None
    for p in polls:
        first = p if first is None else first
        last = p
        count += 1
        res = analyzer(p, static)
        at = p.timestamp - first.timestamp
        for g in res.gpus:
            verdict = g.diagnosis.verdict if g.diagnosis else None
            lst = spans.setdefault(g.gpu, [])
            if lst and lst[-1].verdict == verdict:
                previous = lst[-1]
                lst[-1] = previous.model_copy(update={"end_seconds": round(at, 3), "polls": previous.polls + 1})
            else:
                lst.append(
                    VerdictSpan(
                        gpu=g.gpu, verdict=verdict, start_seconds=round(at, 3), end_seconds=round(at, 3), polls=1
                    )
                )
    if first is None or last is None or res is None:
        raise ValueError("no poll to analyze")
    return Analysis(
        _document(last, static, res, source, count),
        [s for gpu in sorted(spans) for s in spans[gpu]],
        count,
        round(last.timestamp - first.timestamp, 3),
    )


def replay_report(path: Path) -> DiagnoseReport:
    """Diagnose a recorded trace, read a poll at a time (gpuwarden.trace.TracePass: an hour-long recording is never
    held whole). Raises SourceError (one line) when it cannot be read; a cut-off end is logged, as ``read_trace``
    logs it."""
    import itertools

    from gpuwarden.trace import TraceError, TracePass

    reader = TracePass(path)
    try:
        polls = iter(reader)
        first = next(polls)  # the header is read with it
        assert reader.header is not None
        done = analyze(itertools.chain([first], polls), reader.header.node, "replay")
    except TraceError as exc:
        raise SourceError(str(exc)) from exc
    reader.warn_dropped()
    scenario = reader.header.metadata.get("scenario")
    return DiagnoseReport(
        source=f"replay of {path}",
        scenario=str(scenario) if scenario is not None else None,
        polls=done.polls,
        seconds=done.seconds,
        diagnosis=done.document,
        timeline=done.timeline,
    )


class LiveSampler:
    """Live NVML polls through one InsightAnalyzer: ``step()`` polls once and returns the report so far (what
    ``--watch`` redraws). Opening raises SourceError (one line) when NVML cannot start; ``close()`` ends it."""

    def __init__(self, window_seconds: float = 300.0) -> None:
        from gpuwarden.nvml import NvmlSource

        self.source = NvmlSource(slow_interval=10.0, gpm_interval=1.0, xid_events=False)
        self.static = self.source.open()
        self.analyzer = InsightAnalyzer(window_seconds=window_seconds)
        self.polls = 0
        self.t0: float | None = None

    def step(self) -> DiagnoseReport:
        """Poll once and return the report of every poll so far (no timeline). Raises SourceError."""
        poll = self.source.poll()
        self.static = getattr(self.source, "static", self.static)
        self.polls += 1
        self.t0 = poll.timestamp if self.t0 is None else self.t0
        res = self.analyzer(poll, self.static)
        return DiagnoseReport(
            source="live NVML",
            polls=self.polls,
            seconds=round(poll.timestamp - self.t0, 3),
            diagnosis=_document(poll, self.static, res, "nvml", self.polls),
            timeline=[],
        )

    def close(self) -> None:
        """Shut NVML down."""
        self.source.close()


def _document(poll: PollResult, static: NodeStatic, res: InsightResult, source: str, seq: int) -> DiagnosisDocument:
    snap = NodeSnapshot(
        seq=seq, source=source, static=static, poll=poll, interval_seconds=0.0, analyses={"insight": res}
    )
    return diagnosis_document(snap)


def live_report(seconds: float, interval: float, status: Any = None) -> DiagnoseReport:
    """Sample this node's GPUs through NVML for ``seconds`` every ``interval`` s and diagnose them.

    Raises SourceError (one line) when NVML cannot start. ``status``, if given, is called with a short
    progress message before each poll.
    """
    from gpuwarden.nvml import NvmlSource

    # GPM at every poll (at most 1 s): a few seconds' sample needs several GPM computations, as a trace has
    source = NvmlSource(slow_interval=max(seconds, 10.0), gpm_interval=min(interval, 1.0), xid_events=False)
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
    done = analyze(polls, static, "nvml")
    return DiagnoseReport(
        source="live NVML", polls=done.polls, seconds=done.seconds, diagnosis=done.document, timeline=done.timeline
    )


def url_report(url: str, timeout: float = 10.0, auth: tuple[str, str] | None = None) -> DiagnoseReport:
    """The diagnosis of a running daemon: ``GET URL/api/v1/diagnosis`` (basic auth: ``auth`` (user, password), or
    ``http://user:pass@host``; https verifies against the system's CAs, or SSL_CERT_FILE). Raises SourceError (one
    line) when the daemon cannot be reached, refuses, has no diagnosis endpoint, or answers something that is not
    its document; a refusal says whether credentials were sent."""
    import httpx
    from pydantic import ValidationError

    from gpuwarden.terminal import redacted

    base = url if "://" in url else f"http://{url}"
    real = base.rstrip("/") + "/api/v1/diagnosis"
    target = redacted(real)  # what is printed: the password never is
    try:
        resp = httpx.get(real, timeout=timeout, headers={"accept": "application/json"}, auth=auth)
    except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:  # a URL httpx cannot use
        raise SourceError(f"cannot reach {target}: {exc or type(exc).__name__}") from None
    if resp.status_code == 401:
        if auth is not None or "@" in base.split("://", 1)[1].split("/", 1)[0]:
            raise SourceError(f"{target} refused the credentials given (401): wrong user or password")
        raise SourceError(f"{target} wants credentials (401): --url.username USER --url.password-file FILE")
    if resp.status_code == 404:
        raise SourceError(f"{target}: not found (404): not a gpuwarden, or its insight collector is off")
    if resp.status_code != 200:
        raise SourceError(f"{target} answered HTTP {resp.status_code}")
    try:
        doc = DiagnosisDocument.model_validate_json(resp.content)
    except ValidationError as exc:
        raise SourceError(f"{target} did not answer a diagnosis document ({exc.error_count()} errors)") from None
    return DiagnoseReport(source=f"daemon at {redacted(base)}", polls=None, seconds=None, diagnosis=doc, timeline=[])


# -- rendering -------------------------------------------------------------------------------------------

_STYLE = {"ok": "green", "info": "cyan", "warning": "yellow", "critical": "red"}


def _fmt(value: float, unit: str) -> str:
    """A value for people: ratios as percent, bytes in GB (10**9), rates in GB/s or MB/s."""
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
    if unit == "celsius":
        return f"{value:.0f} °C"
    return f"{value:g}"


def _verdict_text(g: GpuDiagnosisDocument) -> Any:
    from rich.text import Text

    d = g.diagnosis
    if d is None:
        return Text("no verdict yet", style="dim")
    style = _STYLE.get(d.severity, "white")
    t = Text(visible(d.verdict.replace("_", " ")), style=f"bold {style}")
    also = [f for f in d.findings if f != d.verdict]
    if also:
        t.append(visible(" + " + ", ".join(f.replace("_", " ") for f in also)), style=style)
    return t


def _head(report: DiagnoseReport) -> Any:
    from rich.text import Text

    doc = report.diagnosis
    head = Text.assemble(("gpuwarden diagnose", "bold"), f" · {visible(doc.hostname)} · {visible(report.source)}")
    if report.scenario:
        head.append_text(Text.assemble(" (scenario ", (visible(report.scenario), "bold"), ")"))
    if report.polls is not None and report.seconds is not None:
        head.append(f" · {report.polls} polls over {report.seconds:.0f} s")
    if window := window_words(doc):
        head.append(f" · verdicts, starved and active shares on {window}")
    return head


def window_words(doc: DiagnosisDocument) -> str | None:
    """Return the diagnosis window in words (``the last 60 s of each GPU's current job``; ``up to the last ...``
    where GPUs' windows differ, a job having started later), from the verdicts' own ``window_seconds``; None before
    any verdict."""
    windows = {round(g.diagnosis.window_seconds) for g in doc.gpus if g.diagnosis and g.diagnosis.window_seconds}
    if not windows:
        return None
    return f"{'' if len(windows) == 1 else 'up to '}the last {max(windows)} s of each GPU's current job"


def summary_table(doc: DiagnosisDocument, one_line: bool = False) -> Any:
    """A rich Table with one row per GPU: verdict (and other findings), starved share and activity over the
    diagnosis window (the same figures as the evidence below it), first remedy. ``one_line``: each row on one line,
    the verdict and the remedy cut with an ellipsis where the width ends (``--brief``: the whole remedy is in the
    full report)."""
    from rich.table import Table

    cut: dict[str, Any] = {"no_wrap": True, "overflow": "ellipsis"} if one_line else {}
    t = Table(header_style="bold", expand=True, show_lines=False, pad_edge=False)
    t.add_column("GPU", justify="right", no_wrap=True)
    t.add_column("verdict", ratio=2, **cut)
    t.add_column("starved", justify="right", no_wrap=True)
    t.add_column("active", justify="right", no_wrap=True)
    t.add_column("what to do first", ratio=5, **cut)
    for g in doc.gpus:
        d = g.diagnosis
        shares = (d.value("starved_share"), d.activity()) if d is not None else (None, None)
        starved, active = ("-" if v is None else f"{v:.0%}" for v in shares)
        remedy = g.diagnosis.remedies[0] if g.diagnosis and g.diagnosis.remedies else ""
        t.add_row(str(g.gpu), _verdict_text(g), starved, active, plain(remedy))
    return t


def renderables(report: DiagnoseReport, brief: bool = False) -> list[Any]:
    """What ``render`` prints, as rich renderables: the header, the one-line-per-GPU table, and unless ``brief``
    each GPU's evidence and remedies, the jobs, the node's imbalance and (replays) the verdicts over time."""
    from rich.text import Text

    doc = report.diagnosis
    out: list[Any] = [_head(report)]
    if not doc.available:
        out.append(Text.assemble(("no diagnosis:", "red"), " ", visible(doc.reason)))
        return out
    out.append(summary_table(doc, one_line=brief))
    if doc.node_imbalance_ratio is not None:
        out.append(
            Text.assemble(
                "node imbalance ",
                (f"{doc.node_imbalance_ratio:.0%}", "bold"),
                f" on {visible(doc.node_activity_source)} (0% balanced, 100% one GPU does all the work)",
            )
        )
    if brief:
        return out
    out.extend(_gpu_panel(g) for g in doc.gpus)
    if doc.jobs:
        out.append(_jobs_table(doc))
    if len({(s.gpu, s.verdict) for s in report.timeline if s.verdict is not None}) > len(doc.gpus):
        out.append(_timeline_table(report))
    return out


def _gpu_panel(g: GpuDiagnosisDocument) -> Any:
    """One GPU's panel: its verdict and summary, code evidence, states over the window, job, evidence table and
    remedies (a rich Panel)."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    d = g.diagnosis
    title = plain(f"GPU {g.gpu} · {g.name or ''} · {g.uuid}")
    if d is None:
        return Panel("not enough history for a verdict yet", title=title, border_style="dim")
    parts: list[Any] = [_verdict_text(g), plain(d.summary)]
    if g.code_evidence is not None:
        parts.append(plain(f"code: {g.code_evidence.summary}", style="bold"))
    states = g.window_state_seconds
    total = sum(states.values())
    if total > 0:
        split = ", ".join(f"{k} {v / total:.0%}" for k, v in states.items() if v > 0)
        parts.append(Text(f"states over the last {total:.0f} s: {split}", style="dim"))
    if d.job:
        parts.append(plain(f"job: {d.job} ({d.job_kind})", style="dim"))
    ev = Table(box=None, show_header=True, header_style="bold", pad_edge=False)
    ev.add_column("evidence")
    ev.add_column("value", justify="right")
    ev.add_column("rule", style="dim")
    for e in d.evidence:
        ev.add_row(plain(e.name), _fmt(e.value, e.unit), plain(e.rule or ""))
    parts.append(ev)
    parts.append(Text("what to do:", style="bold"))
    parts.extend(plain(f"  • {r}") for r in d.remedies)
    return Panel(Group(*parts), title=title, title_align="left", border_style=_STYLE.get(d.severity, "white"))


def _jobs_table(doc: DiagnosisDocument) -> Any:
    """The node's jobs: id, kind, GPUs, PIDs and imbalance (a rich Table)."""
    from rich.table import Table

    jt = Table(title="jobs", title_justify="left", header_style="bold")
    for col in ("job", "kind", "GPUs", "PIDs", "imbalance"):
        jt.add_column(col, overflow="fold")
    for j in doc.jobs:
        imb = "- (1 GPU)" if j.imbalance_ratio is None else f"{j.imbalance_ratio:.0%} ({j.activity_source})"
        jt.add_row(plain(j.job), plain(j.job_kind), ",".join(map(str, j.gpus)) or "-", ",".join(map(str, j.pids)),
                   plain(imb))  # fmt: skip
    return jt


def _timeline_table(report: DiagnoseReport) -> Any:
    """A replay's verdicts over time, one row a stretch of one verdict on one GPU (a rich Table)."""
    from rich.table import Table

    tt = Table(title="verdicts over time", title_justify="left", header_style="bold")
    for col in ("GPU", "from s", "to s", "polls", "verdict"):
        tt.add_column(col, justify="right" if col != "verdict" else "left")
    for s in report.timeline:
        if s.verdict is None:
            continue  # polls before a verdict was possible (kept in --json)
        tt.add_row(str(s.gpu), f"{s.start_seconds:.0f}", f"{s.end_seconds:.0f}", str(s.polls), plain(s.verdict or "-"))
    return tt


def first_remedies(report: DiagnoseReport) -> list[Any]:
    """One rich Text line per GPU with a verdict: ``GPU n  verdict: its first remedy`` (what ``--watch`` shows when
    the whole report does not fit the terminal)."""
    from rich.text import Text

    out: list[Any] = [Text("what to do first:", style="bold")]
    for g in report.diagnosis.gpus:
        d = g.diagnosis
        if d is None or not d.remedies:
            continue
        out.append(Text.assemble(f"  GPU {g.gpu}  ", (visible(d.verdict), _STYLE.get(d.severity, "white")), ": ",
                                 visible(d.remedies[0])))  # fmt: skip
    return out if len(out) > 1 else []


def render(report: DiagnoseReport, console: Any, brief: bool = False) -> None:
    """Print ``report`` on a rich ``console`` (``renderables``)."""
    for r in renderables(report, brief):
        console.print(r)


def _watch(args: argparse.Namespace, console: Any) -> int:
    """``--watch``: redraw the report every ``--interval`` s until interrupted (exit 0). What is drawn fits the
    terminal: the whole report, or the summary with each GPU's first remedy, or the summary alone. A daemon that does
    not answer (``--url``: restarting, unreachable) is said on the first line and asked again at the next redraw;
    one line and 1 only when live NVML cannot start."""
    from rich.live import Live
    from rich.text import Text

    sampler: LiveSampler | None = None
    if args.url:

        def step() -> DiagnoseReport:
            return url_report(args.url, auth=args.auth)

    else:
        sampler = LiveSampler()
        step = sampler.step
    if not console.is_terminal:
        return _each_redraw(args, step, sampler, _plain_drawer(args, console))
    with Live(console=console, auto_refresh=False, transient=False, vertical_overflow="crop") as live:
        last: list[DiagnoseReport] = []

        def draw(report: DiagnoseReport | None, problem: str | None) -> None:
            if report is not None:
                last[:] = [report]
            line = Text(problem, style="red") if problem else None
            live.update(_fit(console, last[0] if last else None, line, args.brief), refresh=True)

        return _each_redraw(args, step, sampler, draw)


#: Draws one redraw: the report (None while the daemon does not answer), or the line saying why there is none.
Drawer = Callable[[DiagnoseReport | None, str | None], None]


def _each_redraw(args: argparse.Namespace, step: Callable[[], DiagnoseReport], sampler: LiveSampler | None,
                 draw: Drawer) -> int:  # fmt: skip
    """Draw ``step()``'s report every ``--interval`` s until interrupted (0); a ``--url`` daemon that does not answer
    is drawn as a problem line and asked again, live NVML that cannot start raises SourceError. Closes ``sampler``.

    SIGINT (Ctrl-C) and SIGTERM set a flag that ends the loop after the redraw in hand (a request is bounded by its
    timeout) instead of raising KeyboardInterrupt wherever the interpreter is: one raised inside a library that
    catches and carries on (an HTTP client, the terminal renderer) was lost, and the watch went on."""
    import signal
    import threading

    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.is_set():
            try:
                report = step()
            except SourceError as exc:
                if not args.url:
                    raise
                draw(None, f"{visible(exc)}; asking again every {args.interval:g} s")
            else:
                draw(report, None)
            stop.wait(args.interval)
        return 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if sampler is not None:
            sampler.close()


def _plain_drawer(args: argparse.Namespace, console: Any) -> Drawer:
    """``--watch`` into a pipe or a file: nothing to redraw in place, so each redraw (the whole report; ``--brief``:
    the summary and each GPU's first remedy) is printed after the last, under a line with its time (UTC, RFC 3339),
    flushed at once (``| tee``, ``| grep --line-buffered``)."""
    from datetime import UTC, datetime

    def draw(report: DiagnoseReport | None, problem: str | None) -> None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if report is None:
            print(f"--- {stamp}: {problem}", flush=True)
            return
        print(f"--- {stamp}", flush=True)
        with console.capture() as captured:
            brief = renderables(report, brief=True) + first_remedies(report)
            for r in brief if args.brief else renderables(report):
                console.print(r)
        sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))
        sys.stdout.flush()

    return draw


def _fit(console: Any, report: DiagnoseReport | None, problem: Any, brief: bool) -> Any:
    """The largest view of ``report`` that fits ``console``'s height, under ``problem`` (a line, or None)."""
    from rich.console import Group

    top = [problem] if problem is not None else []
    if report is None:
        return Group(*top)
    views = [] if brief else [renderables(report)]
    summary = renderables(report, brief=True)
    views += [summary + first_remedies(report), summary]
    for view in views:
        group = Group(*top, *view)
        if len(console.render_lines(group, console.options, pad=False)) < console.size.height:
            return group
    return group  # the summary alone, cropped at the bottom


def _auth(args: argparse.Namespace) -> tuple[str, str] | None:
    """(user, password) from --url.username and the first line of --url.password-file; None without them. Raises
    SourceError (one line) for a file that cannot be read or holds no password."""
    if not args.url_username:
        return None
    try:
        with open(args.url_password_file, encoding="utf-8") as f:
            password = f.readline(4096).rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot read --url.password-file {visible(args.url_password_file)}: {why(exc)}") from None
    if not password:
        raise SourceError(f"--url.password-file {visible(args.url_password_file)} holds no password on its first line")
    return str(args.url_username), password


def run(args: argparse.Namespace) -> int:
    """Run ``gpuwarden diagnose``; returns the exit status (2 for flags that cannot apply, 1 with one line on stderr
    when the source fails)."""
    from rich.console import Console

    if args.replay and args.url:
        print("gpuwarden: --replay and --url cannot apply together: give one source", file=sys.stderr)
        return 2
    if args.watch and (args.replay or args.json):
        print("gpuwarden: --watch redraws a live view: not with --replay or --json", file=sys.stderr)
        return 2
    if args.seconds <= 0 or args.interval <= 0:
        print("gpuwarden: --seconds and --interval must be positive", file=sys.stderr)
        return 2
    if bool(args.url_username) != bool(args.url_password_file) or (args.url_username and not args.url):
        print("gpuwarden: --url.username and --url.password-file go together, with --url", file=sys.stderr)
        return 2
    err = Console(stderr=True)
    try:
        args.auth = _auth(args)
        if args.watch:
            return _watch(args, Console())
        if args.replay:
            report = replay_report(Path(args.replay))
        elif args.url:
            report = url_report(args.url, auth=args.auth)
        else:
            with err.status("sampling the GPUs") as st:
                report = live_report(args.seconds, args.interval, status=st.update if not args.json else None)
    except SourceError as exc:
        print(f"gpuwarden: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        render(report, Console(), brief=args.brief)
    return 0


def add_parser(subparsers: Subparsers[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Register ``diagnose`` on ``subparsers`` (from ``ArgumentParser.add_subparsers``) and return its parser."""
    p = subparsers.add_parser(
        "diagnose",
        help=COMMANDS["diagnose"].help,
        description="Why each GPU of this node is (not) working: one line per GPU (verdict, starved share, what to "
        "do first), then the evidence and every remedy. Samples NVML for --seconds, or reads a recorded trace "
        "(--replay), or asks a running daemon for its diagnosis over its own window (--url).",
    )
    src = p.add_argument_group("source (one; default: sample this node's GPUs)")
    src.add_argument("--replay", metavar="FILE", help="diagnose a recorded trace")
    src.add_argument(
        "--url", metavar="URL", help="ask a running daemon, e.g. http://NODE:10400 (credentials: --url.username)"
    )
    src.add_argument("--url.username", dest="url_username", metavar="USER",
                     help="basic auth user for --url, with --url.password-file")  # fmt: skip
    src.add_argument("--url.password-file", dest="url_password_file", metavar="FILE",
                     help="a file whose first line is the password (never on the command line: ps and shell history "
                     "show it)")  # fmt: skip
    p.add_argument("--seconds", type=float, default=10.0, help="live: seconds to sample (default 10)")
    p.add_argument(
        "--interval", type=float, default=1.0, help="live: seconds between polls; --watch: between redraws (default 1)"
    )
    p.add_argument("--brief", action="store_true", help="only the one-line-per-GPU table")
    p.add_argument("--watch", action="store_true", help="redraw live until Ctrl-C (live NVML or --url)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p
