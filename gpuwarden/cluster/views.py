"""What ``gpuwarden top`` (the cluster's jobs and GPUs ranked by GPU-hours lost, by cause) and ``gpuwarden report``
(one job's efficiency summary) print, both from a Prometheus HTTP API (gpuwarden.cluster.usage holds the accounting,
gpuwarden.commands.top and .report the flags)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from gpuwarden.cluster.accounting_queries import Cluster, GpuKey
from gpuwarden.cluster.durations import seconds
from gpuwarden.cluster.usage import (
    LOST_CAUSES,
    RECORDED_CHECK,
    Accounting,
    JobKey,
    RecordsCoverage,
    Usage,
    default_attribution,
)
from gpuwarden.terminal import SHOWN_CHARS, brief, listed, plain, redacted, visible

if TYPE_CHECKING:
    from gpuwarden.cluster.bounds import Deadline
    from gpuwarden.cluster.promapi import Prometheus

T = TypeVar("T")
#: (cluster, instance) -> node name (Accounting.node_names).
Names = dict[tuple[Cluster, str], str]


def _row(table: Any, *cells: object) -> None:
    """Add a row of cells shown as they are (gpuwarden.terminal.plain: job ids and node names are machine text)."""
    table.add_row(*(plain(c) for c in cells))


def _hours(h: float) -> str:
    return f"{h:.2f}" if h < 10 else f"{h:.1f}"


def _causes(u: Usage, n: int = 2) -> str:
    top = sorted(((v, c) for c, v in u.lost_hours.items() if v > 0), reverse=True)[:n]
    return ", ".join(f"{c} {_hours(v)} h" for v, c in top) or "-"


def _cost(u: Usage) -> str:
    return "" if u.cost is None else f"{u.cost:,.2f} {u.currency}"


def _json(doc: Any) -> str:
    """``doc`` as strict JSON text: a non-finite number (which json.dumps would write as ``Infinity``, not JSON) is
    written as null."""

    def finite(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: finite(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [finite(v) for v in x]
        return x

    return json.dumps(finite(doc), indent=2, allow_nan=False)


def _usage_json(u: Usage, cluster_labels: tuple[str, ...]) -> dict[str, Any]:
    return {
        "cluster": dict(zip(cluster_labels, u.cluster, strict=False)) or None,
        "held_gpu_hours": u.held_hours,
        "busy_gpu_hours": u.busy_hours,
        "lost_gpu_hours": u.lost_total,
        "lost_gpu_hours_by_cause": u.lost_hours,
        "free_gpu_hours": u.free_hours,
        "effective_gpu_hours": u.effective_hours,
        "peak_equivalent_gpu_hours": u.peak_equivalent_hours,
        "energy_joules": u.energy_joules,
        "held_idle_energy_joules": u.held_idle_energy_joules,
        "idle_energy_joules_by_cause": u.idle_energy_joules,
        "peer_wait_gpu_hours": u.peer_wait_hours,
        "peer_wait_energy_joules": u.peer_wait_energy_joules,
        "verdict": u.verdict(),
        "first_remedy": u.first_remedy(),
        "cost": u.cost,
        "currency": u.currency or None,
        "instances": sorted(u.instances),
        "gpus": [{"instance": i, "gpu": g} for i, g in sorted(u.gpus)],
    }


def _node(names: Names, cluster: Cluster, instance: str) -> str:
    """The node's name, or its instance where no name is known."""
    return names.get((cluster, instance)) or instance


def _nodes(u: Usage, names: Names) -> str:
    shown = sorted(_node(names, u.cluster, i) for i in u.instances)
    return ", ".join(shown[:3]) + (f" +{len(shown) - 3}" if len(shown) > 3 else "")


def _short(node: str) -> str:
    """A node's host name without its domain (``gpu-007.dc1.example`` -> ``gpu-007``); an address as it is."""
    head = node.split(".", 1)[0]
    return node if head.isdigit() or not head else head


