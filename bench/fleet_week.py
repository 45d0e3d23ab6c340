#!/usr/bin/env python3
"""What ``gpuwarden top`` costs over a day and a week of a fleet, read from the usage records (the rule group
gpuwarden.usage) and from every GPU's raw series, on a real Prometheus.

    python3 bench/fleet_week.py [--gpus 1024] [--days 1] [--job-hours 4] [--raw] [--quality [--before TREE]]

It writes ``--days`` of a synthetic fleet of ``--gpus`` GPUs on 8-GPU nodes ending now, as OpenMetrics, and backfills it
with ``promtool tsdb create-blocks-from openmetrics``: each node runs one job after another, ``--job-hours`` each (a
Slurm job on all 8 GPUs); the GPU series ``top``'s GPU table reads at 15 s scrapes (busy and starved seconds, input-idle
seconds, the diagnosis), the node's name and price; and the usage records as the rules write them, once a minute (per
job and node: held, busy, lost by cause, effective, at peak, the diagnosis's scrapes; per GPU and job its share; per GPU
its states', causes' and reasons'; per node the heartbeat) and each process's job (gpu_process_job_info, at the
scrapes), with the values a job busy 2/3 of the time and input-starved the rest would give. Then it times ``gpuwarden
top --source recorded`` over a day and, with ``--days`` 7 or more, a week (and ``--raw``: the raw accounting over a day,
which reads every GPU's series at every scrape). With ``--quality`` every GPU also has the series the health rules and
``top --quality`` read (healthy values: gpu_up 1, no errors, 50 °C against a slowdown at 87 °C, x16 of x16, the fabric
completed, 18 NVLink links up), and ``top --quality`` over a day is timed, also from the tree ``--before`` names (an
older checkout: its own quality queries on the same Prometheus). Prints figures; asserts nothing. Needs prometheus and
promtool on PATH.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleet_scale import ready, timed  # noqa: E402  (this directory: the script's own)

from gpuwarden.cluster.usage import RECORDED, RECORDED_GPU, RECORDED_HEARTBEAT, RECORDED_SHARE  # noqa: E402

SCRAPE = 15
MINUTE = 60


#: The health series of one GPU at each scrape (``--quality``): (name and labels beyond the GPU's, value).
HEALTH = (
    ("gpu_up", "", 1),
    ("gpu_recovery_action", "", 0),
    ("gpu_row_remap_failure", "", 0),
    ("gpu_row_remap_pending", "", 0),
    ("gpu_ecc_errors_total", ',type="uncorrected",counter="volatile"', 0),
    ("gpu_temperature_celsius", "", 50),
    ("gpu_memory_temperature_celsius", "", 45),
    ("gpu_temperature_threshold_celsius", ',threshold="slowdown"', 87),
    ("gpu_temperature_threshold_celsius", ',threshold="memory_max"', 95),
    ("gpu_pcie_link_width", "", 16),
    ("gpu_pcie_link_max_width", "", 16),
    ("gpu_fabric_state", ',state="completed"', 1),
    *(("gpu_fabric_health_problem", f',check="{c}"', 0) for c in ("degraded_bandwidth", "route_unhealthy")),
    *(("gpu_nvlink_link_up", f',link="{link}"', 1) for link in range(18)),
)


def _write(path: Path, gpus: int, days: float, job_hours: float, end: int, health: bool = False) -> int:
    """The fleet's series as OpenMetrics at ``path`` (with ``health``, the health series too); returns the sample
    count."""
    start = end - int(days * 86400)
    scrapes = range(start - start % SCRAPE, end + 1, SCRAPE)
    minutes = range(start - start % MINUTE + MINUTE, end + 1, MINUTE)
    job_s = int(job_hours * 3600)
    n = 0
    with path.open("w") as f:
        for node in range(-(-gpus // 8)):
            inst = f'instance="node-{node}:10400",job="gpuwarden"'
            f.writelines(f'gpu_devices{{{inst},nodename="node-{node}"}} 8 {t}\n' for t in scrapes)
            f.writelines(f'gpuwarden_gpu_hour_price{{{inst},currency="USD"}} 2 {t}\n' for t in scrapes)
            f.writelines(f"{RECORDED_HEARTBEAT}{{{inst}}} 8 {t}\n" for t in minutes)
            n += 2 * len(scrapes) + len(minutes)
            for g in range(8):
                gl = f'{inst},gpu="{g}",uuid="GPU-{node * 8 + g:08d}"'
                for state, per in (("busy", 10), ("starved", 5)):
                    f.writelines(f'gpu_state_seconds_total{{{gl},state="{state}"}} {per * k} {t}\n'
                                 for k, t in enumerate(scrapes))  # fmt: skip
                idle = f'gpu_idle_seconds_total{{{gl},cause="input"}}'
                f.writelines(f"{idle} {5 * k} {t}\n" for k, t in enumerate(scrapes))
                f.writelines(f'gpu_diagnosis{{{gl},reason="input_starved"}} 1 {t}\n' for t in scrapes)
                n += 4 * len(scrapes)
                for name, extra, value in HEALTH if health else ():
                    f.writelines(f"{name}{{{gl}{extra}}} {value} {t}\n" for t in scrapes)
                    n += len(scrapes)
                for record, value, extra in ((RECORDED_GPU["states"], 40, ',state="busy"'),
                                             (RECORDED_GPU["states"], 20, ',state="starved"'),
                                             (RECORDED_GPU["causes"], 20, ',cause="input"'),
                                             (RECORDED_GPU["reasons"], 4, ',reason="input_starved"')):  # fmt: skip
                    f.writelines(f"{record}{{{gl}{extra}}} {value} {t}\n" for t in minutes)
                    n += len(minutes)
            # one job after another on the node: its records while it runs
            for first in range(start - start % job_s, end, job_s):
                ts = [t for t in minutes if first <= t < first + job_s]
                if not ts:
                    continue
                job = f'{inst},job_id="{node}-{first}",job_kind="slurm",job_scope="cluster"'
                for record, value, extra in ((RECORDED["held"], 480, ""), (RECORDED["busy"], 320, ""),
                                             (RECORDED["lost"], 160, ',cause="input"'),
                                             (RECORDED["effective"], 480, ""), (RECORDED["peak_equivalent"], 240, ""),
                                             (RECORDED["reasons"], 40, ',reason="input_starved"')):  # fmt: skip
                    f.writelines(f"{record}{{{job}{extra}}} {value} {t}\n" for t in ts)
                    n += len(ts)
                held = [t for t in scrapes if first <= t < first + job_s]
                for g in range(8):
                    share = f'{job},gpu="{g}",uuid="GPU-{node * 8 + g:08d}"'
                    f.writelines(f"{RECORDED_SHARE}{{{share}}} 1 {t}\n" for t in ts)
                    info = f'{share},pid="{1000 + g}",user="alice"'
                    f.writelines(f"gpu_process_job_info{{{info}}} 1 {t}\n" for t in held)
                    n += len(ts) + len(held)
        f.write("# EOF\n")
    return n


def main() -> int:
    """Backfill, start Prometheus, time ``top``; print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--days", type=float, default=1.0)
    ap.add_argument("--job-hours", type=float, default=4.0)
    ap.add_argument("--raw", action="store_true", help="also time the raw accounting over a day")
    ap.add_argument("--quality", action="store_true", help="also the health series, and time top --quality over a day")
    ap.add_argument("--before", type=Path, help="with --quality: an older tree whose top --quality to time as well")
    args = ap.parse_args()
    prom, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prom or not promtool:
        print("fleet_week: prometheus and promtool must be on PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        end = int(time.time()) - 60
        t = time.monotonic()
        samples = _write(work / "in.om", args.gpus, args.days, args.job_hours, end, args.quality)
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(work / "in.om"), str(work / "tsdb")],
                       check=True, capture_output=True)  # fmt: skip
        (work / "in.om").unlink()
        print(f"{args.gpus} GPUs x {args.days:g} days, jobs of {args.job_hours:g} h: {samples:,} samples backfilled in "
              f"{time.monotonic() - t:.0f} s")  # fmt: skip
        (work / "prometheus.yml").write_text("global: {}\n")
        port = 19900 + os.getpid() % 90
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen([prom, f"--config.file={work / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                                   "--storage.tsdb.retention.time=30d", "--query.timeout=20m"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            ready(url, 300)
            gw = [sys.executable, "-m", "gpuwarden", "top", "--prometheus", url, "--timeout", "1200", "--json",
                  "--at", str(end)]  # fmt: skip
            ranges = ["1d"] + (["7d"] if args.days >= 7 else [])
            for rng in ranges:
                took = timed([*gw, "--range", rng, "--source", "recorded"], dict(os.environ), REPO)
                print(f"  top --range {rng} --source recorded   {took}")
            if args.raw:
                took = timed([*gw, "--range", "1d", "--source", "raw"], dict(os.environ), REPO)
                print(f"  top --range 1d --source raw        {took}")
            if args.quality:
                for tree in [REPO, *([args.before] if args.before else [])]:
                    took = timed([*gw, "--range", "1d", "--quality"], dict(os.environ), tree)
                    print(f"  top --range 1d --quality ({tree})  {took}")
        finally:
            server.terminate()
            server.wait(60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
