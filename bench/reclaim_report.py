#!/usr/bin/env python3
"""How long ``gpuwarden reclaim --report`` takes with the shipped example policy over hours of history in a real
Prometheus, and how many queries it sends, for the tree and for git revisions side by side.

    python3 bench/reclaim_report.py [--hours 26] [--range 1d] [--rev REV ...] [--demo]

Three nodes' real exposition (tests/backfill.py: the recorded H100 traces h100-held_idle, h100-starved_dataloader and
h100-compute_bound replayed through the poller, analyzer and collectors for 30 minutes of recorded time, their jobs
labelled Slurm jobs as the example policy selects), repeated end to end over ``--hours`` (counters carried on from
one copy to the next, so they grow as a daemon's do), backfilled with promtool. Then, for each tree, ``reclaim
--report --json --range RANGE`` with deploy/reclaim-policy.example.yml ending at the backfill's end, through a
counting proxy in front of Prometheus: the wall time, the requests by API path, and the decisions (which must be the
same for every tree). ``--demo``: one node replaying the ``serve --demo`` trace instead (its job labelled a Slurm job;
its scenes last 44 s, so nothing climbs: the figures are the report's cost). Needs prometheus and promtool on PATH.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from backfill import openmetrics, replayed  # noqa: E402
from helpers import backfilled_prometheus  # noqa: E402

NODES = {"node-a:10400": "h100-held_idle", "node-b:10400": "h100-starved_dataloader",
         "node-c:10400": "h100-compute_bound"}  # fmt: skip
COPY_SECONDS = 1800


def tiled(points: list[tuple[float, str]], counter: bool, copies: int) -> list[tuple[float, str]]:
    """``points`` (one copy, ``COPY_SECONDS`` long) repeated ``copies`` times end to end; a counter carries its
    value on (each copy adds what the first grew, at its rate over a whole copy)."""
    grown = 0.0
    if counter and len(points) > 1:
        (t0, first), (t1, last) = points[0], points[-1]
        grown = (float(last) - float(first)) * COPY_SECONDS / (t1 - t0)
    out = []
    for k in range(copies):
        for t, v in points:
            out.append((t + k * COPY_SECONDS, f"{float(v) + k * grown:g}" if counter else v))
    return out


def history(hours: float, end: float, demo: bool = False) -> str:
    """The three nodes' series (``demo``: the demo's node) over ``hours`` ending at ``end``, as OpenMetrics."""
    from gpuwarden.replay import demo_trace_path

    copies = max(1, round(hours * 3600 / COPY_SECONDS))
    start = end - copies * COPY_SECONDS
    parts = []
    traces = {"demo:10400": demo_trace_path()} if demo else {
        inst: REPO / "tests" / "data" / "traces" / f"{name}.jsonl.gz" for inst, name in NODES.items()}  # fmt: skip
    for inst, path in traces.items():
        one = replayed(path, {"instance": inst, "job": "gpuwarden"}, start, COPY_SECONDS - 15)
        part = {}
        for (metric, labels), points in one.items():
            if inst != "node-c:10400":
                labels = re.sub(r'job_kind="[^"]*"', 'job_kind="slurm"', labels)
            part[(metric, labels)] = tiled(points, metric.endswith("_total"), copies)
        parts.append(part)
    return openmetrics(*parts)


class Proxy(http.server.ThreadingHTTPServer):
    """Forwards every request to ``upstream`` and counts them by path."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.counts = upstream, Counter[str]()
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Proxy

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.counts[self.path.split("?")[0]] += 1
        req = urllib.request.Request(self.server.upstream + self.path, data=body, method="POST",
                                     headers={"Content-Type": self.headers.get("Content-Type", "")})  # fmt: skip
        with urllib.request.urlopen(req, timeout=600) as resp:  # noqa: S310 - the local Prometheus
            data, status = resp.read(), resp.status
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def run_tree(tree: Path, url: str, end: float, range_: str) -> dict:
    """``reclaim --report`` of ``tree`` through a fresh counting proxy: seconds, requests by path, decisions."""
    proxy = Proxy(url)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        began = time.monotonic()
        res = subprocess.run([sys.executable, "-m", "gpuwarden", "reclaim", "--policy",
                              str(REPO / "deploy" / "reclaim-policy.example.yml"), "--prometheus",
                              f"http://127.0.0.1:{proxy.server_address[1]}", "--report", "--json", "--range", range_,
                              "--at", f"{end:.3f}", "--timeout", "3600"], capture_output=True, text=True, cwd=tree,
                             env={**os.environ, "PYTHONPATH": str(tree)}, check=False)  # fmt: skip
        took = time.monotonic() - began
    finally:
        proxy.shutdown()
    if res.returncode != 0:
        return {"seconds": took, "error": res.stderr.strip()[-300:], "requests": dict(proxy.counts)}
    rows = json.loads(res.stdout)["decisions"]
    decisions = [(r["step"], r["job_id"], r["instance"], round(r["time"])) for r in rows]
    return {"seconds": took, "requests": dict(proxy.counts), "decisions": decisions}


def main() -> int:
    """Backfill the history, run each tree's report against it, print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hours", type=float, default=26.0, help="hours of history backfilled (default 26)")
    ap.add_argument("--range", default="1d", help="the report's --range (default 1d)")
    ap.add_argument("--rev", action="append", default=[], help="a git revision to run beside the tree")
    ap.add_argument("--demo", action="store_true", help="the demo's node instead of three recorded nodes")
    args = ap.parse_args()
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None or promtool is None:
        print("needs prometheus and promtool on PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        end = (time.time() - 60) // 60 * 60  # a whole minute: the old trees' ticks fall where the tree's do
        began = time.monotonic()
        text = history(args.hours, end, args.demo)
        what = "the demo" if args.demo else "3 nodes"
        print(f"history: {args.hours:g} h of {what}, {text.count(chr(10)):,} samples, "
              f"made in {time.monotonic() - began:.0f} s")  # fmt: skip
        trees = [("tree", REPO)]
        for rev in args.rev:
            wt = tmp / f"wt-{rev}"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(wt), rev], check=True,
                           capture_output=True)  # fmt: skip
            trees.append((rev, wt))
        try:
            with backfilled_prometheus(prometheus, promtool, tmp, text) as url:
                results = {name: run_tree(tree, url, end, args.range) for name, tree in trees}
        finally:
            for _, tree in trees[1:]:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
    for name, r in results.items():
        reqs = ", ".join(f"{p} {n}" for p, n in sorted(r["requests"].items()))
        print(f"{name}: reclaim --report --range {args.range}: {r['seconds']:.1f} s, requests: {reqs or 'none'}")
        if "error" in r:
            print(f"  failed: {r['error']}")
        else:
            print(f"  {len(r['decisions'])} decision(s): {r['decisions'][:6]}")
    decided = [tuple(r["decisions"]) for r in results.values() if "decisions" in r]
    if len(decided) > 1:
        print("the same decisions in every tree" if len(set(decided)) == 1 else "THE DECISIONS DIFFER")
    return 0


if __name__ == "__main__":
    sys.exit(main())
