"""gpuwarden side by side with nvitop-exporter and an nvidia-smi shell-out exporter, one run, same GPU(s).

``python3 -m bench.compare [--duration 60] [--interval 1] [--scrape-interval 1] [--json OUT]``

On a GPU machine it starts, one after the other on free loopback ports (``--together``: all at once, measured at
the same time, so that a load on the machine falls on every exporter alike), and measures the same way
(bench/common.py: a bounded scrape loop, psutil CPU and RSS of the process, exposition size and families):

- gpuwarden: ``python3 -m gpuwarden serve --poll.interval I`` (live NVML);
- nvitop-exporter: ``nvitop-exporter --interval I --bind-address 127.0.0.1 --port P`` (its CLI, read from its 1.7.2
  source: ``--bind-address``/``--port``/``--interval``, interval at least 0.25 s; it updates global gauges in a
  loop and serves them with prometheus_client's WSGI server);
- smi: ``python3 -m bench.smi_exporter`` (bench/smi_exporter.py), which runs ``nvidia-smi --query-gpu`` on every
  scrape; its CPU includes the nvidia-smi processes it waited for.

Each runs ``--duration`` seconds after a warm-up (3 x 60 s + start-up: about 4 minutes). Prints a table and the
ratios gpuwarden / nvitop-exporter and smi / gpuwarden; ``--json`` writes everything with GPU model, driver
and versions. An exporter that is not installed is reported as skipped. ``--replay TRACE`` runs gpuwarden on a
trace instead (to try the harness on a machine without a GPU).
"""

from __future__ import annotations

import argparse
import json
import shutil
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
    measure_together,
    start_exporter,
    stop_exporter,
    versions,
)

PACKAGES = (
    "gpuwarden",
    "nvitop",
    "nvitop-exporter",
    "prometheus-client",
    "nvidia-ml-py",
    "fastapi",
    "h11",
    "pydantic",
    "psutil",
)


def commands(port: int, interval: float, replay: Path | None) -> dict[str, list[str] | None]:
    """Return each exporter's command line on ``port`` (None when it is not installed here)."""
    gw = [sys.executable, "-m", "gpuwarden", "serve", "--poll.interval", f"{interval:g}"]
    gw += ["--web.listen-address", f"127.0.0.1:{port}", "--log.level", "warning"]
    if replay is not None:
        gw += ["--replay", str(replay)]
    nvx = shutil.which("nvitop-exporter")
    nvitop = None
    if nvx is not None:
        nvitop = [nvx, "--interval", f"{interval:g}", "--bind-address", "127.0.0.1", "--port", str(port)]
    smi = None
    if shutil.which("nvidia-smi") is not None:
        smi = [sys.executable, "-m", "bench.smi_exporter", "--port", str(port)]
    return {"gpuwarden": gw, "nvitop-exporter": nvitop, "nvidia-smi shell-out": smi}


def _start(name: str, args: argparse.Namespace, tmp: Path, console: Console) -> tuple[Any, int, list[str]] | str:
    """Start exporter ``name``: (process, port, command), or why it could not start."""
    port = free_port()
    cmd = commands(port, args.interval, args.replay)[name]
    if cmd is None:
        console.print(f"[yellow]{name}: not installed, skipped[/]")
        return "not installed"
    console.print(f"[bold]{name}[/]: {' '.join(cmd)} - {args.duration:g} s ...")
    try:
        proc = start_exporter(cmd, port, tmp / f"{name.split()[0]}.log")
    except RuntimeError as exc:
        console.print(f"[red]{name} failed to start[/]: {exc}")
        return str(exc)
    return proc, port, cmd


def _one(name: str, args: argparse.Namespace, tmp: Path, console: Console) -> dict[str, Any] | str:
    """Start, measure and stop exporter ``name`` alone; its measurement, or why it was skipped."""
    started = _start(name, args, tmp, console)
    if isinstance(started, str):
        return started
    proc, port, cmd = started
    try:
        m: Measurement = measure(name, proc.pid, port, args.duration, args.scrape_interval, args.warmup)
    finally:
        stop_exporter(proc)
    m.extra["command"] = " ".join(cmd)
    return m.as_dict()


