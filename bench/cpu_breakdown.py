"""Where a running daemon's CPU goes: per thread, and per step of the poll and of the scrape, measured exactly.

``python3 -m bench.cpu_breakdown [--duration 60] [--poll.interval 1] [--scrape-interval 1] [--replay TRACE]
[--set KEY=VALUE ...] [--json OUT]``

Runs the daemon in this process, as ``gpuwarden serve`` builds it (live NVML, or ``--replay``), serves it on a free
loopback port from a background thread, and scrapes ``/metrics`` every ``--scrape-interval`` seconds over one
keep-alive connection from the main thread (0: never). Over ``--duration`` seconds after a warm-up it reads:

- the CPU time of each of the daemon's threads (``pthread_getcpuclockid`` + ``clock_gettime``: nanoseconds, not
  the 10 ms ticks of /proc), as % of one core; the main thread (the scraper) is left out;
- the CPU time spent inside each step below (``time.thread_time`` around the call; inclusive of what it calls),
  as ms per second of wall time and ms per call.

py-spy samples say the same with less precision and more overhead; this is what the figures in
docs/performance.md are read from. It measures CPU, not latency (bench.run and bench.compare do that).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common import Scraper, free_port, gpu_facts, machine, versions, wait_until_serving

#: (module, class or None, attribute, label): the steps timed. Inclusive: a step's time includes its callees.
STEPS: list[tuple[str, str | None, str, str]] = [
    ("gpuwarden.poller", "Poller", "poll_once", "poll: everything (source, analyzers, render ahead)"),
    ("gpuwarden.nvml.source", "NvmlSource", "poll", "poll: NVML source (GPUs, host, processes)"),
    ("gpuwarden.nvml.device", "GpuPoller", "_read", "poll: one GPU's readings (all below)"),
    ("gpuwarden.nvml.gpm", "GpmSampler", "read", "poll: GPM sample (+ metrics when due)"),
    ("gpuwarden.nvml.device", "GpuPoller", "_read_slow", "poll: slow readings (energy, ECC, remap, fields)"),
    ("gpuwarden.nvml.device", "GpuPoller", "_processes", "poll: GPU processes (+ /proc facts)"),
    ("gpuwarden.nvml.source", None, "read_host", "poll: host CPU times (/proc/stat)"),
    ("gpuwarden.replay.source", "ReplaySource", "poll", "poll: replay source"),
    ("gpuwarden.insight.analyzer", "InsightAnalyzer", "prepare", "poll: insight accounting (every poll)"),
    ("gpuwarden.insight.analyzer", None, "build_core", "insight: result's core built (when first read)"),
    ("gpuwarden.exposition", "Exposition", "render", "render: the exposition (collectors + text)"),
    ("gpuwarden.families", "TextWriter", "render", "render: the text (kept name-and-labels, values formatted)"),
    ("gpuwarden.exposition", "Exposition", "cached", "scrape: look-up of the ready text"),
]


class Step:
    """CPU seconds (of the calling thread) and calls of one instrumented function."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.cpu = 0.0
        self.calls = 0
        self._local = threading.local()

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Return ``fn`` timed with ``time.thread_time`` (re-entrant calls are counted once)."""

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._local, "inside", False):
                return fn(*args, **kwargs)
            self._local.inside = True
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.cpu += time.thread_time() - t0
                self.calls += 1
                self._local.inside = False

        return timed

    def reset(self) -> None:
        """Start counting again."""
        self.cpu, self.calls = 0.0, 0


def instrument() -> list[Step]:
    """Wrap every STEPS function that exists here; return the steps (before any daemon object is built)."""
    steps = []
    for module, cls, attr, label in STEPS:
        try:
            mod = importlib.import_module(module)
        except ImportError:  # e.g. no pynvml: the NVML steps are skipped
            continue
        owner = getattr(mod, cls) if cls else mod  # a module-level name is patched where it is looked up
        if not hasattr(owner, attr):
            raise AttributeError(f"bench.cpu_breakdown.STEPS: {module}.{cls or ''}.{attr} is gone; update STEPS")
        step = Step(label)
        setattr(owner, attr, step.wrap(getattr(owner, attr)))
        steps.append(step)
    return steps


def thread_cpu() -> dict[str, float]:
    """CPU seconds of every live thread of this process but the main one, by thread name (suffixed when two
    threads share a name)."""
    out: dict[str, float] = {}
    for t in threading.enumerate():
        if t is threading.main_thread() or t.ident is None:
            continue
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except OSError:  # the thread ended meanwhile
            continue
        name = t.name
        while name in out:
            name += "'"
        out[name] = seconds
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the measurement; print the tables; write ``--json``. Returns the exit status."""
    ap = argparse.ArgumentParser(prog="python3 -m bench.cpu_breakdown", description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--poll.interval", dest="poll_interval", type=float, default=1.0)
    ap.add_argument("--scrape-interval", type=float, default=1.0, help="seconds between scrapes; 0: no scrapes")
    ap.add_argument("--replay", type=Path, help="a trace to replay instead of live NVML")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a configuration override")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    steps = instrument()
    from gpuwarden.config import load_config
    from gpuwarden.daemon import Daemon, bind

    port = free_port()
    overrides: dict[str, Any] = {
        "listen_address": f"127.0.0.1:{port}",
        "poll_interval_seconds": args.poll_interval,
        "log_level": "warning",
    }
    if args.replay is not None:
        overrides["replay"] = args.replay
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = value
    daemon = Daemon(load_config(None, overrides))
    daemon.start()
    server = threading.Thread(target=daemon.serve, args=(bind(daemon.cfg),), name="http-server", daemon=True)
    server.start()
    scraper = Scraper("127.0.0.1", port)
    wait_until_serving(scraper, 30)

    def run_for(seconds: float) -> int:
        scrapes = 0
        end = time.monotonic() + seconds
        next_at = time.monotonic()
        while (now := time.monotonic()) < end:
            if args.scrape_interval <= 0:
                time.sleep(min(1.0, end - now))
                continue
            if next_at > now:
                time.sleep(min(next_at, end) - now)
                continue
            next_at += args.scrape_interval
            scraper.get()
            scrapes += 1
        return scrapes

    run_for(args.warmup)
    for s in steps:
        s.reset()
    before, t0 = thread_cpu(), time.monotonic()
    scrapes = run_for(args.duration)
    after, wall = thread_cpu(), time.monotonic() - t0
    scraper.close()

    threads = {name: after[name] - before.get(name, 0.0) for name in after}
    total = sum(threads.values())
    result: dict[str, Any] = {
        "machine": machine(),
        "gpus": gpu_facts() if args.replay is None else None,
        "versions": versions("gpuwarden", "fastapi", "h11", "pydantic", "prometheus-client", "nvidia-ml-py"),
        "config": {k: str(v) for k, v in overrides.items()},
        "duration_seconds": wall,
        "scrape_interval_seconds": args.scrape_interval,
        "scrapes": scrapes,
        "polls": daemon.poller.snapshot.polls_total if daemon.poller.snapshot else None,
        "cpu_percent_of_core": 100.0 * total / wall,
        "threads_percent_of_core": {k: 100.0 * v / wall for k, v in sorted(threads.items(), key=lambda kv: -kv[1])},
        "steps": [
            {
                "step": s.label,
                "calls": s.calls,
                "ms_per_second": 1e3 * s.cpu / wall,
                "ms_per_call": 1e3 * s.cpu / s.calls if s.calls else None,
            }
            for s in steps
            if s.calls
        ],
    }
    console = Console(width=120)
    pct = result["cpu_percent_of_core"]
    t = Table(title=f"daemon threads over {wall:.0f} s ({scrapes} scrapes): {pct:.3f}% of a core")
    t.add_column("thread")
    t.add_column("% of a core", justify="right")
    for name, pct in result["threads_percent_of_core"].items():
        t.add_row(name, f"{pct:.3f}")
    console.print(t)
    t = Table(title="steps (CPU inside the call, inclusive)")
    for col in ("step", "calls", "ms CPU / s", "ms CPU / call"):
        t.add_column(col, justify="left" if col == "step" else "right")
    for row in result["steps"]:
        per_call = row["ms_per_call"]
        t.add_row(row["step"], str(row["calls"]), f"{row['ms_per_second']:.3f}", f"{per_call:.3f}")
    console.print(t)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    # the server thread is a daemon thread: stop the poller (nvmlShutdown) and leave
    daemon.poller.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
