#!/usr/bin/env python3
"""Load test: N concurrent scrapers hit ``/metrics`` for D seconds; report errors and latency percentiles.

By default it starts ``gpuwarden serve --replay tests/data/traces/derived-8gpu.jsonl.gz`` (8 replayed GPUs)
on a free loopback port, runs ``--clients`` closed-loop scrapers (each sends its next request when the
previous answer is complete, over a keep-alive connection, as Prometheus does) spread over ``--procs``
worker processes, and prints requests, errors, throughput and p50/p90/p99/max latency.
An error is a transport failure, a status other than 200, or a body without ``gpu_up`` series for every
GPU. The scrapers speak HTTP/1.1 over asyncio streams directly: a Python client library such as httpx
spends several times the CPU the daemon does per request, and on a small machine the figures would then
measure the client. With ``--url`` it targets an already running daemon instead (loopback only, see below). Traffic goes
to 127.0.0.1 only: the run is bounded in time and stops by itself.

Usage: ``python3 tools/loadtest.py [--clients 200] [--duration 60] [--procs 1] [--trace FILE] [--json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import httpx

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO / "tests/data/traces/derived-8gpu.jsonl.gz"


@dataclass
class Result:
    """Outcome of a load run: counts, throughput (requests/s) and latency percentiles (seconds)."""

    clients: int
    duration_seconds: float
    requests: int
    errors: int
    error_kinds: dict[str, int] = field(default_factory=dict)
    requests_per_second: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    max: float = 0.0
    mean_body_bytes: float = 0.0


def percentile(sorted_values: list[float], q: float) -> float:
    """Return the ``q`` quantile (0-1) of ascending ``sorted_values`` (nearest rank); 0.0 when empty."""
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


class _Connection:
    """One keep-alive HTTP/1.1 connection that GETs one path and reads each answer by Content-Length."""

    def __init__(self, host: str, port: int, path: str) -> None:
        self.host, self.port = host, port
        self.request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/plain\r\n\r\n".encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def get(self) -> tuple[int, bytes]:
        """Send the request (connecting first if needed); return (status, body). Raises OSError/ValueError."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(self.request)
        await self.writer.drain()
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
        if "content-length" not in headers:
            raise ValueError("answer without Content-Length")
        body = await self.reader.readexactly(int(headers["content-length"]))
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, body

    def close(self) -> None:
        """Drop the connection (the next get() reconnects)."""
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


async def _scrapers(url: str, clients: int, duration: float, gpus: int) -> tuple[list[float], dict[str, int], int]:
    u = urlparse(url)
    latencies: list[float] = []
    errors: dict[str, int] = {}
    body_bytes = 0
    end = time.monotonic() + duration

    async def one() -> None:
        nonlocal body_bytes
        conn = _Connection(u.hostname or "127.0.0.1", u.port or 80, u.path or "/")
        while time.monotonic() < end:
            t = time.perf_counter()
            try:
                status, body = await asyncio.wait_for(conn.get(), 30.0)
            except (TimeoutError, OSError, ValueError, asyncio.IncompleteReadError) as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                conn.close()
                await asyncio.sleep(0.01)
                continue
            latencies.append(time.perf_counter() - t)
            body_bytes += len(body)
            if status != 200:
                errors[f"status {status}"] = errors.get(f"status {status}", 0) + 1
            elif body.count(b"\ngpu_up{") != gpus:
                errors["missing gpu_up"] = errors.get("missing gpu_up", 0) + 1
        conn.close()

    await asyncio.gather(*(one() for _ in range(clients)))
    return latencies, errors, body_bytes


def _worker(url: str, clients: int, duration: float, gpus: int) -> tuple[list[float], dict[str, int], int]:
    return asyncio.run(_scrapers(url, clients, duration, gpus))


def run(url: str, clients: int, duration: float, procs: int = 1, gpus: int = 8) -> Result:
    """Run ``clients`` scrapers of ``url`` for ``duration`` s over ``procs`` processes; return the Result."""
    procs = max(1, min(procs, clients))
    shares = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    start = time.monotonic()
    with ProcessPoolExecutor(max_workers=procs) as pool:
        parts = list(pool.map(_worker, [url] * procs, shares, [duration] * procs, [gpus] * procs))
    wall = time.monotonic() - start
    latencies = sorted(x for lat, _, _ in parts for x in lat)
    kinds: dict[str, int] = {}
    for _, errs, _ in parts:
        for k, n in errs.items():
            kinds[k] = kinds.get(k, 0) + n
    body = sum(b for _, _, b in parts)
    transport = sum(n for k, n in kinds.items() if not k.startswith(("status", "missing")))
    requests = len(latencies) + transport
    return Result(
        clients=clients,
        duration_seconds=round(wall, 2),
        requests=requests,
        errors=sum(kinds.values()),
        error_kinds=kinds,
        requests_per_second=round(requests / duration, 1),
        p50=percentile(latencies, 0.50),
        p90=percentile(latencies, 0.90),
        p99=percentile(latencies, 0.99),
        max=latencies[-1] if latencies else 0.0,
        mean_body_bytes=round(body / len(latencies)) if latencies else 0.0,
    )


def free_port() -> int:
    """Return a free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daemon(trace: Path, poll_interval: float = 1.0) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``gpuwarden serve --replay trace`` on a free loopback port; return the process and base URL.

    Raises RuntimeError when it does not answer /healthz within 30 s.
    """
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuwarden",
            "serve",
            "--replay",
            str(trace),
            "--poll.interval",
            str(poll_interval),
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--log.level",
            "warning",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"gpuwarden did not come up: {proc.communicate()[1].decode(errors='replace')[-500:]}")


def stop_daemon(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM the daemon and return its exit code (killed after 10 s)."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def machine() -> str:
    """One line describing this machine: CPU model, cores, memory, OS and Python."""
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return f"{cpu}, {os.cpu_count()} cores{mem}, {platform.platform()}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    """Run the load test; print the result; return 0 when there was no error, else 1."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--procs", type=int, default=1, help="client processes (default 1)")
    ap.add_argument("--trace", type=Path, default=TRACE, help="trace the started daemon replays")
    ap.add_argument("--url", help="scrape this running daemon's /metrics instead of starting one (loopback only)")
    ap.add_argument("--gpus", type=int, default=8, help="gpu_up series expected in every answer")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    proc = None
    if args.url:
        host = urlparse(args.url).hostname or ""
        if not (host == "localhost" or host.startswith("127.") or host == "::1"):
            ap.error("--url must be a loopback address")
        url = args.url
    else:
        proc, base = start_daemon(args.trace)
        url = f"{base}/metrics"
    try:
        result = run(url, args.clients, args.duration, args.procs, args.gpus)
    finally:
        code = stop_daemon(proc) if proc is not None else 0
    if args.json:
        print(json.dumps({**asdict(result), "daemon_exit": code, "machine": machine()}, indent=1))
    else:
        ms = 1000.0
        print(f"machine: {machine()}")
        print(f"{result.clients} scrapers x {args.duration:g} s against {url}")
        print(f"requests {result.requests}, errors {result.errors} {result.error_kinds or ''}".rstrip())
        print(f"throughput {result.requests_per_second} requests/s, body {result.mean_body_bytes:.0f} bytes")
        print(
            f"latency p50 {result.p50 * ms:.1f} ms, p90 {result.p90 * ms:.1f} ms, "
            f"p99 {result.p99 * ms:.1f} ms, max {result.max * ms:.1f} ms"
        )
        print(f"daemon exit status after SIGTERM: {code}")
    return 0 if result.errors == 0 and code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