def _job_label(key: JobKey, names: Names) -> str:
    """The job as ``top`` shows it: its id whole (ready to paste into ``report --job``), with the node it belongs to
    (its host name) when the id is node-local (the same id names unrelated jobs on other nodes) and its cluster when
    the series name one."""
    where = "" if key.instance is None else f" @ {_short(_node(names, key.cluster, key.instance))}"
    return f"{key.job_id}{where}" + (f" [{'/'.join(key.cluster)}]" if any(key.cluster) else "")


def _open(args: argparse.Namespace, deadline: Deadline | None = None) -> tuple[Prometheus, Accounting]:
    from gpuwarden.cluster.promapi import ClientTls, Prometheus  # httpx: only for the commands that ask Prometheus

    tls = ClientTls(args.ca_file, args.cert_file, args.key_file, args.bearer_token_file)
    prom = Prometheus(args.prometheus, timeout=args.timeout, headers=dict(args.header), tls=tls, deadline=deadline)
    # every query at one moment: the jobs and GPU tables (and a report's parts) cover the same range
    at = time.time() if getattr(args, "at", None) is None else args.at
    labels = tuple(getattr(args, "cluster_labels", ("cluster",)))
    given = getattr(args, "resolution", None)
    resolution = seconds(given) if given else default_attribution(seconds(args.range))
    return prom, Accounting(prom, args.range, args.step, args.selector, at=at, cluster_labels=labels,
                            attribution=resolution)  # fmt: skip


def _ask(args: argparse.Namespace, command: str, work: Callable[[Accounting], T], deadline: Deadline | None = None
         ) -> T | None:  # fmt: skip
    """``work(accounting)`` against the Prometheus of ``args``, the client closed after it; None after printing one
    line ``gpuwarden COMMAND: why`` when Prometheus cannot answer or the arguments are refused. ``deadline``: the
    command's, when it asks more than Prometheus within its --timeout (None: --timeout from now)."""
    from gpuwarden.cluster.promapi import PrometheusError  # httpx: only for the commands that ask Prometheus
    from gpuwarden.terminal import progress

    try:
        prom, acc = _open(args, deadline)
        try:
            with progress(f"gpuwarden {command}: asking {redacted(args.prometheus)}"):  # a terminal sees it work
                return work(acc)
        finally:
            prom.close()
    except (PrometheusError, ValueError) as exc:
        print(f"gpuwarden {command}: {brief(exc, 400)}", file=sys.stderr)
        return None


#: From this range on ``top --source auto`` reads the usage records where they cover it: the exact accounting reads
#: every GPU's series at every scrape (about 8 s for 15 minutes of 1,024 GPUs on a 2-core machine: past a minute at
#: 10,000), the records one sample a job and node a minute.
RECORDED_FROM_SECONDS = 900


#: ``top`` says so when the usage records miss this share of the evaluations due in its range or more (their figures
#: are within about 1% of the counters otherwise: gpuwarden.cluster.usage.Accounting.recorded_jobs).
RECORDS_MISSING_NOTE = 0.01


@dataclass
class TopData:
    """What ``top`` shows: the jobs and GPUs with their usage, the node names, the accounting asked, the source
    read (recorded or raw) and, from the records, what of the range they hold (None from the counters)."""

    jobs: dict[JobKey, Usage]
    gpus: dict[GpuKey, Usage]
    names: Names
    acc: Accounting
    source: str
    coverage: RecordsCoverage | None = None


def _top(acc: Accounting, source: str) -> TopData:
    """``top``'s data from ``source`` (auto, recorded, raw): auto reads the usage records over RECORDED_FROM_SECONDS
    or more wherever they exist in the range (one sample a job and node a minute: a fleet's day answers in seconds),
    saying what of the range they miss, and the counters otherwise; raises ValueError when the records were asked for
    and none is in the range."""
    coverage = acc.records_coverage() if source != "raw" and seconds(acc.range) >= RECORDED_FROM_SECONDS else None
    if source == "auto":
        source = "recorded" if coverage is not None and coverage.start is not None else "raw"
    elif source == "recorded" and (coverage is None or coverage.start is None):
        raise ValueError(f"the usage records (rule group gpuwarden.usage) do not cover the last {acc.range} of the "
                         "selected nodes: load alerts/gpuwarden.rules.yml, or use --source raw")  # fmt: skip
    if source == "recorded":
        return TopData(acc.recorded_jobs(), acc.recorded_gpus(), acc.node_names(), acc, source, coverage)
    return TopData(acc.jobs(), acc.gpus(), acc.node_names(), acc, source)


