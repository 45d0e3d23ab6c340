#!/usr/bin/env python3
"""What hostile answers cost ``top``, ``report`` and ``drain``: each command's peak RSS, wall time and first line of
output against a local server answering as a hostile (or broken) Prometheus or Kubernetes API server would, for the
tree and for git revisions side by side.

    python3 bench/hostile_answers.py [--rev REV ...] [--timeout 10]

Cases (each command run in a child process of its own, under GNU time: its peak RSS is the kernel's ``ru_maxrss`` of
that process alone; measured from this process, a child started by fork or vfork counts the parent's pages too):

- ``drip``: Prometheus answers a valid start, then a byte a second;
- ``gzip-bomb``: Prometheus answers 200 KB of gzip that inflates to 200 MiB;
- ``million``: Prometheus answers a vector of 10^6 series (30 MB);
- ``kube-drip``, ``kube-bomb``, ``kube-10mb``: ``drain --scheduler kubernetes`` against an API server whose node list
  drips a byte a second, is a 200 MiB gzip bomb, or is a valid list of 1,500 nodes (10 MB), Prometheus answering
  empty vectors;
- ``dra-drip``, ``dra-bomb``, ``dra-10mb``: ``drain --scheduler dra`` against an API server whose ResourceSlice list
  drips, is the gzip bomb, or is a valid list of 1,500 nodes' slices of 8 GPUs each (10 MB; no DeviceTaintRule).

Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from helpers import gzip_bomb  # noqa: E402

BOMB = gzip_bomb(200 << 20)
EMPTY = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


def _node(i: int) -> dict:
    images = [{"names": [f"registry.example/image-{j}@sha256:" + "0" * 64], "sizeBytes": 1} for j in range(40)]
    return {"metadata": {"name": f"gpu-{i}", "labels": {f"l{j}": "v" * 40 for j in range(40)}}, "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}], "images": images}}  # fmt: skip


NODES = json.dumps({"kind": "NodeList", "items": [_node(i) for i in range(1500)]}).encode()


def _slice(i: int) -> dict:
    attrs = {"uuid": {"string": "GPU-00000000-0000-0000-0000-000000000000"}, "productName": {"string": "NVIDIA H200"},
             **{f"attr{j}": {"string": "v" * 40} for j in range(8)}}  # fmt: skip
    devices = [{"name": f"gpu-{d}", "attributes": attrs, "capacity": {"memory": {"value": "141Gi"}}} for d in range(8)]
    pool = {"name": f"gpu-{i}", "generation": 1, "resourceSliceCount": 1}
    return {"metadata": {"name": f"gpu-{i}-gpu.nvidia.com"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": f"gpu-{i}", "pool": pool, "devices": devices}}  # fmt: skip


SLICES = json.dumps({"kind": "ResourceSliceList", "items": [_slice(i) for i in range(1500)]}).encode()


class _Hostile(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass

    def _send(self, body: bytes, encoding: str | None = None) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        if encoding:
            self.send_header("content-encoding", encoding)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _drip(self, start: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        try:
            self.wfile.write(start)
            for _ in range(600):
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(1)
        except OSError:
            return

    def do_POST(self) -> None:  # noqa: N802 - http.server's name: the Prometheus API
        self.rfile.read(int(self.headers.get("content-length", 0)))
        case = self.path.split("/")[1]
        if case == "drip":
            self._drip(b'{"status":"success","data":{"resultType":"vector","result":[')
        elif case == "gzip-bomb":
            self._send(BOMB, "gzip")
        elif case == "million":
            item = b'{"metric":{"instance":"x"},"value":[1,"1"]}'
            self._send(b'{"status":"success","data":{"resultType":"vector","result":[' + b",".join([item] * 10**6)
                       + b"]}}")  # fmt: skip
        else:
            self._send(EMPTY)

    def do_GET(self) -> None:  # noqa: N802 - the Kubernetes API
        case = self.path.split("/")[1]
        if case == "kube-drip":
            self._drip(b'{"kind":"NodeList","items":[')
        elif case == "dra-drip":
            self._drip(b'{"kind":"ResourceSliceList","items":[')
        elif case in ("kube-bomb", "dra-bomb"):
            self._send(BOMB, "gzip")
        elif case == "dra-10mb":
            self._send(b'{"kind":"DeviceTaintRuleList","items":[]}' if "devicetaintrules" in self.path else SLICES)
        else:
            self._send(gzip.compress(NODES, 1) if case == "kube-10mb-gzip" else NODES)


def measure(tree: Path, args: list[str], timeout: float) -> tuple[float, float, int, str]:
    """(peak RSS MiB, seconds, exit status, first line of stderr or stdout) of ``gpuwarden ARGS`` run from ``tree``
    under /usr/bin/time."""
    with tempfile.TemporaryDirectory() as tmp:
        peak = Path(tmp) / "peak"
        began = time.monotonic()
        try:
            res = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(peak), sys.executable, "-m", "gpuwarden",
                                  *args], cwd=tree, capture_output=True, text=True, timeout=timeout + 120,
                                 env={**os.environ, "PYTHONPATH": str(tree)}, check=False)  # fmt: skip
            rc, text = res.returncode, res.stderr.strip() or res.stdout.strip()
        except subprocess.TimeoutExpired:
            rc, text = -9, f"still running {timeout + 120:.0f} s later: killed"
        took = time.monotonic() - began
        kib = next((int(w) for w in reversed(peak.read_text().split()) if w.isdigit()), 0) if peak.exists() else 0
    line = text.splitlines()[0][:110] if text else ""
    return kib / 1024, took, rc, line


def main() -> int:
    """Run every case for the tree and each --rev; print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", action="append", default=[], help="a git revision to run beside the tree")
    ap.add_argument("--timeout", type=float, default=10.0, help="the commands' --timeout (default 10)")
    args = ap.parse_args()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    t = ["--timeout", f"{args.timeout:g}"]
    cases = {
        "top: drip": ["top", "--prometheus", f"{url}/drip", *t],
        "top: gzip-bomb": ["top", "--prometheus", f"{url}/gzip-bomb", *t],
        "top: million": ["top", "--prometheus", f"{url}/million", *t],
        "report: gzip-bomb": ["report", "--job", "1", "--prometheus", f"{url}/gzip-bomb", *t],
        "drain: kube-drip": [
            "drain",
            "--scheduler",
            "kubernetes",
            "--prometheus",
            f"{url}/empty",
            "--kube-api",
            f"{url}/kube-drip",
            *t,
        ],  # fmt: skip
        "drain: kube-bomb": [
            "drain",
            "--scheduler",
            "kubernetes",
            "--prometheus",
            f"{url}/empty",
            "--kube-api",
            f"{url}/kube-bomb",
            *t,
        ],  # fmt: skip
        "drain: kube-10mb": [
            "drain",
            "--scheduler",
            "kubernetes",
            "--prometheus",
            f"{url}/empty",
            "--kube-api",
            f"{url}/kube-10mb",
            *t,
        ],  # fmt: skip
    }
    for name in ("dra-drip", "dra-bomb", "dra-10mb"):
        cases[f"drain: {name}"] = ["drain", "--scheduler", "dra", "--prometheus", f"{url}/empty", "--kube-api",
                                   f"{url}/{name}", *t]  # fmt: skip
    trees = [("tree", REPO)]
    with tempfile.TemporaryDirectory() as tmp:
        for rev in args.rev:
            wt = Path(tmp) / f"wt-{rev}"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(wt), rev], check=True,
                           capture_output=True)  # fmt: skip
            trees.append((rev, wt))
        try:
            print(f"{'case':20} {'tree':>10} {'peak MiB':>9} {'seconds':>8} {'exit':>5}  first line")
            for case, argv in cases.items():
                for name, tree in trees:
                    rss, took, rc, line = measure(tree, argv, args.timeout)
                    print(f"{case:20} {name:>10} {rss:9.1f} {took:8.1f} {rc:5d}  {line}")
        finally:
            for _, tree in trees[1:]:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
    httpd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
