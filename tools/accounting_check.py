#!/usr/bin/env python3
"""Checks gpuwarden's GPU time by cause against the workload's own clock, over the same seconds.

    python3 tools/accounting_check.py TRACE SPLIT [TRACE SPLIT ...] [--markdown]

TRACE is a recording (``gpuwarden record``) of a workload of ``tools/workloads.py`` run with ``--split-out SPLIT``:
its own wall seconds per phase per whole Unix second. The trace is replayed through the insight analyzer (as
``gpuwarden serve`` accounts it live); between its second poll and its last, each poll interval's seconds by state
and idle cause are compared with the workload's phases over the same interval (a phase's seconds within a whole
second are taken as spread evenly over it). Phases map to what gpuwarden accounts:

    gpu        -> busy           (a kernel runs: NVML util.gpu; and the gaps between kernels that one host thread
                                  launches one at a time, gpuwarden's ``launch`` cause: the workload's clock
                                  counts the whole step, kernels and launches, as its GPU step)
    copy       -> input          (copies between host and GPU run on the copy engines: idle by util.gpu, while
                                  the job's CPU works; h2d_copy_bound or host_compute_bound name them)
    input      -> input          (input_cpu + input_io + input: waiting for the next batch)
    read       -> input          (reads from storage or a remote server)
    host       -> input          (work on the GPU's output on the CPU: idle while the job works on the CPU; the
                                  verdict host_compute_bound names it, the cause stays input_cpu)
    checkpoint -> checkpoint
    sleep      -> paused         (paused + held_idle: the job itself idle; a server's wait for requests, gpuwarden's
                                  ``serving`` cause)
    stopped    -> paused         (the job stopped with SIGSTOP: paused, then held_idle)

Prints, per trace, each class's share of the wall time by the workload's clock and by gpuwarden's, and the largest
difference in points. Runs anywhere (no GPU): it reads files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuwarden.insight.analyzer import InsightAnalyzer, insight_result  # noqa: E402
from gpuwarden.trace import read_trace  # noqa: E402

#: Workload phase -> accounting class; gpuwarden's state or cause -> accounting class.
PHASES = {
    "gpu": "busy",
    "copy": "input",
    "input": "input",
    "read": "input",
    "host": "input",
    "checkpoint": "checkpoint",
    "sleep": "paused",
    "stopped": "paused",
}
CAUSES = {
    "input_cpu": "input",
    "input_io": "input",
    "input": "input",
    "launch": "busy",
    "checkpoint": "checkpoint",
    "startup": "other",
    "serving": "paused",
    "serving_idle": "paused",
    "paused": "paused",
    "held_idle": "paused",
    "allocated_idle": "other",
    "free": "other",
    "unknown": "other",
    "lost": "other",
}
CLASSES = ("busy", "input", "checkpoint", "paused", "other")


def own_seconds(bins: dict[str, dict[str, float]], start: float, end: float) -> dict[str, float]:
    """The workload's seconds per class within (start, end], each whole second's phases spread evenly over it."""
    out = dict.fromkeys(CLASSES, 0.0)
    for second, phases in bins.items():
        a = int(second)
        overlap = max(0.0, min(end, a + 1.0) - max(start, float(a)))
        if overlap <= 0:
            continue
        for phase, secs in phases.items():
            out[PHASES.get(phase, "other")] += secs * overlap
    return out


def measured_seconds(trace: Path, lo: float, hi: float) -> tuple[dict[str, float], float, float]:
    """gpuwarden's seconds per class on GPU 0 of ``trace`` between its first poll after ``lo`` (and after its first
    poll: the first has no interval) and its last poll before ``hi``, and those two times."""
    header, polls = read_trace(trace)
    analyzer = InsightAnalyzer()
    first: dict[str, float] | None = None
    last: dict[str, float] = {}
    t0 = t1 = polls[0].timestamp
    for i, poll in enumerate(polls):
        res = insight_result(analyzer(poll, header.node))
        if i == 0 or poll.timestamp < lo or poll.timestamp > hi:
            continue
        g = res.gpus[0]
        now = {"busy": g.state_seconds_total.get("busy", 0.0), **g.idle_seconds_total}
        if first is None:
            first, t0 = now, poll.timestamp
        last, t1 = now, poll.timestamp
    if first is None or t1 <= t0:
        raise SystemExit(f"{trace}: fewer than two polls while the workload's clock ran")
    out = dict.fromkeys(CLASSES, 0.0)
    for k, v in last.items():
        out["busy" if k == "busy" else CAUSES[k]] += v - first.get(k, 0.0)
    return out, t0, t1


def check(trace: Path, split: Path) -> dict[str, object]:
    """One row: the trace, the wall seconds compared, each class's share by the workload and by gpuwarden, the largest
    difference in points."""
    own = json.loads(split.read_text())
    seconds = [int(k) for k in own["bins"]]
    measured, t0, t1 = measured_seconds(trace, min(seconds) + 1.0, max(seconds))  # whole seconds the clock ran
    mine = own_seconds(own["bins"], t0, t1)
    wall = t1 - t0
    shares = {c: (round(mine[c] / wall, 3), round(measured[c] / wall, 3)) for c in CLASSES}
    worst = max(abs(a - b) for a, b in shares.values()) * 100
    name = trace.name.removesuffix(".jsonl.gz")
    return {"trace": name, "seconds": round(wall, 1), "shares": shares, "max_diff_points": round(worst, 1)}


def main() -> None:
    """Parse the command line; print a JSON line per pair, or a markdown table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="TRACE SPLIT pairs")
    p.add_argument("--markdown", action="store_true")
    a = p.parse_args()
    if len(a.files) % 2:
        raise SystemExit("give TRACE SPLIT pairs")
    rows = [check(Path(t), Path(s)) for t, s in zip(a.files[::2], a.files[1::2], strict=True)]
    if not a.markdown:
        for r in rows:
            print(json.dumps(r))
        return
    used = [c for c in CLASSES if any(max(r["shares"][c]) > 0 for r in rows)]  # type: ignore[index]
    print("| recording | s | " + " | ".join(f"{c} own / measured" for c in used) + " | max diff (points) |")
    print("|---|---:|" + "---|" * len(used) + "---:|")
    for r in rows:
        cells = [f"{r['shares'][c][0]:.2f} / {r['shares'][c][1]:.2f}" for c in used]  # type: ignore[index]
        print(f"| `{r['trace']}` | {r['seconds']} | " + " | ".join(cells) + f" | {r['max_diff_points']} |")


if __name__ == "__main__":
    main()
