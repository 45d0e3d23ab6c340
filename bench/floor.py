#!/usr/bin/env python3
"""The floor of a Python exporter, side by side with gpuwarden: CPU and memory of serving the same series.

``python3 -m bench.floor [--gpus 8] [--duration 60] [--scrape-interval 1] [--json OUT]``

Starts, at the same time and on free loopback ports:

- gpuwarden: ``python3 -m gpuwarden serve --replay TRACE`` (``--gpus`` replayed GPUs, bench/traces.py), polling every
  second;
- the floor: a prometheus_client exporter and nothing else (``python3 -m bench.floor --serve EXPOSITION PORT``): the
  series of one gpuwarden exposition of the same trace, parsed once into metric families with their real names,
  labels and values, each value moved a little at every collect so that no cache serves it, and served by
  prometheus_client's own HTTP server (``start_http_server``) - no NVML, no poll, no analysis, no web framework;

scrapes each every ``--scrape-interval`` s for ``--duration`` s with the same client (bench/common.py), and prints the
CPU (% of a core), peak and last RSS, scrape p50/p99 of both, and gpuwarden / floor.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.common import fmt, free_port, measure_together, start_exporter
from bench.traces import trace_for


def serve_floor(exposition: Path, port: int) -> None:
    """Serve the families of ``exposition`` (text format) with prometheus_client alone, until killed."""
    from prometheus_client import start_http_server
    from prometheus_client.core import REGISTRY, Metric
    from prometheus_client.parser import text_string_to_metric_families

    families = list(text_string_to_metric_families(exposition.read_text()))
    for default in list(REGISTRY._collector_to_names):  # noqa: SLF001 - the process and platform collectors
        REGISTRY.unregister(default)

    class Floor:
        """Yields the parsed families, every value moved by a tick per collect (a fresh exposition each scrape)."""

        tick = 0

        def collect(self) -> list[Metric]:
            self.tick += 1
            out = []
            for fam in families:
                m = Metric(fam.name, fam.documentation, fam.type, fam.unit)
                for s in fam.samples:
                    m.add_sample(s.name, s.labels, s.value + self.tick * 1e-6)
                out.append(m)
            return out

    REGISTRY.register(Floor())  # type: ignore[arg-type]
    start_http_server(port, addr="127.0.0.1")
    while True:
        time.sleep(3600)


def main() -> int:
    """Run gpuwarden and the floor side by side, print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--scrape-interval", type=float, default=1.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--serve", nargs=2, metavar=("EXPOSITION", "PORT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve_floor(Path(args.serve[0]), int(args.serve[1]))
        return 0
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        trace = trace_for(args.gpus, tmp)
        ports = {"gpuwarden": free_port(), "floor": free_port()}
        gw = start_exporter([sys.executable, "-m", "gpuwarden", "serve", "--replay", str(trace), "--log.level",
                             "warning", "--web.listen-address", f"127.0.0.1:{ports['gpuwarden']}"],
                            ports["gpuwarden"], tmp / "gw.log")  # fmt: skip
        exposition = tmp / "exposition.txt"
        import httpx

        time.sleep(3)
        exposition.write_text(httpx.get(f"http://127.0.0.1:{ports['gpuwarden']}/metrics", timeout=10).text)
        floor = start_exporter([sys.executable, "-m", "bench.floor", "--serve", str(exposition), str(ports["floor"])],
                               ports["floor"], tmp / "floor.log")  # fmt: skip
        results = measure_together({"gpuwarden": gw, "floor": floor}, ports, args.duration, args.scrape_interval,
                                   warmup=5.0)  # fmt: skip
    print(f"{args.gpus} GPUs, scrapes every {args.scrape_interval:g} s for {args.duration:g} s, side by side")
    print(f"{'':10} {'CPU % core':>10} {'RSS peak MiB':>13} {'RSS last MiB':>13} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'bytes':>8}")  # fmt: skip
    for label in ("gpuwarden", "floor"):
        m = results[label]
        print(f"{label:10} {fmt(m.cpu_percent_of_core):>10} {fmt(m.rss_peak_mib, 1):>13} {fmt(m.rss_last_mib, 1):>13} "
              f"{fmt(m.latency_p50_ms):>8} {fmt(m.latency_p99_ms):>8} {m.exposition.bytes:>8}")  # fmt: skip
    g, f = results["gpuwarden"], results["floor"]
    if f.cpu_percent_of_core:
        print(f"gpuwarden / floor: CPU {g.cpu_percent_of_core / f.cpu_percent_of_core:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({k: v.as_dict() for k, v in results.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
