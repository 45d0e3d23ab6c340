"""A minimal exporter that shells out to ``nvidia-smi --query-gpu`` on every scrape: the baseline of issue 6.

``python3 -m bench.smi_exporter --port P [--bind 127.0.0.1]`` serves ``/metrics`` (stdlib http.server, HTTP/1.1
keep-alive): each GET runs ``nvidia-smi --query-gpu=<fields> --format=csv,noheader,nounits`` and writes one gauge
per field and GPU, labelled ``gpu`` (index) and ``uuid``, as an exporter built that way
(utkuozdemir/nvidia_gpu_exporter's default backend) pays for each scrape. For the benchmark only.
"""

from __future__ import annotations

import argparse
import subprocess
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: nvidia-smi query field -> (metric name, help, scale to base units)
FIELDS: dict[str, tuple[str, str, float]] = {
    "utilization.gpu": ("smi_gpu_utilization_ratio", "GPU utilization.", 0.01),
    "utilization.memory": ("smi_gpu_memory_utilization_ratio", "Memory controller utilization.", 0.01),
    "memory.used": ("smi_gpu_memory_used_bytes", "Memory used.", 1048576.0),
    "memory.total": ("smi_gpu_memory_total_bytes", "Memory total.", 1048576.0),
    "temperature.gpu": ("smi_gpu_temperature_celsius", "GPU temperature.", 1.0),
    "power.draw": ("smi_gpu_power_usage_watts", "Power draw.", 1.0),
    "clocks.sm": ("smi_gpu_sm_clock_hertz", "SM clock.", 1e6),
    "clocks.mem": ("smi_gpu_memory_clock_hertz", "Memory clock.", 1e6),
}
QUERY = ["index", "uuid", *FIELDS]


def scrape() -> bytes:
    """Run nvidia-smi once and return the exposition of its answer."""
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    ).stdout
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
    lines: list[str] = []
    for i, (name, doc, scale) in enumerate(FIELDS.values()):
        lines.append(f"# HELP {name} {doc}\n# TYPE {name} gauge\n")
        for row in rows:
            try:
                value = float(row[2 + i]) * scale
            except (ValueError, IndexError):
                continue  # [N/A], [Not Supported]
            lines.append(f'{name}{{gpu="{row[0]}",uuid="{row[1]}"}} {value}\n')
    return "".join(lines).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path != "/metrics":
            self.send_error(404)
            return
        try:
            body, status = scrape(), 200
        except (subprocess.SubprocessError, OSError) as exc:
            body, status = f"nvidia-smi failed: {exc}\n".encode(), 500
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        return


def main(argv: list[str] | None = None) -> int:
    """Serve until killed."""
    ap = argparse.ArgumentParser(prog="python3 -m bench.smi_exporter", description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--bind", default="127.0.0.1")
    args = ap.parse_args(argv)
    ThreadingHTTPServer((args.bind, args.port), _Handler).serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
