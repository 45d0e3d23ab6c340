"""GPU-hours and their price by owner: ``gpuwarden top --by user|account|namespace|job``, for chargeback.

Each job's usage (gpuwarden.cluster.usage: held, busy, lost by cause, each job priced at its nodes' price per GPU-hour
by GPU model) is added to its owner's: the ``user``, ``account`` or ``namespace`` label of its gpu_job_info series
(the Slurm prolog's user and account, the processes' user, the pod's namespace), or the job itself. A job without an
owner of that kind adds to the row ``owner: None`` (printed ``(none)``), so the rows add up to the fleet.

Money is each figure times its job's price: what the GPU-hours held cost, what the busy ones did, and what each cause
of idle time cost. A job on nodes without a price adds its hours and no money (``unpriced_held_gpu_hours`` says how
many), so a row's money is never a guess.
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpuwarden.cluster.usage import LOST_CAUSES, JobKey, Usage

if TYPE_CHECKING:
    from gpuwarden.cluster.usage import Accounting
    from gpuwarden.cluster.views import Column, TopData

#: What ``--by`` groups by: a label of gpu_job_info, or the job.
OWNER_KINDS = ("user", "account", "namespace", "job")


@dataclass
class OwnerUsage:
    """One owner's GPU-hours over the range (held, busy, lost by cause), the money of each, its jobs and GPUs."""

    owner: str | None
    jobs: int = 0
    gpus: int = 0
    held_hours: float = 0.0
    busy_hours: float = 0.0
    lost_hours: dict[str, float] = field(default_factory=lambda: dict.fromkeys(LOST_CAUSES, 0.0))
    held_cost: float | None = None
    busy_cost: float | None = None
    lost_cost: dict[str, float] | None = None
    currency: str = ""
    unpriced_held_hours: float = 0.0

    @property
    def lost_total(self) -> float:
        """Lost GPU-hours, all causes."""
        return sum(self.lost_hours.values())

    @property
    def lost_cost_total(self) -> float | None:
        """The money of the lost GPU-hours, all causes (None: no job of the owner was priced)."""
        return None if self.lost_cost is None else sum(self.lost_cost.values())

    def add(self, u: Usage) -> None:
        """Add one job's usage ``u``: its hours, and where it is priced, their money at its price."""
        self.jobs += 1
        self.gpus += len(u.gpus)
        self.held_hours += u.held_hours
        self.busy_hours += u.busy_hours
        for cause, h in u.lost_hours.items():
            self.lost_hours[cause] = self.lost_hours.get(cause, 0.0) + h
        if u.price is None:
            self.unpriced_held_hours += u.held_hours
            return
        self.held_cost = (self.held_cost or 0.0) + u.held_hours * u.price
        self.busy_cost = (self.busy_cost or 0.0) + u.busy_hours * u.price
        lost = self.lost_cost if self.lost_cost is not None else dict.fromkeys(LOST_CAUSES, 0.0)
        for cause, h in u.lost_hours.items():
            lost[cause] = lost.get(cause, 0.0) + h * u.price
        self.lost_cost = lost
        self.currency = "/".join(sorted({c for c in (*self.currency.split("/"), u.currency) if c}))


def by_owner(jobs: Mapping[JobKey, Usage], owners: Mapping[JobKey, str], kind: str) -> list[OwnerUsage]:
    """The jobs' usage added up by owner (``owners``: each job's owner of ``kind``; ``kind`` job: the job's id, with
    its node where the id is node-local), ranked by lost money, then lost GPU-hours, then name."""
    rows: dict[str | None, OwnerUsage] = {}
    for key, u in jobs.items():
        owner = key.label() if kind == "job" else owners.get(key)
        rows.setdefault(owner, OwnerUsage(owner)).add(u)
    return sorted(rows.values(), key=lambda r: (-(r.lost_cost_total or 0.0), -r.lost_total, r.owner or ""))


def as_json(r: OwnerUsage) -> dict[str, object]:
    """One row for ``--json``: the owner, its jobs and GPUs, GPU-hours held, used (busy) and lost (by cause), and the
    money of each (None where nothing was priced)."""
    return {
        "owner": r.owner,
        "jobs": r.jobs,
        "gpus": r.gpus,
        "held_gpu_hours": r.held_hours,
        "used_gpu_hours": r.busy_hours,
        "lost_gpu_hours": r.lost_total,
        "lost_gpu_hours_by_cause": r.lost_hours,
        "held_cost": r.held_cost,
        "used_cost": r.busy_cost,
        "lost_cost": r.lost_cost_total,
        "lost_cost_by_cause": r.lost_cost,
        "currency": r.currency or None,
        "unpriced_held_gpu_hours": r.unpriced_held_hours,
    }