def records_notes(acc: Accounting, coverage: RecordsCoverage | None) -> list[str]:
    """Lines saying what of the range the usage records miss and what it does to the figures: that they begin
    RECORDED_CHECK or more after the range's start, and that RECORDS_MISSING_NOTE or more of the evaluations due
    since wrote nothing; [] from the counters or records that hold the range."""
    if coverage is None or coverage.start is None:
        return []
    out = []
    late = coverage.start - (acc.at - seconds(acc.range))
    if late >= RECORDED_CHECK:
        begun = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(coverage.start))
        out.append(f"the usage records begin at {begun}, {duration_words(late)} into the last {acc.range}: GPU-hours "
                   f"before then are not in the figures; --source raw reads the counters")  # fmt: skip
    if coverage.missing >= RECORDS_MISSING_NOTE:
        out.append(f"the usage records miss {coverage.missing:.0%} of the evaluations due in the last {acc.range} "
                   f"(the rule group gpuwarden.usage fell behind or was not evaluated): the hours below are low by "
                   f"about that share; --source raw reads the counters")  # fmt: skip
    return out


def duration_words(secs: float) -> str:
    """``secs`` as hours and minutes (``5h 07m``; under an hour ``42m``)."""
    minutes = round(secs / 60)
    return f"{minutes // 60}h {minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m"


def top(args: argparse.Namespace) -> int:
    """``gpuwarden top``: print the jobs and GPUs that lost the most GPU-hours (every one of them with ``--json``, the
    first ``--limit`` in the tables); exit 1 with one line on errors."""
    got = _ask(args, "top", lambda acc: _top(acc, getattr(args, "source", "raw")))
    if got is None:
        return 1
    jobs, gpus, names, acc, source = got.jobs, got.gpus, got.names, got.acc, got.source
    for note in records_notes(acc, got.coverage):
        print(f"gpuwarden top: {note}", file=sys.stderr)
    ranked_jobs = sorted(jobs.items(), key=lambda kv: (-kv[1].lost_total, kv[0]))
    ranked_gpus = sorted(gpus.items(), key=lambda kv: (-kv[1].lost_total, kv[0]))
    if args.json:
        doc = {
            "prometheus": redacted(args.prometheus),
            "range": args.range,
            "step": args.step,
            "evaluated_at": acc.at,
            "source": source,
            "records_start": None if got.coverage is None else got.coverage.start,
            "records_missing_ratio": None if got.coverage is None else got.coverage.missing,
            "jobs": [
                {"job_id": k.job_id, "instance": k.instance, "job_kind": u.kind, **_usage_json(u, acc.cluster_labels)}
                for k, u in ranked_jobs
            ],  # fmt: skip
            "gpus": [
                {"instance": i, "gpu": g, "node": names.get((c, i), ""), **_usage_json(u, acc.cluster_labels)}
                for (c, i, g), u in ranked_gpus
            ],  # fmt: skip
        }
        print(_json(doc))
        return 0
    console = _console()
    if not jobs and not gpus:
        _print(console, plain(f"No gpuwarden data in {redacted(args.prometheus)} over the last {args.range}."))
        return 1
    _print(console, jobs_table(ranked_jobs[: args.limit], names, args.range, console.width))
    if args.details:
        for k, u in ranked_jobs[: args.limit]:
            _print(console, job_details(k, u, names))
    _print(console, gpus_table(ranked_gpus[: args.limit], names, args.range, console.width))
    return 0


