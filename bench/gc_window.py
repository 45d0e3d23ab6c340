#!/usr/bin/env python3
"""The garbage collector and memory over a long replay: GC pauses per generation, objects tracked, RSS.

``python3 -m bench.gc_window [--gpus 64] [--polls 900] [--every 60] [--tracemalloc] [--json OUT]``

Replays ``--gpus`` GPUs (bench/traces.py) in recorded time, as the daemon runs them: the insight analyzer over its
300 s window, every collector rendered after every poll (a scrape a second), the start-up objects frozen
(``gc.collect(); gc.freeze()``, as ``Daemon.start`` does). ``--polls`` polls stand for as many seconds. Every
``--every`` polls it prints RSS, the objects the collector tracks, the collections of each generation so far and
the longest pause of each (``gc.callbacks``: wall time from "start" to "stop" of a collection), and with
``--tracemalloc`` the memory Python allocated (slower: tracing costs CPU, the pauses are then not comparable).
A full window is 300 polls; RSS and objects after it show whether memory stays flat once the window is full.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import psutil

from bench.traces import trace_for
from gpuwarden.catalog import select_collectors
from gpuwarden.collectors import CollectOptions
from gpuwarden.exposition import Exposition
from gpuwarden.insight.analyzer import InsightAnalyzer
from gpuwarden.poller import Poller
from gpuwarden.replay.source import ReplaySource


class Pauses:
    """GC pauses by generation, from ``gc.callbacks``: counts and durations in seconds."""

    def __init__(self) -> None:
        self.start = 0.0
        self.by_gen: dict[int, list[float]] = {0: [], 1: [], 2: []}

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        """gc callback: time each collection from start to stop."""
        if phase == "start":
            self.start = time.perf_counter()
        else:
            self.by_gen[info["generation"]].append(time.perf_counter() - self.start)

    def summary(self) -> dict[str, Any]:
        """Per generation: collections, longest and total pause (ms)."""
        out = {}
        for g, p in self.by_gen.items():
            ranked = sorted(p)
            p99 = ranked[min(len(ranked) - 1, int(len(ranked) * 0.99))] if ranked else 0.0
            out[f"gen{g}"] = {"count": len(p), "max_ms": round(max(p, default=0) * 1e3, 2),
                              "p99_ms": round(p99 * 1e3, 2), "sum_ms": round(sum(p) * 1e3, 1)}  # fmt: skip
        return out


def main() -> int:
    """Run the replay and print one row per ``--every`` polls; return 0."""
    ap = argparse.ArgumentParser(prog="python3 -m bench.gc_window", description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--polls", type=int, default=900)
    ap.add_argument("--every", type=int, default=60)
    ap.add_argument("--tracemalloc", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="gpuwarden-gc-") as tmp:
        trace = trace_for(args.gpus, Path(tmp))
        poller = Poller(ReplaySource(trace, timing="recorded"), 1.0,
                        analyzers={"insight": InsightAnalyzer(window_seconds=300).prepare})  # fmt: skip
        poller.start(thread=False)
        exposition = Exposition(poller, select_collectors(), CollectOptions())
        exposition.render()
        gc.collect()
        gc.freeze()
        pauses = Pauses()
        gc.callbacks.append(pauses)
        if args.tracemalloc:
            tracemalloc.start()
        proc = psutil.Process()
        cpu0 = time.process_time()
        print(f"{args.gpus} GPUs, {args.polls} polls (1 s apart in recorded time), rendered after each")
        heads = ["poll", "RSS MiB", "tracked", "gen0", "gen1", "gen2", "gen1 max ms", "gen2 p99 ms", "gen2 max ms",
                 "traced MiB", "CPU ms/poll"]  # fmt: skip
        print(" ".join(f"{h:>11}" for h in heads))
        for i in range(1, args.polls + 1):
            poller.poll_once()
            exposition.render()
            if i % args.every == 0:
                s = pauses.summary()
                row = {
                    "poll": i,
                    "rss_mib": round(proc.memory_info().rss / 2**20, 1),
                    "tracked": len(gc.get_objects()),
                    **s,
                    "traced_mib": round(tracemalloc.get_traced_memory()[0] / 2**20, 1) if args.tracemalloc else None,
                    "cpu_ms_per_poll": round((time.process_time() - cpu0) * 1e3 / args.every, 2),
                }
                cpu0 = time.process_time()
                rows.append(row)
                cells = [i, row["rss_mib"], row["tracked"], s["gen0"]["count"], s["gen1"]["count"],
                         s["gen2"]["count"], s["gen1"]["max_ms"], s["gen2"]["p99_ms"], s["gen2"]["max_ms"],
                         "-" if row["traced_mib"] is None else row["traced_mib"], row["cpu_ms_per_poll"]]  # fmt: skip
                print(" ".join(f"{c:>11}" for c in cells))
    if args.json:
        args.json.write_text(json.dumps({"gpus": args.gpus, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
