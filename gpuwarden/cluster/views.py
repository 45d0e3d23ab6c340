"""What ``gpuwarden top`` (the cluster's jobs and GPUs ranked by GPU-hours lost, by cause) and ``gpuwarden report``
(one job's efficiency summary) print, both from a Prometheus HTTP API (gpuwarden.cluster.usage holds the accounting,
gpuwarden.commands.top and .report the flags)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import TYPE_CHECKING, Any

from gpuwarden.cluster.usage import LOST_CAUSES, Accounting, JobKey, Usage
from gpuwarden.terminal import plain, visible
from gpuwarden.urls import redacted

if TYPE_CHECKING:
    from gpuwarden.cluster.promapi import Prometheus


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


def _usage_json(u: Usage) -> dict[str, Any]:
    return {
        "held_gpu_hours": u.held_hours,
        "busy_gpu_hours": u.busy_hours,
        "lost_gpu_hours": u.lost_total,
        "lost_gpu_hours_by_cause": u.lost_hours,
        "free_gpu_hours": u.free_hours,
        "effective_gpu_hours": u.effective_hours,
        "energy_joules": u.energy_joules,
        "held_idle_energy_joules": u.held_idle_energy_joules,
        "verdict": u.verdict(),
        "first_remedy": u.first_remedy(),
        "cost": u.cost,
        "currency": u.currency or None,
        "instances": sorted(u.instances),
        "gpus": [{"instance": i, "gpu": g} for i, g in sorted(u.gpus)],
    }


def _nodes(u: Usage, names: dict[str, str]) -> str:
    shown = sorted(names.get(i) or i for i in u.instances)
    return ", ".join(shown[:3]) + (f" +{len(shown) - 3}" if len(shown) > 3 else "")


def _open(args: argparse.Namespace) -> tuple[Prometheus, Accounting]:
    from gpuwarden.cluster.promapi import ClientTls, Prometheus  # httpx: only for the commands that ask Prometheus

    tls = ClientTls(args.ca_file, args.cert_file, args.key_file, args.bearer_token_file)
    prom = Prometheus(args.prometheus, timeout=args.timeout, headers=dict(args.header), tls=tls)
    # every query at one moment: the jobs and GPU tables (and a report's parts) cover the same range
    return prom, Accounting(prom, args.range, args.step, args.selector, at=time.time())


def top(args: argparse.Namespace) -> int:
    """``gpuwarden top``: print the jobs and GPUs that lost the most GPU-hours; exit 1 with one line on errors."""
    from gpuwarden.cluster.promapi import PrometheusError  # httpx: only for the commands that ask Prometheus

    try:
        prom, acc = _open(args)
        try:
            jobs, gpus, names = acc.jobs(), acc.gpus(), acc.node_names()
        finally:
            prom.close()
    except (PrometheusError, ValueError) as exc:
        print(f"gpuwarden top: {exc}", file=sys.stderr)
        return 1
    ranked_jobs = sorted(jobs.items(), key=lambda kv: (-kv[1].lost_total, kv[0]))[: args.limit]
    ranked_gpus = sorted(gpus.items(), key=lambda kv: (-kv[1].lost_total, kv[0]))[: args.limit]
    if args.json:
        doc = {
            "prometheus": redacted(args.prometheus),
            "range": args.range,
            "jobs": [
                {"job_id": k.job_id, "instance": k.instance, "job_kind": u.kind, **_usage_json(u)}
                for k, u in ranked_jobs
            ],  # fmt: skip
            "gpus": [
                {"instance": i, "gpu": g, "node": names.get(i, ""), **_usage_json(u)} for (i, g), u in ranked_gpus
            ],  # fmt: skip
        }
        print(_json(doc))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not jobs and not gpus:
        console.print(plain(f"No gpuwarden data in {redacted(args.prometheus)} over the last {args.range}."))
        return 1
    t = Table(title=f"Jobs by GPU-hours lost, last {args.range}", title_justify="left", expand=False)
    for col, just in (("job", "left"), ("node", "left"), ("GPUs", "right"), ("held h", "right"),
                      ("lost h", "right"), ("lost to", "left"), ("cost", "right"), ("verdict", "left"),
                      ("do first", "left")):  # fmt: skip
        t.add_column(col, justify=just, overflow="fold")  # type: ignore[arg-type]
    for k, u in ranked_jobs:
        share = u.lost_total / u.held_hours if u.held_hours else 0.0
        _row(t, k.job_id, _nodes(u, names), str(len(u.gpus)), _hours(u.held_hours),
                  f"{_hours(u.lost_total)} ({share:.0%})", _causes(u), _cost(u), " + ".join(u.verdict()[:2]) or "-",
                  _short(u.first_remedy()))  # fmt: skip
    console.print(t)
    g = Table(title=f"GPUs by GPU-hours lost, last {args.range}", title_justify="left")
    for col in ("node", "GPU", "busy h", "lost h", "lost to", "free h", "cost", "verdict"):
        g.add_column(col, justify="left" if col in ("node", "lost to", "verdict") else "right")
    for (inst, gpu), u in ranked_gpus:
        _row(g, names.get(inst) or inst, gpu, _hours(u.busy_hours), _hours(u.lost_total), _causes(u),
                  _hours(u.free_hours), _cost(u), " + ".join(u.verdict()[:2]) or "-")  # fmt: skip
    console.print(g)
    return 0


def _energy(joules: float) -> str:
    """Joules as kWh, or Wh below 1 kWh."""
    return f"{joules / 3.6e6:.2f} kWh" if joules >= 3.6e6 else f"{joules / 3600:.1f} Wh"


def _short(text: str, n: int = 70) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def report(args: argparse.Namespace) -> int:
    """``gpuwarden report --job ID``: one job's efficiency summary; exit 1 with one line when the job is not found or
    Prometheus cannot answer, 2 when a node-local id is ambiguous."""
    from gpuwarden.cluster.promapi import PrometheusError

    try:
        prom, acc = _open(args)
        try:
            found = acc.job_details(args.job, args.instance)
            if len(found) > 1:
                where = ", ".join(sorted(k.instance or "" for k in found))
                print(f"gpuwarden report: job id {args.job!r} is node-local and was seen on {len(found)} nodes "
                      f"({where}): add --instance", file=sys.stderr)  # fmt: skip
                return 2
            if not found:
                where = redacted(args.prometheus)
                print(f"gpuwarden report: no job {args.job!r} in {where} over the last {args.range}", file=sys.stderr)
                return 1
            [(key, u)] = found.items()
            stragglers = acc.stragglers(args.job, key.instance or args.instance)
            lost = acc.lost_gpus(args.job, key.instance or args.instance)
            names = acc.node_names()
        finally:
            prom.close()
    except (PrometheusError, ValueError) as exc:
        print(f"gpuwarden report: {exc}", file=sys.stderr)
        return 1
    if args.json:
        doc = {"job_id": key.job_id, "instance": key.instance, "job_kind": u.kind, "range": args.range,
               **_usage_json(u),
               "stragglers": [{"instance": i, "gpu": g, "share": s} for i, g, s in stragglers],
               "gpus_lost": [{"instance": i, "gpu": g, "node": names.get(i, "")} for i, g in lost]}  # fmt: skip
        print(_json(doc))
        return 0
    _print_report(key, u, stragglers, lost, names, args.range)
    return 0


def _print_report(key: JobKey, u: Usage, stragglers: list[tuple[str, str, float]], lost: list[tuple[str, str]],
                  names: dict[str, str], range_: str) -> None:  # fmt: skip
    from rich.console import Console
    from rich.table import Table

    title = plain(f"Job {key.label()} ({u.kind or 'job'}), last {range_}")
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column(justify="left")
    t.add_column(justify="right")
    t.add_column(justify="left")
    held = u.held_hours or float("nan")
    _row(t, "GPUs", str(len(u.gpus)), f"on {_nodes(u, names)}")
    _row(t, "GPU-hours held", _hours(u.held_hours), "")
    if u.effective_hours is not None:
        _row(t, "with SM activity >= 50%", _hours(u.effective_hours), f"{u.effective_hours / held:.0%} of held")
    _row(t, "busy (a kernel ran)", _hours(u.busy_hours), f"{u.busy_hours / held:.0%} of held")
    _row(t, "lost (held, idle)", _hours(u.lost_total), f"{u.lost_total / held:.0%} of held")
    for cause in LOST_CAUSES:
        if u.lost_hours[cause] > 0:
            _row(t, f"  {cause}", _hours(u.lost_hours[cause]), "")
    if u.energy_joules is not None:
        _row(t, "energy", _energy(u.energy_joules), "")
    if u.held_idle_energy_joules:
        _row(t, "  drawn while held idle", _energy(u.held_idle_energy_joules), "above the idle floor")
    if u.cost is not None:
        _row(t, "cost of lost GPU-hours", _cost(u), "")
    if stragglers:
        i, g, s = stragglers[0]
        _row(t, "straggler", f"{names.get(i) or i} GPU {g}", f"flagged {s:.0%} of the time")
    if lost:
        _row(t, "GPUs lost (down)", ", ".join(f"{names.get(i) or i} GPU {g}" for i, g in lost),
             "went down while the job held them")  # fmt: skip
    _row(t, "verdict", " + ".join(u.verdict()) or "-", "")
    Console().print(t)
    if u.first_remedy():
        from rich.text import Text

        Console().print(Text.assemble(("Do first:", "bold"), " ", visible(u.first_remedy())))
