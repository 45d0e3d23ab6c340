"""The daemon's resident memory under allocator settings, side by side: which of glibc's knobs pay.

``python3 -m bench.rss_env [--duration 40] [--replay TRACE] [--json OUT]`` starts, at the same time and on free
loopback ports, one ``python3 -m gpuwarden serve`` per variant (live NVML, or ``--replay``), each with its own
environment: none, ``MALLOC_ARENA_MAX=2``, ``MALLOC_MMAP_THRESHOLD_=131072``, both, and a second plain one (the spread
between two identical daemons); scrapes each every second for ``--duration`` s (bench/common.py) and prints its
VmRSS, RssAnon and RssFile (``/proc/PID/status``) at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Scraper, free_port, start_exporter, stop_exporter

VARIANTS: dict[str, dict[str, str]] = {
    "plain": {},
    "arena_max_2": {"MALLOC_ARENA_MAX": "2"},
    "mmap_threshold_128k": {"MALLOC_MMAP_THRESHOLD_": "131072"},
    "both": {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072"},
    "plain_again": {},
}


def status_kib(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon and RssFile of ``pid`` in KiB (``/proc/PID/status``)."""
    out = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(rest.split()[0])
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the variants side by side; print (and with --json write) their memory; 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--replay", type=Path, help="a trace to replay instead of live NVML")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    procs = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for name, extra in VARIANTS.items():
                port = free_port()
                cmd = [sys.executable, "-m", "gpuwarden", "serve", "--web.listen-address", f"127.0.0.1:{port}"]
                cmd += ["--log.level", "warning"] + (["--replay", str(args.replay)] if args.replay else [])
                procs[name] = (start_exporter(cmd, port, Path(tmp) / f"{name}.log", env={**base, **extra}), port)
            scrapers = [Scraper("127.0.0.1", port, timeout=5.0) for _, port in procs.values()]
            end = time.monotonic() + args.duration
            while time.monotonic() < end:
                for scraper in scrapers:
                    scraper.get()
                time.sleep(1.0)
            result = {name: status_kib(p.pid) for name, (p, _) in procs.items()}
        finally:
            for p, _ in procs.values():
                stop_exporter(p)
    print(f"{'variant':22s} {'VmRSS MiB':>10s} {'RssAnon MiB':>12s} {'RssFile MiB':>12s}")
    for name, kib in result.items():
        print(f"{name:22s} {kib['VmRSS'] / 1024:10.1f} {kib['RssAnon'] / 1024:12.1f} {kib['RssFile'] / 1024:12.1f}")
    if args.json:
        args.json.write_text(json.dumps({"variants": VARIANTS, "kib": result}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