def suspects_view(args: argparse.Namespace) -> int:
    """``gpuwarden top --suspects``: print the fail-slow suspects (gpuwarden.cluster.suspects) with their evidence;
    exit 1 with one line on errors."""
    from gpuwarden.cluster.suspects import suspects

    got = _ask(args, "top", lambda acc: (suspects(acc, args.straggler_for, args.suspect_jobs), acc.node_names()))
    if got is None:
        return 1
    found, names = got
    if getattr(args, "format", "table") != "table":
        from gpuwarden.cluster.exclude import exclude_list, from_suspects

        on_nodes = [(s, names.get((s.cluster, s.instance), "") or s.instance.rsplit(":", 1)[0]) for s in found]
        print(exclude_list(from_suspects(on_nodes), args.format, args.range), end="")
        return 0
    if args.json:
        doc = {"prometheus": redacted(args.prometheus), "range": args.range, "min_jobs": args.suspect_jobs,
               "straggler_for": args.straggler_for,
               "suspects": [{"instance": s.instance, "node": names.get((s.cluster, s.instance), ""), "gpu": s.gpu,
                             "uuid": s.uuid, "jobs": s.jobs, "evidence": s.evidence} for s in found]}  # fmt: skip
        print(_json(doc))
        return 0
    console = _console()
    if not found:
        _print(console, plain(f"No GPU was the straggler of {args.suspect_jobs} or more jobs over the last "
                              f"{args.range}."))  # fmt: skip
        return 0
    rows = [(s, _node(names, s.cluster, s.instance)) for s in found]
    required: list[Column] = [
        ("node", False, lambda r: r[1]),
        ("GPU", True, lambda r: r[0].gpu),
        ("jobs", True, lambda r: str(r[0].jobs)),
        ("evidence on the node", False, lambda r: "; ".join(r[0].evidence) or "none: not on this node"),
    ]
    optional: list[Column] = [("uuid", False, lambda r: r[0].uuid)]
    title = f"Fail-slow suspects: the straggler of {args.suspect_jobs}+ jobs, last {args.range}"
    _print(console, _fitted(title, required, optional, rows, console.width))
    return 0


def quality_view(args: argparse.Namespace) -> int:
    """``gpuwarden top --quality``: print every GPU's quality tier, score and reasons (gpuwarden.cluster.quality),
    worst first; with ``--format slurm|k8s`` the nodes of the GPUs that need service as an exclude list. Exit 1 with
    one line on errors."""
    from gpuwarden.cluster.quality import quality

    got = _ask(args, "top", lambda acc: (quality(acc, args.straggler_for, args.suspect_jobs), acc.node_names()))
    if got is None:
        return 1
    found, names = got

    def node(q: Any) -> str:
        return names.get((q.cluster, q.instance), "") or q.instance.rsplit(":", 1)[0]

    if getattr(args, "format", "table") != "table":
        from gpuwarden.cluster.exclude import SERVICE_TAINT_KEY, Listed, exclude_list

        listed = [Listed(node(q), q.gpu, f"GPU {q.gpu}: " + ", ".join(t for tier, t in q.reasons if tier == "service"))
                  for q in found if q.tier == "service"]  # fmt: skip
        text = exclude_list(listed, args.format, args.range, what="GPUs that need service",
                            drain_reason="gpuwarden: a GPU needs service", taint_key=SERVICE_TAINT_KEY)  # fmt: skip
        print(text, end="")
        return 0
    if args.json:
        doc = {"prometheus": redacted(args.prometheus), "range": args.range,
               "gpus": [{"instance": q.instance, "node": names.get((q.cluster, q.instance), ""), "gpu": q.gpu,
                         "uuid": q.uuid, "tier": q.tier, "score": round(q.score, 3),
                         "reasons": [{"tier": t, "reason": r} for t, r in q.reasons]} for q in found]}  # fmt: skip
        print(_json(doc))
        return 0
    console = _console()
    listed_gpus = [q for q in found if q.reasons]
    good = len(found) - len(listed_gpus)
    if not listed_gpus:
        _print(console, plain(f"All {good} GPU(s) good over the last {args.range}: no error, link, clock or fail-slow "
                              "sign."))  # fmt: skip
        return 0
    rows = [(q, _node(names, q.cluster, q.instance)) for q in listed_gpus]
    required: list[Column] = [
        ("node", False, lambda r: r[1]),
        ("GPU", True, lambda r: r[0].gpu),
        ("tier", False, lambda r: r[0].tier),
        ("score", True, lambda r: f"{r[0].score:.2f}"),
        ("reasons", False, lambda r: "; ".join(t for _, t in r[0].reasons)),
    ]
    optional: list[Column] = [("uuid", False, lambda r: r[0].uuid)]
    title = f"GPU quality across jobs, last {args.range}: {len(listed_gpus)} to look at, {good} good"
    _print(console, _fitted(title, required, optional, rows, console.width))
    return 0


