"""The benchmark of issue 6: gpuwarden's scrape latency, CPU, memory, exposition and poll cost.

``python3 -m bench.run [--gpus-replayed 1,8,64] [--intervals 1,0.1] [--real] [--duration S] [--json OUT]``

For every number of replayed GPUs and every poll interval it starts ``python3 -m gpuwarden serve --replay TRACE
--poll.interval I`` on a free loopback port (1 GPU: the real H100 recording; 8 and 64: traces derived from the
recordings at bench time, see bench/traces.py), scrapes ``/metrics`` every ``--scrape-interval`` seconds for
``--duration`` seconds after a warm-up, and measures (bench/common.py): scrape latency p50/p99 (all scrapes, and
*fresh* ones that paid for a render), the daemon's CPU as % of one core, resident memory, exposition size,
families, series per GPU, and ``gpuwarden_poll_duration_seconds``. With ``--real`` it does the same against
live NVML (``serve`` without ``--replay``) and first times the NVML calls of one poll (bench/nvml_costs.py), so
the poll duration can be set against the sum of the calls it makes. Prints a table; ``--json`` writes it all.
Replayed poll durations are the recorded ones (live NVML at recording time), not the replay's cost.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common import (
    Measurement,
    free_port,
    gpu_facts,
    machine,
    measure,
    start_exporter,
    stop_exporter,
    versions,
)
from bench.traces import trace_for

PACKAGES = ("gpuwarden", "fastapi", "h11", "pydantic", "prometheus-client", "nvidia-ml-py", "psutil")


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def run_one(
    label: str,
    serve_args: list[str],
    interval: float,
    args: argparse.Namespace,
    workdir: Path,
) -> Measurement:
    """Start one daemon with ``serve_args`` at poll ``interval``, measure it, stop it."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "gpuwarden",
        "serve",
        *serve_args,
        "--poll.interval",
        f"{interval:g}",
        "--web.listen-address",
        f"127.0.0.1:{port}",
        "--log.level",
        "warning",
    ]
    log = workdir / f"{label.replace(' ', '_').replace('/', '_')}.log"
    proc = start_exporter(cmd, port, log)
    try:
        m = measure(label, proc.pid, port, args.duration, args.scrape_interval, args.warmup)
    finally:
        stop_exporter(proc)
    m.extra["poll_interval_seconds"] = interval
    m.extra["command"] = " ".join(cmd[1:])
    return m


def table(results: list[dict[str, Any]], title: str) -> Table:
    """Return the rich table of ``results`` (one row per configuration)."""
    t = Table(title=title)
    for col in (
        "config",
        "poll s",
        "scrapes",
        "p50 ms",
        "p99 ms",
        "fresh p50",
        "fresh p99",
        "CPU % core",
        "CPU %/GPU",
        "RSS MiB",
        "bytes",
        "families",
        "series/GPU",
        "poll ms p50",
        "NVML sum ms",
    ):
        t.add_column(col, justify="right" if col != "config" else "left")

    def f(v: float | None, d: int = 2) -> str:
        return "-" if v is None else f"{v:.{d}f}"

    for r in results:
        e = r["exposition"]
        gpus = max(1, e["gpus"])
        t.add_row(
            r["label"],
            f"{r['extra']['poll_interval_seconds']:g}",
            str(r["scrapes"]),
            f(r["latency_p50_ms"]),
            f(r["latency_p99_ms"]),
            f(r["fresh_latency_p50_ms"]),
            f(r["fresh_latency_p99_ms"]),
            f(r["cpu_percent_of_core"]),
            f(r["cpu_percent_of_core"] / gpus),
            f(r["rss_peak_mib"], 1),
            str(e["bytes"]),
            str(e["families"]),
            f(e["series_per_gpu_mean"], 1),
            f(r["poll_duration_p50_ms"], 3) + (" (rec)" if r["extra"].get("replayed") else ""),
            f(r["extra"].get("nvml_calls_sum_ms"), 3),
        )
    return t


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; return 0 (1 when a configuration failed)."""
    ap = argparse.ArgumentParser(prog="python3 -m bench.run", description=__doc__.splitlines()[0])
    ap.add_argument("--gpus-replayed", default="1,8,64", help="numbers of replayed GPUs, comma-separated ('' for none)")
    ap.add_argument("--intervals", default="1,0.1", help="poll intervals in seconds, comma-separated")
    ap.add_argument("--real", action="store_true", help="also measure the real GPUs of this machine (live NVML)")
    ap.add_argument("--duration", type=float, default=30.0, help="measured seconds per configuration")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of scraping before measuring")
    ap.add_argument("--scrape-interval", type=float, default=0.25, help="seconds between scrapes")
    ap.add_argument("--nvml-calls", type=int, default=100, help="with --real: calls per NVML function timed")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    console = Console(width=200)
    results: list[dict[str, Any]] = []
    failed = 0
    nvml: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="gpuwarden-bench-") as tmp:
        workdir = Path(tmp)
        configs: list[tuple[str, list[str], float, bool]] = []
        for n in [int(x) for x in _floats(args.gpus_replayed)]:
            trace = trace_for(n, workdir)
            for interval in _floats(args.intervals):
                configs.append((f"replay {n} GPU", ["--replay", str(trace)], interval, True))
        if args.real:
            from bench import nvml_costs

            console.print("timing the NVML calls of one poll (bench/nvml_costs.py) ...")
            nvml = nvml_costs.measure_all(args.nvml_calls)
            for interval in _floats(args.intervals):
                configs.append(("real GPUs", [], interval, False))
        for label, serve_args, interval, replayed in configs:
            console.print(f"[bold]{label}[/] at {interval:g} s: {args.duration:g} s ...")
            try:
                m = run_one(label, serve_args, interval, args, workdir)
            except RuntimeError as exc:
                console.print(f"[red]failed[/]: {exc}")
                failed += 1
                continue
            m.extra["replayed"] = replayed
            if not replayed and nvml is not None:
                m.extra["nvml_calls_sum_ms"] = nvml["poll_calls_sum_ms"]
                m.extra["gpu_poller_read_ms"] = nvml["gpu_poller_read_p50_ms"]
            results.append(m.as_dict())
    doc = {
        "benchmark": "gpuwarden bench.run (issue 6)",
        "created": time.time(),
        "machine": machine(),
        "gpu": gpu_facts() if args.real else None,
        "versions": versions(*PACKAGES),
        "settings": {
            "duration_seconds": args.duration,
            "warmup_seconds": args.warmup,
            "scrape_interval_seconds": args.scrape_interval,
        },
        "nvml_costs": nvml,
        "results": results,
    }
    console.print(table(results, "gpuwarden: scrape latency, CPU, memory, exposition"))
    console.print(
        "p50/p99: all scrapes; fresh: scrapes that paid for a render (first after a poll). "
        "poll ms (rec): recorded poll duration of the replayed trace. NVML sum: sum of the per-call medians "
        "of one poll (bench/nvml_costs.py)."
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
