#!/usr/bin/env python3
"""How soon a running daemon shows a GPU process that starts, and drops one that ends, against NVML itself.

``python3 tools/process_list_check.py URL [--scenario bf16_matmul] [--seconds 15] [--gpu 0] [--poll 1.0]`` starts
``tools/workloads.py run SCENARIO`` on the GPU, then every 0.1 s asks NVML for the GPU's compute processes
(nvmlDeviceGetComputeRunningProcesses) and scrapes the daemon at URL (parsed by prometheus_client's parser) for
the workload's ``gpu_process_memory_used_bytes``; prints when each first listed the process, each memory value the
daemon exported, and when each stopped listing it after it ended. The daemon lists the GPU's processes at every
poll: a start or an end shows at its next poll.
Exits 1 when the daemon shows the start or the end more than two polls (``--poll``, the daemon's interval) and a
second after NVML does, or never. Needs a GPU, PyTorch and a daemon polling it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pynvml
from prometheus_client.parser import text_string_to_metric_families


def daemon_memory(url: str, pid: int) -> float | None:
    """The workload's ``gpu_process_memory_used_bytes`` in the daemon's exposition at ``url``, None when absent."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    for fam in text_string_to_metric_families(text):
        if fam.name == "gpu_process_memory_used_bytes":
            for s in fam.samples:
                if s.labels.get("pid") == str(pid):
                    return float(s.value)
    return None


def nvml_lists(handle: object, pid: int) -> bool:
    """Whether NVML lists ``pid`` among the GPU's compute processes now."""
    return any(int(p.pid) == pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle))


def main() -> int:
    """Run the check; print the timings (and one JSON line); 0 when the daemon kept up, 1 otherwise."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--scenario", default="bf16_matmul")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--poll", type=float, default=1.0, help="the daemon's poll interval, seconds")
    args = ap.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)
    workloads = Path(__file__).with_name("workloads.py")
    cmd = [sys.executable, str(workloads), "run", args.scenario, "--seconds", str(args.seconds), "--gpu", str(args.gpu)]
    t0 = time.monotonic()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    seen: dict[str, float | None] = {"nvml_start": None, "daemon_start": None, "nvml_end": None, "daemon_end": None}
    values: list[tuple[float, float]] = []
    deadline = t0 + args.seconds + 120
    while time.monotonic() < deadline:
        now = time.monotonic() - t0
        listed = nvml_lists(handle, child.pid)
        memory = daemon_memory(args.url, child.pid)
        if listed and seen["nvml_start"] is None:
            seen["nvml_start"] = now
        if memory is not None:
            if seen["daemon_start"] is None:
                seen["daemon_start"] = now
            if not values or values[-1][1] != memory:
                values.append((round(now, 2), memory))
        if seen["nvml_start"] is not None and not listed and seen["nvml_end"] is None:
            seen["nvml_end"] = now
        if seen["daemon_start"] is not None and memory is None and seen["daemon_end"] is None:
            seen["daemon_end"] = now
        if seen["nvml_end"] is not None and seen["daemon_end"] is not None:
            break
        time.sleep(0.1)
    child.wait()
    pynvml.nvmlShutdown()
    slack = 2 * args.poll + 1.0
    late = {}
    for what in ("start", "end"):
        nv, dm = seen[f"nvml_{what}"], seen[f"daemon_{what}"]
        late[what] = None if nv is None or dm is None else round(dm - nv, 2)
        at = {k: None if v is None else round(v, 2) for k, v in (("nvml", nv), ("daemon", dm))}
        print(f"{what}: NVML at {at['nvml']} s, the daemon at {at['daemon']} s after the workload started "
              f"(the daemon {late[what]} s later)")  # fmt: skip
    print(f"memory values the daemon exported for pid {child.pid} (s, bytes): {values}")
    ok = all(v is not None and v <= slack for v in late.values())
    print(json.dumps({"scenario": args.scenario, "pid": child.pid, **seen, "late": late, "values": values, "ok": ok}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