def _together(
    names: list[str], args: argparse.Namespace, tmp: Path, console: Console
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Start every exporter, measure them all over the same seconds (one scraping thread each), stop them."""
    started: dict[str, tuple[Any, int, list[str]]] = {}
    skipped: dict[str, str] = {}
    for name in names:
        got = _start(name, args, tmp, console)
        if isinstance(got, str):
            skipped[name] = got
        else:
            started[name] = got
    measured = measure_together({n: proc for n, (proc, _, _) in started.items()},
                                {n: port for n, (_, port, _) in started.items()},
                                args.duration, args.scrape_interval, args.warmup)  # fmt: skip
    results: dict[str, dict[str, Any]] = {}
    for name, m in measured.items():
        m.extra["command"] = " ".join(started[name][2])
        m.extra["together"] = sorted(started)
        results[name] = m.as_dict()
    return results, skipped


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None when either is missing or b is 0."""
    return a / b if a is not None and b else None


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; return 0 (1 when gpuwarden could not be measured)."""
    ap = argparse.ArgumentParser(prog="python3 -m bench.compare", description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=60.0, help="measured seconds per exporter")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--interval", type=float, default=1.0, help="poll/update interval of both daemons (>= 0.25)")
    ap.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes, every exporter")
    ap.add_argument("--only", help="comma-separated subset: gpuwarden,nvitop-exporter,nvidia-smi shell-out")
    ap.add_argument("--replay", type=Path, help="run gpuwarden on this trace (harness check without a GPU)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--together", action="store_true", help="run every exporter at once, measured side by side")
    args = ap.parse_args(argv)
    console = Console(width=180)
    results: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    only = set(args.only.split(",")) if args.only else None
    names = [n for n in ("gpuwarden", "nvitop-exporter", "nvidia-smi shell-out") if only is None or n in only]
    with tempfile.TemporaryDirectory(prefix="gpuwarden-compare-") as tmp:
        if args.together:
            results, skipped = _together(names, args, Path(tmp), console)
        else:
            for name in names:
                got = _one(name, args, Path(tmp), console)
                if isinstance(got, str):
                    skipped[name] = got
                else:
                    results[name] = got
    gw, nv, smi = (results.get(k) for k in ("gpuwarden", "nvitop-exporter", "nvidia-smi shell-out"))

    def get(r: dict[str, Any] | None, key: str) -> float | None:
        return None if r is None else r[key]

    ratios = {
        "cpu_gpuwarden_over_nvitop": ratio(get(gw, "cpu_percent_of_core"), get(nv, "cpu_percent_of_core")),
        "rss_gpuwarden_over_nvitop": ratio(get(gw, "rss_peak_mib"), get(nv, "rss_peak_mib")),
        "scrape_p50_gpuwarden_over_nvitop": ratio(get(gw, "latency_p50_ms"), get(nv, "latency_p50_ms")),
        "scrape_p99_gpuwarden_over_nvitop": ratio(get(gw, "latency_p99_ms"), get(nv, "latency_p99_ms")),
        "scrape_p50_smi_over_gpuwarden": ratio(get(smi, "latency_p50_ms"), get(gw, "latency_p50_ms")),
        "cpu_smi_over_gpuwarden": ratio(get(smi, "cpu_percent_of_core"), get(gw, "cpu_percent_of_core")),
    }
    t = Table(
        title=f"Same machine, one run: update interval {args.interval:g} s, one scrape every "
        f"{args.scrape_interval:g} s for {args.duration:g} s each"
    )
    for col in (
        "exporter",
        "scrapes",
        "p50 ms",
        "p99 ms",
        "CPU % core",
        "RSS peak MiB",
        "bytes",
        "families",
        "series",
        "series/GPU",
    ):
        t.add_column(col, justify="left" if col == "exporter" else "right")

    def f(v: float | None, d: int = 2) -> str:
        return "-" if v is None else f"{v:.{d}f}"

    for name, r in results.items():
        e = r["exposition"]
        t.add_row(name, str(r["scrapes"]), f(r["latency_p50_ms"]), f(r["latency_p99_ms"]),
                  f(r["cpu_percent_of_core"]), f(r["rss_peak_mib"], 1), str(e["bytes"]), str(e["families"]),
                  str(e["series"]), f(e["series_per_gpu_mean"], 1))  # fmt: skip
    console.print(t)
    for k, v in ratios.items():
        console.print(f"{k}: {f(v, 3)}")
    doc = {
        "benchmark": "gpuwarden bench.compare (issue 6)",
        "created": time.time(),
        "machine": machine(),
        "gpu": gpu_facts(),
        "versions": versions(*PACKAGES),
        "settings": {
            "duration_seconds": args.duration,
            "warmup_seconds": args.warmup,
            "interval_seconds": args.interval,
            "scrape_interval_seconds": args.scrape_interval,
            "replay": str(args.replay) if args.replay else None,
            "together": args.together,
        },
        "results": results,
        "skipped": skipped,
        "ratios": ratios,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        console.print(f"wrote {args.json}")
    return 0 if gw is not None else 1


if __name__ == "__main__":
    raise SystemExit(main())
