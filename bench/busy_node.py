"""A busy node: gpuwarden's poll, render, scrape and memory with real process trees and a crowded host.

``python3 -m bench.busy_node [--grid G:W:X ...] [--seconds 12] [--poll.interval 1] [--json OUT]``

Each configuration ``G:W:X`` is G GPUs, each held by one rank process with W worker processes under it (a shell and
W sleeping children: a real process tree in /proc), on a host with X extra processes (sleeping, in no GPU's tree).
The GPUs are the test suite's fake NVML (tests/fake_nvml.py) answering from the real 8-GPU derived trace, replicated
to G and with each GPU's processes replaced by its rank; everything above pynvml is the daemon as ``serve`` builds
it, in a child process of its own (so its RSS is its own), polling every ``--poll.interval`` s and scraped every
second over one keep-alive connection. Each configuration runs twice, GPU processes read and not
(``processes.enabled``), and the table prints, per run:

- poll CPU: CPU of the poll thread per poll (ms), everything a poll does (NVML, /proc, insight, render ahead);
- of it, the NVML source's and the render's CPU per call (ms);
- the scrape's p50 and p99 (ms) and the daemon's RSS (MiB) at the end.

The figures of docs/performance.md come from this script; it measures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "data" / "traces" / "derived-8gpu.jsonl.gz"
DEFAULT_GRID = ("1:8:0", "8:8:0", "8:16:2000", "8:64:0", "64:0:0", "64:16:0")


def _spawn(extra: int, gpus: int, workers: int) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    """Start ``extra`` lone sleepers and ``gpus`` ranks with ``workers`` children each; return the processes and the
    rank PIDs once every worker exists."""
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [subprocess.Popen(["sleep", "3600"], **quiet) for _ in range(extra)]  # type: ignore[call-overload]
    script = f"for i in $(seq {workers}); do sleep 3600 & done; wait" if workers else "sleep 3600"
    # each rank leads a process group of its own: stopping it stops its workers too
    ranks = [subprocess.Popen(["sh", "-c", script], start_new_session=True, **quiet) for _ in range(gpus)]  # type: ignore[call-overload]
    procs += ranks
    import psutil

    deadline = time.monotonic() + 120
    while workers and time.monotonic() < deadline:
        if all(len(psutil.Process(r.pid).children()) >= workers for r in ranks):
            break
        time.sleep(0.1)
    return procs, [r.pid for r in ranks]


def _one(gpus: int, ranks: list[int], processes: bool, seconds: float, interval: float) -> dict[str, Any]:
    """Run the daemon over the fake NVML in this process for ``seconds``; return its figures."""
    sys.path.insert(0, str(ROOT / "tests"))
    import psutil
    import pytest
    from fake_nvml import FakeNvml, _Device

    from bench.common import Scraper, free_port, quantile, wait_until_serving
    from bench.cpu_breakdown import instrument, thread_cpu
    from gpuwarden.model import ProcessReading

    fake = FakeNvml(TRACE)
    base = fake.devices
    devices = []
    for i in range(gpus):
        src = base[i % len(base)]
        static = src.static.model_copy(update={"index": i, "uuid": f"GPU-{i:08d}-busy-node", "minor_number": i})
        rank = [ProcessReading(pid=ranks[i], gpu_memory_bytes=40 << 30)]
        records = [r.model_copy(update={"index": i, "uuid": static.uuid, "processes": rank}) for r in src.records]
        devices.append(_Device(static, records))
    fake.devices = devices
    mp = pytest.MonkeyPatch()
    fake.install(mp)
    steps = {s.label: s for s in instrument()}
    from gpuwarden.config import load_config
    from gpuwarden.daemon import Daemon, bind

    port = free_port()
    cfg = load_config(
        None,
        {
            "listen_address": f"127.0.0.1:{port}",
            "poll_interval_seconds": interval,
            "log_level": "error",
            "processes": {"enabled": processes},
        },
    )
    daemon = Daemon(cfg)
    daemon.start()
    threading.Thread(target=daemon.serve, args=(bind(cfg),), name="http-server", daemon=True).start()
    scraper = Scraper("127.0.0.1", port)
    wait_until_serving(scraper, 60)
    time.sleep(2 * interval)  # warm: the first tree walks and renders
    for s in steps.values():
        s.reset()
    assert daemon.poller.snapshot is not None
    polls0 = daemon.poller.snapshot.polls_total
    before = thread_cpu()
    latencies = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        scraper.get()
        latencies.append(1000 * (time.perf_counter() - t0))
        time.sleep(max(0.0, 1.0 - (time.perf_counter() - t0)))
    after = thread_cpu()
    polls = daemon.poller.snapshot.polls_total - polls0
    poll_cpu = after.get("gpuwarden-poller", 0.0) - before.get("gpuwarden-poller", 0.0)

    def per_call(label: str) -> float | None:
        s = steps.get(label)
        return 1000 * s.cpu / s.calls if s is not None and s.calls else None

    return {
        "gpus": gpus,
        "processes": processes,
        "polls": polls,
        "poll_cpu_ms": 1000 * poll_cpu / polls if polls else None,
        "source_ms": per_call("poll: NVML source (GPUs, host, processes)"),
        "render_ms": per_call("render: the exposition (collectors + text)"),
        "scrape_p50_ms": quantile(latencies, 0.5),
        "scrape_p99_ms": quantile(latencies, 0.99),
        "rss_mib": psutil.Process().memory_info().rss / 2**20,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the grid (each run in a child process) and print the table; write ``--json``. Returns 0."""
    ap = argparse.ArgumentParser(prog="python3 -m bench.busy_node", description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", nargs="*", default=list(DEFAULT_GRID), metavar="G:W:X")
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--poll.interval", dest="poll_interval", type=float, default=1.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: G:on|off:RANK,RANK,...
    args = ap.parse_args(argv)
    if args.one:
        g, on, pids = args.one.split(":")
        ranks = [int(p) for p in pids.split(",")]
        print(json.dumps(_one(int(g), ranks, on == "on", args.seconds, args.poll_interval)))
        return 0
    rows = []
    for item in args.grid:
        gpus, workers, extra = (int(x) for x in item.split(":"))
        procs, ranks = _spawn(extra, gpus, workers)
        try:
            host = sum(1 for d in os.listdir("/proc") if d.isdigit())
            for on in ("off", "on"):
                out = subprocess.run(
                    [sys.executable, "-m", "bench.busy_node", "--seconds", str(args.seconds), "--poll.interval",
                     str(args.poll_interval), "--one", f"{gpus}:{on}:{','.join(map(str, ranks))}"],
                    capture_output=True, text=True, cwd=ROOT, check=True,
                )  # fmt: skip
                row = json.loads(out.stdout.strip().splitlines()[-1])
                row.update(workers=workers, host_processes=host)
                rows.append(row)
                print(_line(row), flush=True)
        finally:
            for p in procs:
                try:
                    os.killpg(p.pid, signal.SIGKILL) if p.pid in ranks else p.kill()
                except ProcessLookupError:
                    pass
            for p in procs:
                p.wait()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


def _fmt(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _line(r: dict[str, Any]) -> str:
    """One table row: GPUs, workers per GPU, host processes, processes read, then the figures."""
    return (
        f"| {r['gpus']:>3} | {r['workers']:>3} | {r['host_processes']:>5} | {'on ' if r['processes'] else 'off'} | "
        f"{_fmt(r['poll_cpu_ms'])} | {_fmt(r['source_ms'])} | {_fmt(r['render_ms'])} | {_fmt(r['scrape_p50_ms'])} | "
        f"{_fmt(r['scrape_p99_ms'])} | {_fmt(r['rss_mib'], 1)} |"
    )


HEADER = (
    "| GPUs | workers/GPU | host processes | processes | poll CPU ms | source ms | render ms | scrape p50 ms | "
    "scrape p99 ms | RSS MiB |\n|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"
)

if __name__ == "__main__":
    if "--one" not in sys.argv:
        print(HEADER, flush=True)
    sys.exit(main())