def _console() -> Any:
    """A rich Console: the terminal's width on a terminal; otherwise (a pipe or a file) one whose tables
    ``_print`` writes as tab-separated values (``_fitted`` marks them), every column, one line a row."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=100_000, no_color=True, highlight=False, soft_wrap=False)
    return console


def _print(console: Any, renderable: Any) -> None:
    """Print ``renderable`` on ``console``; without a terminal, a table of ``_fitted`` as tab-separated values (a
    ``# title`` line, a header, a row a line: what ``cut``, ``awk`` and spreadsheets read) and anything else as lines
    without the padding to the console's width."""
    if console.is_terminal:
        console.print(renderable)
        return
    columns = getattr(renderable, "gpuwarden_tsv", None)
    if columns is not None:
        title, header, rows = columns
        lines = [f"# {title}", "\t".join(header), *("\t".join(_tsv_cell(c) for c in row) for row in rows)]
        sys.stdout.write("".join(line + "\n" for line in lines) + "\n")
        return
    with console.capture() as captured:
        console.print(renderable)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def _tsv_cell(text: str) -> str:
    """A cell of a tab-separated line: shown as ``brief`` shows it (at most SHOWN_CHARS), a tab written as its
    escape."""
    return brief(text, SHOWN_CHARS).replace("\t", "\\t")


#: A column of ``top``'s tables: (title, right-aligned, cell of one row).
Column = tuple[str, bool, Callable[[Any], str]]


def _fitted(title: str, required: list[Column], optional: list[Column], rows: list[Any], width: int) -> Any:
    """A table of ``rows``: every ``required`` column, then the ``optional`` ones in order while the table stays
    within ``width`` characters. A job id is shown whole, ready to paste, where the required columns leave it room;
    a longer one (a cgroup path) is cut in its middle (``_middle_cut``) rather than push a required column out; no
    other cell is cut. A caption names the columns left out and the ids cut, and where to see them whole. The table
    carries every column's cells whole for a pipe (``_print`` writes them as tab-separated values)."""
    from rich import box
    from rich.table import Table

    cells = {c[0]: [c[2](r) for r in rows] for c in required + optional}
    shown = dict(cells)

    def natural(c: Column) -> int:
        # its widest cell, the padding either side, and the box's space between it and the next (SIMPLE_HEAD);
        # the first column's left padding is the table's edge (pad_edge=False): the sum is the table's width
        return max([len(c[0]), *(len(visible(x)) for x in shown[c[0]])]) + 3

    first = required[0][0]
    room = width - sum(natural(c) for c in required[1:]) - 3 + 1  # what the required columns leave the first one
    cut = [x for x in cells[first] if len(visible(x)) > max(room, len(first))]
    if cut:  # a long id (a cgroup path) would push the required columns out: its middle gives way, its ends stay
        shown[first] = [_middle_cut(x, max(room, len(first), 9)) for x in cells[first]]
    chosen = _within(required, optional, natural, width)
    hidden = [c[0] for c in optional if c not in chosen]
    notes = [f"not shown at {width} columns: {', '.join(hidden)}"] if hidden else []
    if cut:
        notes.append(f"{len(cut)} {first} name(s) cut in the middle (...)")
    caption = f"{'; '.join(notes)} (a wider terminal, --details or --json)" if notes else None
    t = Table(title=title, title_justify="left", caption=caption, caption_justify="left", box=box.SIMPLE_HEAD,
              pad_edge=False, expand=False)  # fmt: skip
    for n, c in enumerate(chosen):
        # every cell on one line at its own width; only the first column (the job id) folds when even the required
        # columns do not fit
        t.add_column(c[0], justify="right" if c[1] else "left", no_wrap=n > 0, overflow="fold",
                     min_width=natural(c) - 3)  # fmt: skip
    for i in range(len(rows)):
        t.add_row(*(plain(shown[c[0]][i]) for c in chosen))
    every = required + optional
    t.gpuwarden_tsv = (title, [c[0] for c in every], [[cells[c[0]][i] for c in every] for i in range(len(rows))])  # type: ignore[attr-defined]
    return t


def _within(
    required: list[Column], optional: list[Column], natural: Callable[[Column], int], width: int
) -> list[Column]:
    """Every ``required`` column, then each ``optional`` one that still fits in ``width`` characters (``natural``:
    a column's width with its padding), in the order given."""
    chosen = list(required)
    used = sum(natural(c) for c in chosen) - 1
    for c in optional:
        if used + natural(c) <= width:
            chosen.append(c)
            used += natural(c)
    return [c for c in required + optional if c in chosen]


def _middle_cut(text: str, most: int) -> str:
    """``text`` in at most ``most`` characters: its head and tail around ``...`` where it is longer (a cgroup path's
    head names the slice, its tail the unit)."""
    if len(text) <= most:
        return text
    tail = (most - 3) // 2
    return text[: most - 3 - tail] + "..." + text[len(text) - tail :]


def _lost(u: Usage) -> str:
    share = u.lost_total / u.held_hours if u.held_hours else 0.0
    return f"{_hours(u.lost_total)} ({share:.0%})"


def _main_cause(u: Usage) -> str:
    return _causes(u, 1).split(" ", 1)[0]


def jobs_table(ranked: list[tuple[JobKey, Usage]], names: Names, range_: str, width: int) -> Any:
    """``top``'s job table (a rich Table) of ``ranked`` (JobKey, Usage) pairs: the job id whole, its GPUs, GPU-hours
    held and lost, and the main cause on one line; then nodes, cost, verdict and the causes in order while the table
    fits ``width`` characters, the peak-equivalent (OFU) GPU-hours among them. ``--details`` prints the rest below
    (``job_details``)."""
    required: list[Column] = [
        ("job", False, lambda r: _job_label(r[0], names)),
        ("GPUs", True, lambda r: str(len(r[1].gpus))),
        ("held h", True, lambda r: _hours(r[1].held_hours)),
        ("lost h", True, lambda r: _lost(r[1])),
        ("lost to", False, lambda r: _main_cause(r[1])),
    ]
    optional: list[Column] = [
        ("cost", True, lambda r: _cost(r[1])),
        ("verdict", False, lambda r: " + ".join(r[1].verdict()[:2]) or "-"),
        ("peak-eq h", True, lambda r: _optional_hours(r[1].peak_equivalent_hours)),
        ("node", False, lambda r: _nodes(r[1], names)),
        ("causes", False, lambda r: _causes(r[1], 3)),
    ]
    return _fitted(f"Jobs by GPU-hours lost, last {range_}", required, optional, ranked, width)


def gpus_table(ranked: list[tuple[GpuKey, Usage]], names: Names, range_: str, width: int) -> Any:
    """``top``'s GPU table (a rich Table) of ``ranked`` ((cluster, instance, gpu), Usage) pairs: node, GPU, GPU-hours
    busy and lost, the main cause; then free hours, cost, verdict and the causes while it fits ``width``."""
    required: list[Column] = [
        ("node", False, lambda r: _node(names, r[0][0], r[0][1]) + (f" [{'/'.join(r[0][0])}]" if any(r[0][0]) else "")),
        ("GPU", True, lambda r: r[0][2]),
        ("busy h", True, lambda r: _hours(r[1].busy_hours)),
        ("lost h", True, lambda r: _hours(r[1].lost_total)),
        ("lost to", False, lambda r: _main_cause(r[1])),
    ]
    optional: list[Column] = [
        ("free h", True, lambda r: _hours(r[1].free_hours)),
        ("cost", True, lambda r: _cost(r[1])),
        ("verdict", False, lambda r: " + ".join(r[1].verdict()[:2]) or "-"),
        ("causes", False, lambda r: _causes(r[1], 3)),
    ]
    return _fitted(f"GPUs by GPU-hours lost, last {range_}", required, optional, ranked, width)


def _optional_hours(hours: float | None) -> str:
    return "-" if hours is None else _hours(hours)


def _effective(u: Usage) -> str:
    """Held, busy, effective (SM activity >= 50%), peak-equivalent (OFU) and waiting-on-peers GPU-hours, the known."""
    parts = [f"{_hours(u.held_hours)} held", f"{_hours(u.busy_hours)} busy"]
    if u.peer_wait_hours:
        parts.append(f"{_hours(u.peer_wait_hours)} of it waiting on peers")
    if u.effective_hours is not None:
        parts.append(f"{_hours(u.effective_hours)} with SM activity >= 50%")
    if u.peak_equivalent_hours is not None:
        parts.append(f"{_hours(u.peak_equivalent_hours)} at dense tensor peak (OFU)")
    return ", ".join(parts)


def job_details(key: JobKey, u: Usage, names: Names) -> Any:
    """One job's details below ``top``'s table (a rich Text): its id and node, nodes, GPU-hours held, busy, waiting
    on peers, effective and peak-equivalent, lost GPU-hours by cause, cost, verdict and what to do first."""
    from rich.text import Text

    lines = [
        ("", _job_label(key, names)),
        ("  nodes: ", ", ".join(sorted(_node(names, u.cluster, i) for i in u.instances)) or "-"),
        ("  GPU-hours: ", _effective(u)),
        ("  lost to: ", _causes(u, len(LOST_CAUSES))),
        ("  verdict: ", " + ".join(u.verdict()) or "-"),
    ]
    if u.cost is not None:
        lines.insert(4, ("  cost: ", _cost(u)))
    if u.first_remedy():
        lines.append(("  do first: ", u.first_remedy()))
    text = Text()
    for label, value in lines:
        text.append(label, style="bold" if not label else "dim")
        text.append(visible(value) + "\n", style="bold" if not label else "")
    return text


def _energy(joules: float) -> str:
    """Joules as kWh, or Wh below 1 kWh."""
    return f"{joules / 3.6e6:.2f} kWh" if joules >= 3.6e6 else f"{joules / 3600:.1f} Wh"


def report(args: argparse.Namespace) -> int:
    """``gpuwarden report --job ID``: one job's efficiency summary; exit 1 with one line when the job is not found or
    Prometheus cannot answer, 2 when a node-local id, or a Slurm job number given for SLUID-keyed jobs, is
    ambiguous."""
    from gpuwarden.cluster.promapi import PrometheusError
    from gpuwarden.terminal import progress

    try:
        prom, acc = _open(args)
        try:
            job = args.job
            sluids: list[tuple[str, Cluster]] = []
            with progress(f"gpuwarden report: asking {redacted(args.prometheus)}"):  # a terminal sees it work
                found = acc.job_details(job, args.instance)
                if not found and args.job.isascii() and args.job.isdigit():
                    # Slurm 26.05+: the series carry the SLUID; the numeric id is a label where a daemon could read it
                    sluids = acc.slurm_jobs(args.job)
                    if len(sluids) == 1:
                        job = sluids[0][0]
                        found = acc.job_details(job, args.instance)
            if len(sluids) > 1:  # the number was reused in the range (another cluster, a wrapped counter)
                named = listed(JobKey(x, None, c).label() for x, c in sluids)
                print(f"gpuwarden report: Slurm job {args.job} is {len(sluids)} jobs in the range ({named}): "
                      "give the SLUID", file=sys.stderr)  # fmt: skip
                return 2
            clusters = {k.cluster for k in found}
            if len(clusters) > 1:
                where = listed(sorted("/".join(c) for c in clusters))
                label = acc.cluster_labels[0] if acc.cluster_labels else "cluster"
                print(f"gpuwarden report: job id {brief(args.job)!r} was seen in {len(clusters)} clusters ({where}): "
                      f"add --selector '{label}=\"...\"'", file=sys.stderr)  # fmt: skip
                return 2
            if len(found) > 1:
                where = listed(sorted(k.instance or "" for k in found))
                print(f"gpuwarden report: job id {brief(args.job)!r} is node-local and was seen on {len(found)} "
                      f"nodes ({where}): add --instance", file=sys.stderr)  # fmt: skip
                return 2
            if not found:
                where = redacted(args.prometheus)
                print(f"gpuwarden report: no job {brief(args.job)!r} in {where} over the last {args.range}",
                      file=sys.stderr)  # fmt: skip
                return 1
            [(key, u)] = found.items()
            stragglers = acc.stragglers(key)
            lost = acc.lost_gpus(key)
            names = acc.node_names()
        finally:
            prom.close()
    except (PrometheusError, ValueError) as exc:
        print(f"gpuwarden report: {brief(exc, 400)}", file=sys.stderr)
        return 1
    if args.json:
        doc = {"job_id": key.job_id, "instance": key.instance, "job_kind": u.kind, "asked_for": args.job,
               "range": args.range,
               "step": args.step, "evaluated_at": acc.at, "prometheus": redacted(args.prometheus),
               **_usage_json(u, acc.cluster_labels),
               "stragglers": [{"instance": i, "gpu": g, "share": s} for i, g, s in stragglers],
               "gpus_lost": [{"instance": i, "gpu": g, "node": names.get((key.cluster, i), "")}
                             for i, g in lost]}  # fmt: skip
        print(_json(doc))
        return 0
    _print_report(key, u, stragglers, lost, names, args.range)
    return 0


def _print_report(key: JobKey, u: Usage, stragglers: list[tuple[str, str, float]], lost: list[tuple[str, str]],
                  names: Names, range_: str) -> None:  # fmt: skip
    from rich.table import Table

    title = plain(f"Job {_job_label(key, names)} ({u.kind or 'job'}), last {range_}")
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column(justify="left")
    t.add_column(justify="right")
    t.add_column(justify="left")
    held = u.held_hours or float("nan")
    _row(t, "GPUs", str(len(u.gpus)), f"on {_nodes(u, names)}")
    _row(t, "GPU-hours held", _hours(u.held_hours), "")
    if u.effective_hours is not None:
        _row(t, "with SM activity >= 50%", _hours(u.effective_hours), f"{u.effective_hours / held:.0%} of held")
    if u.peak_equivalent_hours is not None:
        _row(t, "at dense tensor peak (OFU)", _hours(u.peak_equivalent_hours),
             f"{u.peak_equivalent_hours / held:.0%} of held: FLOP utilization estimate")  # fmt: skip
    _row(t, "busy (a kernel ran)", _hours(u.busy_hours), f"{u.busy_hours / held:.0%} of held")
    if u.peer_wait_hours:
        _row(t, "  waiting on peers", _hours(u.peer_wait_hours),
             f"{u.peer_wait_hours / held:.0%} of held: in a collective, waiting on the straggler")  # fmt: skip
    _row(t, "lost (held, idle)", _hours(u.lost_total), f"{u.lost_total / held:.0%} of held")
    for cause in LOST_CAUSES:
        if u.lost_hours[cause] > 0:
            _row(t, f"  {cause}", _hours(u.lost_hours[cause]), "")
    if u.energy_joules is not None:
        _row(t, "energy", _energy(u.energy_joules), "")
    if u.idle_energy_joules:
        for cause, joules in u.idle_energy_joules.items():
            if joules > 0:
                _row(t, f"  drawn while idle: {cause}", _energy(joules), "above the idle floor")
    elif u.held_idle_energy_joules:
        _row(t, "  drawn while held idle", _energy(u.held_idle_energy_joules), "above the idle floor")
    if u.peer_wait_energy_joules:
        _row(t, "  drawn while waiting on peers", _energy(u.peer_wait_energy_joules), "above the idle floor")
    if u.cost is not None:
        _row(t, "cost of lost GPU-hours", _cost(u), "")
    if stragglers:
        i, g, s = stragglers[0]
        _row(t, "straggler", f"{_node(names, key.cluster, i)} GPU {g}", f"flagged {s:.0%} of the time")
    if lost:
        _row(t, "GPUs lost (down)", ", ".join(f"{_node(names, key.cluster, i)} GPU {g}" for i, g in lost),
             "went down while the job held them")  # fmt: skip
    _row(t, "verdict", " + ".join(u.verdict()) or "-", "")
    console = _console()
    _print(console, t)
    if u.first_remedy():
        from rich.text import Text

        _print(console, Text.assemble(("Do first:", "bold"), " ", visible(u.first_remedy())))