#: The columns of ``--format csv``, in order (the causes' after ``lost_gpu_hours`` and ``lost_cost``).
CSV_HEAD = ("owner", "jobs", "gpus", "held_gpu_hours", "used_gpu_hours", "lost_gpu_hours")


def as_csv(kind: str, rows: Iterable[OwnerUsage]) -> str:
    """The rows as CSV (RFC 4180, Python's csv module) with a header line: ``kind`` (the owner's column), jobs,
    GPUs, GPU-hours held, used, lost and lost by cause, the money of each and the currency; empty where nothing was
    priced. A cell that a spreadsheet would read as a formula (starting ``=``, ``+``, ``-``, ``@``, a tab or a
    carriage return: OWASP's CSV injection) is written with a leading ``'``."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    causes = list(LOST_CAUSES)
    w.writerow([kind, *CSV_HEAD[1:], *(f"lost_{c}_gpu_hours" for c in causes), "held_cost", "used_cost",
                "lost_cost", *(f"lost_{c}_cost" for c in causes), "currency"])  # fmt: skip
    for r in rows:
        money = [r.held_cost, r.busy_cost, r.lost_cost_total, *((r.lost_cost or {}).get(c) for c in causes)]
        w.writerow([_cell(r.owner or ""), r.jobs, r.gpus, _num(r.held_hours), _num(r.busy_hours), _num(r.lost_total),
                    *(_num(r.lost_hours.get(c, 0.0)) for c in causes),
                    *("" if m is None else _num(m) for m in money), _cell(r.currency)])  # fmt: skip
    return buf.getvalue()


def _num(x: float) -> str:
    """A figure with 6 decimals (a GPU-second is 0.000278 GPU-hours)."""
    return f"{x:.6f}"


def _cell(text: str) -> str:
    """``text`` safe to open in a spreadsheet: a leading ``'`` before what would start a formula."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def owners_view(args: argparse.Namespace) -> int:
    """``gpuwarden top --by KIND``: the owners' rows as a table, ``--json`` or ``--format csv``; 1 with one line when
    Prometheus cannot answer, or with no data."""
    from gpuwarden.cluster.views import _ask, _console, _fitted, _hours, _json, _print, _top, records_notes
    from gpuwarden.terminal import plain, redacted

    kind = args.by

    def work(acc: Accounting) -> tuple[TopData, dict[JobKey, str]]:
        data = _top(acc, getattr(args, "source", "raw"))
        return data, ({} if kind == "job" else acc.owners(kind))

    got = _ask(args, "top", work)
    if got is None:
        return 1
    data, owners = got
    for note in records_notes(data.acc, data.coverage):
        print(f"gpuwarden top: {note}", file=sys.stderr)
    rows = by_owner(data.jobs, owners, kind)
    if args.format == "csv":
        sys.stdout.write(as_csv(kind, rows))
        return 0
    if args.json:
        print(_json({"prometheus": redacted(args.prometheus), "range": args.range, "step": args.step,
                     "evaluated_at": data.acc.at, "source": data.source, "by": kind,
                     "owners": [as_json(r) for r in rows]}))  # fmt: skip
        return 0
    console = _console()
    if not rows:
        _print(console, plain(f"No gpuwarden data in {redacted(args.prometheus)} over the last {args.range}."))
        return 1

    def money(x: float | None, r: OwnerUsage) -> str:
        return "" if x is None else f"{x:,.2f} {r.currency}"

    required: list[Column] = [
        (kind, False, lambda r: r.owner if r.owner is not None else "(none)"),
        ("jobs", True, lambda r: str(r.jobs)),
        ("held h", True, lambda r: _hours(r.held_hours)),
        ("used h", True, lambda r: _hours(r.busy_hours)),
        ("lost h", True, lambda r: _hours(r.lost_total)),
        ("lost cost", True, lambda r: money(r.lost_cost_total, r)),
    ]
    optional: list[Column] = [
        ("held cost", True, lambda r: money(r.held_cost, r)),
        ("GPUs", True, lambda r: str(r.gpus)),
        ("lost to", False, lambda r: ", ".join(f"{c} {_hours(h)} h" for h, c in sorted(
            ((h, c) for c, h in r.lost_hours.items() if h > 0), reverse=True)[:3]) or "-"),
    ]  # fmt: skip
    title = f"GPU-hours by {kind}, last {args.range}"
    _print(console, _fitted(title, required, optional, rows[: args.limit], console.width))
    return 0
