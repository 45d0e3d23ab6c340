"""Compare what one running daemon exports in ``gpu_diagnosis`` with its ``/api/v1/diagnosis`` (the scrape reads the
insight core, the route the whole result): ``python3 tools/core_live_check.py URL`` prints each GPU's verdict and
findings from both, read right after one another, and exits 1 when they differ for a poll both read."""

from __future__ import annotations

import json
import re
import sys
import urllib.request


def main() -> int:
    """Read both views once and print them; 0 when they agree (or the daemon polled in between), 1 otherwise."""
    base = sys.argv[1].rstrip("/")
    metrics = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
    doc = json.load(urllib.request.urlopen(base + "/api/v1/diagnosis", timeout=10))
    polls = re.search(r"^gpuwarden_polls_total (\S+)$", metrics, re.M)
    exported: dict[str, set[str]] = {}
    for m in re.finditer(r'^gpu_diagnosis\{gpu="(\d+)",reason="(\w+)",uuid="[^"]*"\} 1\.0$', metrics, re.M):
        exported.setdefault(m.group(1), set()).add(m.group(2))
    served = {str(g["gpu"]): set(g["diagnosis"]["findings"]) for g in doc["gpus"] if g.get("diagnosis")}
    for gpu in sorted(set(exported) | set(served)):
        d = next((g["diagnosis"] for g in doc["gpus"] if str(g["gpu"]) == gpu and g.get("diagnosis")), None)
        rows = len(d["evidence"]) if d else 0
        print(f"GPU {gpu}: exported {sorted(exported.get(gpu, ()))}, served {sorted(served.get(gpu, ()))} "
              f"(verdict {d['verdict'] if d else None}, {rows} evidence rows)")  # fmt: skip
    print(f"polls {polls.group(1) if polls else '?'}, served at {doc.get('timestamp')}")
    return 0 if exported == served else 1


if __name__ == "__main__":
    raise SystemExit(main())
