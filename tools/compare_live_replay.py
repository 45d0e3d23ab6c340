#!/usr/bin/env python3
"""Compare the verdicts a live daemon gave (its /api/v1/diagnosis, saved every few seconds) with those the analyzer
gives on a replay of a recording of the same session (tools/device-startup-live.sh makes both).

    python3 tools/compare_live_replay.py SESSION.jsonl.gz LIVE.jsonl [JOBS.txt]

The daemon and the recorder poll NVML on their own, so each live answer is matched with the replayed poll nearest
in time (within 1.5 s). Prints one JSON line: answers compared, the share with the same verdict, the share whose
verdicts are the same or each among the other's alternatives, and the disagreements; with JOBS.txt (lines
``UNIX start|end ITEM``), the verdict each job ended with, live and replayed.
"""

from __future__ import annotations

import bisect
import json
import sys
from pathlib import Path

from gpuwarden.insight.analyzer import InsightAnalyzer
from gpuwarden.trace import read_trace


def replayed(path: Path) -> list[tuple[float, dict[int, tuple[str, list[str]] | None]]]:
    """Each poll's time and every GPU's verdict and alternatives (None: no verdict) on a replay of ``path``."""
    header, polls = read_trace(path)
    analyzer = InsightAnalyzer()
    out = []
    for poll in polls:
        res = analyzer(poll, header.node)
        out.append(
            (
                poll.timestamp,
                {
                    g.gpu: None if g.diagnosis is None else (g.diagnosis.verdict, list(g.diagnosis.alternatives))
                    for g in res.gpus
                },
            )
        )
    return out


def live(path: Path) -> list[tuple[float, dict[int, tuple[str, list[str]] | None]]]:
    """Each saved /api/v1/diagnosis answer's time and every GPU's verdict and alternatives."""
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        doc = json.loads(line)
        if not doc.get("available"):
            continue
        verdicts = {}
        for g in doc["gpus"]:
            d = g.get("diagnosis")
            verdicts[g["gpu"]] = None if d is None else (d["verdict"], list(d.get("alternatives", [])))
        out.append((doc["timestamp"], verdicts))
    return out


def main() -> None:
    """Compare the session and the answers named on the command line; print the JSON line."""
    session, answers = Path(sys.argv[1]), Path(sys.argv[2])
    rep = replayed(session)
    times = [t for t, _ in rep]
    same = near = compared = 0
    differ = []
    for t, verdicts in live(answers):
        i = bisect.bisect_left(times, t)
        best = min((j for j in (i - 1, i) if 0 <= j < len(times)), key=lambda j: abs(times[j] - t), default=None)
        if best is None or abs(times[best] - t) > 1.5:
            continue
        for gpu, v in verdicts.items():
            r = rep[best][1].get(gpu)
            if v is None or r is None:
                continue
            compared += 1
            if v[0] == r[0]:
                same += 1
                near += 1
            elif v[0] in r[1] or r[0] in v[1]:
                near += 1
                differ.append({"t": round(t, 1), "gpu": gpu, "live": v, "replay": r, "within_margin": True})
            else:
                differ.append({"t": round(t, 1), "gpu": gpu, "live": v, "replay": r, "within_margin": False})
    row: dict[str, object] = {
        "compared": compared,
        "same_verdict": round(same / compared, 3) if compared else None,
        "same_or_within_margin": round(near / compared, 3) if compared else None,
        "differ": differ,
    }
    if len(sys.argv) > 3:
        ends = []
        spans = [line.split(" ", 2) for line in Path(sys.argv[3]).read_text().splitlines()]
        starts = {item: float(t) for t, kind, item in spans if kind == "start"}
        for t, kind, item in spans:
            if kind != "end":
                continue
            name = item.split(":", 1)[0] if item.count(":") > 1 else item.split(":")[0]
            key = next(k for k in starts if item.startswith(k))
            end = float(t) - 1.0
            lv = [v for ts, v in live(answers) if starts[key] <= ts <= end]
            rv = [v for ts, v in rep if starts[key] <= ts <= end]
            ends.append(
                {
                    "job": key,
                    "live": lv[-1].get(0) if lv else None,
                    "replay": rv[-1].get(0) if rv else None,
                    "name": name,
                }
            )
        row["jobs"] = ends
    print(json.dumps(row))


if __name__ == "__main__":
    main()
