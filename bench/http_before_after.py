#!/usr/bin/env python3
"""The HTTP path before and after a change, in one run: two replay daemons at once (this tree and a git revision's,
checked out in a temporary worktree), each scraped every ``--scrape-interval`` s on a keep-alive connection for
``--duration`` s, over plain HTTP or ``--tls`` (a fresh self-signed certificate); prints each one's CPU (share of a
core), peak and last RSS, scrape p50/p99 and errors. Both run side by side, so a load on the machine falls on both.

    python3 -m bench.http_before_after --against 7b27ac3 [--tls] [--duration 60] [--trace tests/data/traces/...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import fmt, free_port, measure_together

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO / "tests" / "data" / "traces" / "derived-8gpu.jsonl.gz"


def _start(tree: Path, port: int, trace: Path, web: Path | None) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "gpuwarden", "serve", "--replay", str(trace), "--web.listen-address",
            f"127.0.0.1:{port}", "--log.level", "warning"]  # fmt: skip
    if web is not None:
        args += ["--web.config.file", str(web)]
    return subprocess.Popen(args, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> int:
    """Run both daemons, measure them side by side, print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", required=True, help="the git revision to compare with (before)")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--scrape-interval", type=float, default=1.0)
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--tls", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        before = tmp / "before"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(before), args.against],
                       check=True)  # fmt: skip
        web = None
        if args.tls:
            sys.path.insert(0, str(REPO / "tools"))
            from attack import self_signed

            cert, key = self_signed(tmp)
            web = tmp / "web.yml"
            web.write_text(f"tls_server_config:\n  cert_file: {cert}\n  key_file: {key}\n")
        try:
            ports = {"before": free_port(), "after": free_port()}
            procs = {"before": _start(before, ports["before"], args.trace, web),
                     "after": _start(REPO, ports["after"], args.trace, web)}  # fmt: skip
            results = measure_together(procs, ports, args.duration, args.scrape_interval, warmup=8.0, tls=args.tls)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)], check=False)
    print(f"{'':8} {'CPU % core':>10} {'RSS peak MiB':>13} {'RSS last MiB':>13} {'p50 ms':>8} {'p99 ms':>8} errors")
    for label in ("before", "after"):
        m = results[label]
        print(f"{label:8} {fmt(m.cpu_percent_of_core):>10} {fmt(m.rss_peak_mib, 1):>13} {fmt(m.rss_last_mib, 1):>13} "
              f"{fmt(m.latency_p50_ms):>8} {fmt(m.latency_p99_ms):>8} {m.errors}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
