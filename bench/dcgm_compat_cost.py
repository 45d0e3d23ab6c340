#!/usr/bin/env python3
"""What evaluating gpuwarden/mixin/dcgm-compat.rules.yml costs a real Prometheus, against another rule file (a git
revision's).

    python3 bench/dcgm_compat_cost.py [--gpus 98] [--against REV] [--seconds 60]

Takes a real H100 exposition (tests/data/golden/h100-compute_bound.prom: the series the rules read, as the daemon
exports them), repeats its GPU across ``--gpus`` GPUs on 8-GPU nodes (instance, gpu, uuid, pci_bus_id and minor
number made distinct, two of the pods on a time-sliced GPU for one in eight), backfills the last five minutes of
them with promtool, then runs Prometheus with both rule files (the other's groups renamed) evaluating every 5 s and
prints each group's mean evaluation time (``evaluationTime`` of /api/v1/rules, sampled every second) and how many
of its rules are healthy. Needs prometheus and promtool on PATH.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from fleet_scale import ready  # this directory: the script's own

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "data" / "golden" / "h100-compute_bound.prom"
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")


def _series(gpus: int) -> dict[str, list[str]]:
    """Metric name -> sample lines (no timestamp) of ``gpus`` copies of the golden GPU, node-wide series per node."""
    rules = (REPO / "gpuwarden" / "mixin" / "dcgm-compat.rules.yml").read_text()
    wanted = set(re.findall(r"\b(gpu_[a-z_]+)", rules))
    lines: dict[str, list[str]] = {}
    for line in GOLDEN.read_text().splitlines():
        m = SAMPLE.match(line)
        if not m or m.group(1) not in wanted or m.group(3) == "<masked>":
            continue
        name, labels, value = m.groups()
        per_gpu = 'uuid="' in (labels or "")
        for n in range(gpus if per_gpu else -(-gpus // 8)):
            node = n // 8 if per_gpu else n
            text = (labels or "{}")[1:-1]
            if per_gpu:
                text = re.sub(r'gpu="\d+"', f'gpu="{n % 8}"', text)
                text = re.sub(r'uuid="[^"]+"', f'uuid="GPU-{n:08d}"', text)
                text = re.sub(r'pci_bus_id="[^"]+"', f'pci_bus_id="00000000:{n % 8:02X}:00.0"', text)
                text = re.sub(r'minor_number="\d+"', f'minor_number="{n % 8}"', text)
            extra = f'instance="node-{node}:10400",job="gpuwarden"'
            lines.setdefault(name, []).append(f"{{{extra},{text}}}".replace(",}", "}") + f" {value}")
    pods = [
        f'{{instance="node-{n // 8}:10400",job="gpuwarden",gpu="{n % 8}",uuid="GPU-{n:08d}",namespace="ml",'
        f'pod="p{n}-{k}",container="main",device_id="GPU-{n:08d}::{k}",resource="nvidia.com/gpu"}} 1'
        for n in range(0, gpus, 8)
        for k in range(2)
    ]
    lines["gpu_pod_info"] = pods
    return lines


def main() -> int:
    """Backfill, evaluate both rule files, print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=98)
    ap.add_argument("--against", default="HEAD", help="the git revision whose rule file to compare (default HEAD)")
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    prom, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not prom or not promtool:
        print("dcgm_compat_cost: prometheus and promtool must be on PATH", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        now = int(time.time())
        series = _series(args.gpus)
        out = []
        for name, samples in series.items():
            for s in samples:
                out += [f"{name}{s} {t}" for t in range(now - 300, now - 5, 15)]
        (tmp / "in.om").write_text("\n".join([*out, "# EOF", ""]))
        subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(tmp / "in.om"), str(tmp / "tsdb")],
                       check=True, capture_output=True)  # fmt: skip
        old = subprocess.run(["git", "show", f"{args.against}:gpuwarden/mixin/dcgm-compat.rules.yml"], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        old_doc = yaml.safe_load(old)
        for g in old_doc["groups"]:
            g["name"] = f"{args.against}:{g['name']}"
        new_doc = yaml.safe_load((REPO / "gpuwarden" / "mixin" / "dcgm-compat.rules.yml").read_text())
        for doc in (old_doc, new_doc):
            for g in doc["groups"]:
                g["interval"] = "5s"
        (tmp / "old.yml").write_text(yaml.safe_dump(old_doc))
        (tmp / "new.yml").write_text(yaml.safe_dump(new_doc))
        files = [str(tmp / "old.yml"), str(tmp / "new.yml")]
        (tmp / "prometheus.yml").write_text(yaml.safe_dump({"rule_files": files}))
        port = 19000 + now % 1000
        proc = subprocess.Popen([prom, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            ready(url, 60)
            time.sleep(10)
            seen: dict[str, list[float]] = {}
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                for g in httpx.get(f"{url}/api/v1/rules").json()["data"]["groups"]:
                    if g.get("evaluationTime"):
                        seen.setdefault(g["name"], []).append(float(g["evaluationTime"]))
                time.sleep(1)
            counts = httpx.get(f"{url}/api/v1/rules").json()["data"]["groups"]
        finally:
            proc.terminate()
            proc.wait(10)
    recorded = {g["name"]: sum(1 for r in g["rules"] if r.get("health") == "ok") for g in counts}
    print(f"{args.gpus} GPUs, groups evaluated every 5 s for {args.seconds:.0f} s (mean of the last durations seen)")
    for group, values in sorted(seen.items()):
        print(f"  {group:45} {1000 * sum(values) / len(values):8.2f} ms   rules healthy: {recorded.get(group)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
